//! Shape, Size, ConstantOfShape, Range, EyeLike, ArgMax/ArgMin, CumSum/CumProd, TopK, Einsum, Swish.
