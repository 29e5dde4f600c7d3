//! Small builders over melior's `OperationBuilder`: types, constants, affine maps, named linalg
//! ops and `linalg.generic` with a scalar body. Attribute values (affine maps, dense data) are
//! parsed from their MLIR spelling; operations are built, never pasted as text.

use melior::ir::attribute::{DenseI32ArrayAttribute, StringAttribute};
use melior::ir::operation::{OperationBuilder, OperationLike};
use melior::ir::r#type::TypeLike;
use melior::ir::{
    Attribute, Block, BlockLike, Identifier, Location, Operation, Region, RegionLike, Type, Value,
    ValueLike,
};
use melior::Context;

use kiln_ir::{DType, Tensor};

use crate::{CompileError, Result};

/// The element type a tensor of `d` has in kernels: bools are stored as bytes (i8), other
/// integers are MLIR's signless integers (signedness is the op's business).
pub fn storage_type(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I8 | DType::U8 | DType::Bool => "i8",
        DType::I16 | DType::U16 => "i16",
        DType::I32 | DType::U32 => "i32",
        DType::I64 | DType::U64 => "i64",
        // One byte an element; the driver refuses them before codegen (`refuse_storage_types`).
        DType::F8E4M3FN
        | DType::F8E4M3FNUZ
        | DType::F8E5M2
        | DType::F8E5M2FNUZ
        | DType::F8E8M0
        | DType::F4E2M1
        | DType::I4
        | DType::U4
        | DType::I2
        | DType::U2 => "i8",
        // Never in a kernel: the driver leaves string nodes to the host and refuses any other
        // (`refuse_storage_types`), so this handle width is never laid out.
        DType::String => "i64",
    }
}

/// The MLIR element type of a dtype in memory (`storage_type`'s), built, not parsed.
pub fn dtype_type(ctx: &Context, d: DType) -> Type<'_> {
    match storage_type(d) {
        "f32" => Type::float32(ctx),
        "f64" => Type::float64(ctx),
        "f16" => Type::float16(ctx),
        "bf16" => Type::bfloat16(ctx),
        int => {
            let bits = int[1..].parse().expect("storage_type names iN");
            melior::ir::r#type::IntegerType::new(ctx, bits).into()
        }
    }
}

/// `tensor<dims x elem>` of a dtype, built.
pub fn tensor_type<'c>(ctx: &'c Context, dims: &[usize], d: DType) -> Type<'c> {
    let dims: Vec<u64> = dims.iter().map(|&x| x as u64).collect();
    melior::ir::r#type::RankedTensorType::new(&dims, dtype_type(ctx, d), None).into()
}

/// `memref<dims x elem>` of a dtype (identity layout, default memory space), built.
pub fn memref_type<'c>(ctx: &'c Context, dims: &[usize], d: DType) -> Type<'c> {
    let dims: Vec<i64> = dims.iter().map(|&x| x as i64).collect();
    melior::ir::r#type::MemRefType::new(dtype_type(ctx, d), &dims, None, None).into()
}

/// `tensor<2x3xf32>` / `memref<...>` spelling of a shape and dtype.
pub fn shaped(kind: &str, dims: &[usize], d: DType) -> String {
    let mut s = format!("{kind}<");
    for x in dims {
        s.push_str(&format!("{x}x"));
    }
    s.push_str(storage_type(d));
    s.push('>');
    s
}

pub(crate) fn err(msg: impl Into<String>) -> CompileError {
    CompileError::Internal(msg.into())
}

pub fn parse_attr<'c>(ctx: &'c Context, s: &str) -> Result<Attribute<'c>> {
    Attribute::parse(ctx, s).ok_or_else(|| err(format!("MLIR rejects the attribute `{s}`")))
}

pub fn named<'c>(
    ctx: &'c Context,
    name: &str,
    a: Attribute<'c>,
) -> (Identifier<'c>, Attribute<'c>) {
    (Identifier::new(ctx, name), a)
}

/// A dense constant holding a tensor's exact bytes (hex), as the kernel's storage type.
pub fn dense_literal(t: &Tensor) -> String {
    let ty = shaped("tensor", t.dims(), t.dtype());
    if t.is_empty() {
        return format!("dense<> : {ty}");
    }
    let mut hex = String::with_capacity(t.bytes().len() * 2 + 2);
    hex.push_str("0x");
    for b in t.bytes() {
        hex.push_str(&format!("{b:02X}"));
    }
    format!("dense<\"{hex}\"> : {ty}")
}

/// The identity map of rank `n`, or a broadcast map from a rank-`n` loop nest to an operand of
/// `dims` aligned to the right (size-1 dimensions read index 0).
pub fn broadcast_map(out_rank: usize, dims: &[usize], out_dims: &[usize]) -> String {
    let offset = out_rank - dims.len();
    let exprs: Vec<String> = dims
        .iter()
        .enumerate()
        .map(|(i, &d)| {
            if d == 1 && out_dims[offset + i] != 1 {
                "0".to_string()
            } else {
                format!("d{}", offset + i)
            }
        })
        .collect();
    format!("affine_map<({}) -> ({})>", dims_list(out_rank), exprs.join(", "))
}

/// `d0, d1, ..., d{n-1}`.
pub fn dims_list(n: usize) -> String {
    (0..n).map(|i| format!("d{i}")).collect::<Vec<_>>().join(", ")
}

/// Appends `op` to `block` and returns its first result.
pub fn push<'c, 'a>(block: &'a Block<'c>, op: Operation<'c>) -> Value<'c, 'a> {
    block.append_operation(op).result(0).expect("the op has a result").into()
}

/// Builds an op with results, operands and attributes.
pub fn op<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    name: &str,
    operands: &[Value<'c, '_>],
    results: &[Type<'c>],
    attrs: &[(&str, Attribute<'c>)],
) -> Result<Operation<'c>> {
    let attrs: Vec<_> = attrs.iter().map(|(n, a)| named(ctx, n, *a)).collect();
    OperationBuilder::new(name, loc)
        .add_operands(operands)
        .add_results(results)
        .add_attributes(&attrs)
        .build()
        .map_err(|e| err(format!("building {name}: {e}")))
}

/// A named linalg op (`linalg.matmul`, `linalg.conv_2d_nchw_fchw`...) with its body filled in by
/// MLIR (the C API does not do it on its own).
pub fn named_linalg<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    name: &str,
    ins: &[Value<'c, '_>],
    outs: &[Value<'c, '_>],
    result: Type<'c>,
    attrs: &[(&str, Attribute<'c>)],
) -> Result<Operation<'c>> {
    let mut all: Vec<_> = attrs.iter().map(|(n, a)| named(ctx, n, *a)).collect();
    all.push(named(
        ctx,
        "operandSegmentSizes",
        DenseI32ArrayAttribute::new(ctx, &[ins.len() as i32, outs.len() as i32]).into(),
    ));
    let op = OperationBuilder::new(name, loc)
        .add_operands(ins)
        .add_operands(outs)
        .add_attributes(&all)
        .add_results(&[result])
        .add_regions([Region::new()])
        .build()
        .map_err(|e| err(format!("building {name}: {e}")))?;
    // SAFETY: `op` is a freshly built named linalg op with an empty region, as the call expects.
    unsafe { mlir_sys::mlirLinalgFillBuiltinNamedOpRegion(op.to_raw()) };
    Ok(op)
}

/// A `linalg.generic`; `body` gets the body block (one argument per input and output element)
/// and returns the yielded values.
#[allow(clippy::too_many_arguments)]
pub fn generic<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    ins: &[Value<'c, '_>],
    outs: &[Value<'c, '_>],
    maps: &[String],
    iterators: &[&str],
    results: &[Type<'c>],
    body: impl for<'b> FnOnce(&'b Block<'c>) -> Result<Vec<Value<'c, 'b>>>,
) -> Result<Operation<'c>> {
    let elem = |v: &Value<'c, '_>| -> Result<Type<'c>> { element_type(ctx, v.r#type()) };
    let arg_types: Vec<(Type<'c>, Location<'c>)> =
        ins.iter().chain(outs).map(|v| elem(v).map(|t| (t, loc))).collect::<Result<_>>()?;
    let block = Block::new(&arg_types);
    let yielded = body(&block)?;
    block.append_operation(
        OperationBuilder::new("linalg.yield", loc)
            .add_operands(&yielded)
            .build()
            .map_err(|e| err(format!("linalg.yield: {e}")))?,
    );
    let region = Region::new();
    region.append_block(block);
    let maps_attr = parse_attr(ctx, &format!("[{}]", maps.join(", ")))?;
    let iters: Vec<String> =
        iterators.iter().map(|i| format!("#linalg.iterator_type<{i}>")).collect();
    let iters_attr = parse_attr(ctx, &format!("[{}]", iters.join(", ")))?;
    OperationBuilder::new("linalg.generic", loc)
        .add_operands(ins)
        .add_operands(outs)
        .add_attributes(&[
            named(ctx, "indexing_maps", maps_attr),
            named(ctx, "iterator_types", iters_attr),
            named(
                ctx,
                "operandSegmentSizes",
                DenseI32ArrayAttribute::new(ctx, &[ins.len() as i32, outs.len() as i32]).into(),
            ),
        ])
        .add_results(results)
        .add_regions([region])
        .build()
        .map_err(|e| err(format!("building linalg.generic: {e}")))
}

/// The element type of a tensor or memref type.
pub fn element_type<'c>(_ctx: &'c Context, t: Type<'c>) -> Result<Type<'c>> {
    // SAFETY: shaped-type queries on a type the caller built as a tensor or memref.
    unsafe {
        if mlir_sys::mlirTypeIsAShaped(t.to_raw()) {
            Ok(Type::from_raw(mlir_sys::mlirShapedTypeGetElementType(t.to_raw())))
        } else {
            Ok(t)
        }
    }
}

pub fn string_attr<'c>(ctx: &'c Context, s: &str) -> Attribute<'c> {
    StringAttribute::new(ctx, s).into()
}

/// `tensor.pad` of `v` (static `low`/`high` per dim) with a constant.
#[allow(clippy::too_many_arguments)] // the op's own operands and attributes
pub fn pad<'c, 'a>(
    ctx: &'c Context,
    loc: Location<'c>,
    block: &'a Block<'c>,
    v: Value<'c, 'a>,
    low: &[i64],
    high: &[i64],
    fill: Value<'c, 'a>,
    result: Type<'c>,
) -> Result<Value<'c, 'a>> {
    use melior::ir::attribute::DenseI64ArrayAttribute;
    let index = Type::index(ctx);
    let body = Block::new(&vec![(index, loc); low.len()]);
    body.append_operation(
        OperationBuilder::new("tensor.yield", loc)
            .add_operands(&[fill])
            .build()
            .map_err(|e| err(format!("tensor.yield: {e}")))?,
    );
    let region = Region::new();
    region.append_block(body);
    let p = OperationBuilder::new("tensor.pad", loc)
        .add_operands(&[v])
        .add_attributes(&[
            named(ctx, "static_low", DenseI64ArrayAttribute::new(ctx, low).into()),
            named(ctx, "static_high", DenseI64ArrayAttribute::new(ctx, high).into()),
            named(ctx, "operandSegmentSizes", DenseI32ArrayAttribute::new(ctx, &[1, 0, 0]).into()),
        ])
        .add_results(&[result])
        .add_regions([region])
        .build()
        .map_err(|e| err(format!("building tensor.pad: {e}")))?;
    Ok(push(block, p))
}

/// `tensor.expand_shape` (`expand`) or `tensor.collapse_shape` of `v` with a reassociation.
#[allow(clippy::too_many_arguments)] // the op's own operands and attributes
pub fn reshape<'c, 'a>(
    ctx: &'c Context,
    loc: Location<'c>,
    block: &'a Block<'c>,
    expand: bool,
    v: Value<'c, 'a>,
    groups: &[Vec<usize>],
    out_dims: &[usize],
    result: Type<'c>,
) -> Result<Value<'c, 'a>> {
    use melior::ir::attribute::DenseI64ArrayAttribute;
    let reassoc = format!(
        "[{}]",
        groups
            .iter()
            .map(|g| format!(
                "[{}]",
                g.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut attrs = vec![named(ctx, "reassociation", parse_attr(ctx, &reassoc)?)];
    let name = if expand {
        let dims: Vec<i64> = out_dims.iter().map(|&d| d as i64).collect();
        attrs.push(named(
            ctx,
            "static_output_shape",
            DenseI64ArrayAttribute::new(ctx, &dims).into(),
        ));
        "tensor.expand_shape"
    } else {
        "tensor.collapse_shape"
    };
    let o = OperationBuilder::new(name, loc)
        .add_operands(&[v])
        .add_attributes(&attrs)
        .add_results(&[result])
        .build()
        .map_err(|e| err(format!("building {name}: {e}")))?;
    Ok(push(block, o))
}

/// `linalg.fill` of `dest` with the scalar `value`.
pub fn fill<'c, 'a>(
    ctx: &'c Context,
    loc: Location<'c>,
    block: &'a Block<'c>,
    value: Value<'c, 'a>,
    dest: Value<'c, 'a>,
) -> Result<Value<'c, 'a>> {
    let ty = dest.r#type();
    Ok(push(block, named_linalg(ctx, loc, "linalg.fill", &[value], &[dest], ty, &[])?))
}
