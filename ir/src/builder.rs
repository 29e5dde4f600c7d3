//! The tracing API: build a graph from Rust code that reads like the model.
//!
//! ```
//! use kiln_ir::{builder::GraphBuilder, DType, Tensor};
//! let g = GraphBuilder::new("mlp");
//! let x = g.input("x", DType::F32, [2, 4]);
//! let w = g.constant("w", Tensor::random(DType::F32, &[4, 3], 1));
//! let b = g.constant("b", Tensor::random(DType::F32, &[3], 2));
//! let y = x.matmul(w).add(b).relu();
//! g.output("y", y);
//! let graph = g.build().expect("well-typed");
//! assert_eq!(graph.outputs().len(), 1);
//! ```
//!
//! Every method returns a [`Traced`] handle, never a `Result`: the first error (a shape mismatch,
//! say) is recorded with the node and op it came from, later ops on the failed value are skipped,
//! and [`GraphBuilder::build`] returns that error. Users need no `unwrap` while tracing.

use std::cell::RefCell;
use std::collections::HashMap;

use crate::op::{AutoPad, Conv, Gemm, Pool, PoolKind, Reduce, ReduceKind, Window};
use crate::{
    BinaryOp, DType, Graph, IrError, Op, Result, Shape, Tensor, TensorType, UnaryOp, ValueId,
};

/// Records a graph as it is traced.
pub struct GraphBuilder {
    state: RefCell<State>,
}

struct State {
    graph: Graph,
    error: Option<IrError>,
    counters: HashMap<String, usize>,
}

/// A value in a graph being traced. Cheap to copy.
#[derive(Clone, Copy)]
pub struct Traced<'g> {
    builder: &'g GraphBuilder,
    /// `None` once an error has been recorded for this value or one it depends on.
    value: Option<ValueId>,
}

/// Uniform convolution options (the same stride, padding and dilation on every spatial axis).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvOptions {
    pub stride: usize,
    pub pad: usize,
    pub dilation: usize,
    pub group: usize,
}

impl Default for ConvOptions {
    fn default() -> ConvOptions {
        ConvOptions { stride: 1, pad: 0, dilation: 1, group: 1 }
    }
}

impl ConvOptions {
    pub fn stride(self, stride: usize) -> ConvOptions {
        ConvOptions { stride, ..self }
    }
    pub fn pad(self, pad: usize) -> ConvOptions {
        ConvOptions { pad, ..self }
    }
    pub fn dilation(self, dilation: usize) -> ConvOptions {
        ConvOptions { dilation, ..self }
    }
    pub fn group(self, group: usize) -> ConvOptions {
        ConvOptions { group, ..self }
    }

    fn window(&self, spatial: usize) -> Window {
        Window {
            strides: vec![self.stride; spatial],
            dilations: vec![self.dilation; spatial],
            pads: vec![self.pad; 2 * spatial],
            auto_pad: AutoPad::NotSet,
        }
    }
}

impl GraphBuilder {
    pub fn new(name: &str) -> GraphBuilder {
        GraphBuilder {
            state: RefCell::new(State {
                graph: Graph::new(name),
                error: None,
                counters: HashMap::new(),
            }),
        }
    }

    /// Continues tracing on an existing graph: new ops are appended to it, its values are
    /// reached with [`GraphBuilder::value`]. The autodiff transform builds backward graphs so.
    pub fn from_graph(graph: Graph) -> GraphBuilder {
        GraphBuilder { state: RefCell::new(State { graph, error: None, counters: HashMap::new() }) }
    }

    /// A handle on a value already in the graph (one from [`GraphBuilder::from_graph`]'s graph).
    pub fn value(&self, v: ValueId) -> Traced<'_> {
        let known =
            self.state.borrow().graph.try_node(v.node).is_some_and(|n| v.output < n.outputs.len());
        if !known {
            self.record(IrError::Graph(format!("value {v:?} is not in the graph being traced")));
            return Traced { builder: self, value: None };
        }
        Traced { builder: self, value: Some(v) }
    }

    /// The first error recorded so far, if any (tracing goes on; [`GraphBuilder::build`] returns it).
    pub fn error(&self) -> Option<IrError> {
        self.state.borrow().error.clone()
    }

    /// Reads the graph as traced so far.
    pub(crate) fn with_graph<R>(&self, f: impl FnOnce(&Graph) -> R) -> R {
        f(&self.state.borrow().graph)
    }

    fn record(&self, e: IrError) {
        let mut s = self.state.borrow_mut();
        if s.error.is_none() {
            s.error = Some(e);
        }
    }

    fn traced(&self, r: Result<ValueId>) -> Traced<'_> {
        match r {
            Ok(v) => Traced { builder: self, value: Some(v) },
            Err(e) => {
                self.record(e);
                Traced { builder: self, value: None }
            }
        }
    }

    /// A fresh node name from the op's name: `relu`, `relu_1`...
    fn auto_name(&self, op: &str) -> String {
        let mut s = self.state.borrow_mut();
        let base = op.to_lowercase();
        loop {
            let n = s.counters.entry(base.clone()).or_insert(0);
            let name = if *n == 0 { base.clone() } else { format!("{base}_{n}") };
            *n += 1;
            if s.graph.node_by_name(&name).is_none() {
                return name;
            }
        }
    }

    /// Declares the next graph input.
    pub fn input(&self, name: &str, dtype: DType, shape: impl Into<Shape>) -> Traced<'_> {
        let r = self.state.borrow_mut().graph.add_input(name, TensorType::new(dtype, shape));
        self.traced(r)
    }

    /// A named constant: a weight, a bias, a table.
    pub fn constant(&self, name: &str, value: Tensor) -> Traced<'_> {
        let r = self.state.borrow_mut().graph.add_constant(name, value);
        self.traced(r)
    }

    /// A constant with an automatic name (`const_3`).
    pub fn anon_constant(&self, value: Tensor) -> Traced<'_> {
        let name = self.auto_name("const");
        self.constant(&name, value)
    }

    /// Marks a value as the next graph output.
    pub fn output(&self, name: &str, value: Traced<'_>) {
        if let Some(v) = self.own(value) {
            let r = self.state.borrow_mut().graph.add_output(name, v);
            if let Err(e) = r {
                self.record(e);
            }
        }
    }

    /// The value behind a handle, checking it belongs to this builder.
    fn own(&self, t: Traced<'_>) -> Option<ValueId> {
        if !std::ptr::eq(self, t.builder) {
            self.record(IrError::Graph("a value from another graph builder was used".into()));
            return None;
        }
        t.value
    }

    /// Adds a node of any op (the escape hatch for ops without a method); `None` operands are
    /// omitted optional ones. Returns the node's results.
    pub fn apply(
        &self,
        op: Op,
        operands: &[Option<Traced<'_>>],
        num_outputs: usize,
    ) -> Vec<Traced<'_>> {
        let poisoned = || vec![Traced { builder: self, value: None }; num_outputs.max(1)];
        let mut ids = Vec::with_capacity(operands.len());
        for o in operands {
            match o {
                None => ids.push(None),
                Some(t) => match self.own(*t) {
                    Some(v) => ids.push(Some(v)),
                    None => return poisoned(),
                },
            }
        }
        let name = self.auto_name(op.name());
        let r = self.state.borrow_mut().graph.add_node_with_outputs(&name, op, &ids, num_outputs);
        match r {
            Ok(id) => (0..num_outputs)
                .map(|i| Traced { builder: self, value: Some(ValueId::new(id, i)) })
                .collect(),
            Err(e) => {
                self.record(e);
                poisoned()
            }
        }
    }

    fn apply1(&self, op: Op, operands: &[Option<Traced<'_>>]) -> Traced<'_> {
        self.apply(op, operands, 1)[0]
    }

    /// Concatenates along `axis`.
    pub fn concat(&self, values: &[Traced<'_>], axis: i64) -> Traced<'_> {
        let ops: Vec<Option<Traced>> = values.iter().map(|v| Some(*v)).collect();
        self.apply1(Op::Concat { axis }, &ops)
    }

    /// The graph as traced so far, not verified, or the first error met while tracing: for a
    /// caller that traces into a graph it is still building (the ONNX importer expanding a node
    /// into ops), which would be verified whole once per node otherwise.
    pub(crate) fn into_graph(self) -> Result<Graph> {
        let s = self.state.into_inner();
        match s.error {
            Some(e) => Err(e),
            None => Ok(s.graph),
        }
    }

    /// The finished graph, verified, or the first error met while tracing.
    pub fn build(self) -> Result<Graph> {
        let s = self.state.into_inner();
        if let Some(e) = s.error {
            return Err(e);
        }
        s.graph.verify()?;
        Ok(s.graph)
    }
}

// `Traced` implements the operator traits too (`a + b`); the methods are the chainable spelling
// (`x.matmul(w).add(b).relu()`), so their names are the traits' on purpose.
macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:expr;)*) => {
        $( $(#[$doc])* #[allow(clippy::should_implement_trait)] pub fn $name(self) -> Traced<'g> { self.unary($op) } )*
    };
}

macro_rules! binary_methods {
    ($($name:ident => $op:expr;)*) => {
        $( #[allow(clippy::should_implement_trait)] pub fn $name(self, other: Traced<'g>) -> Traced<'g> { self.binary($op, other) } )*
    };
}

impl<'g> Traced<'g> {
    /// The value's id in the graph, if it was traced without error.
    pub fn id(&self) -> Option<ValueId> {
        self.value
    }

    /// The builder this value belongs to.
    pub fn builder(&self) -> &'g GraphBuilder {
        self.builder
    }

    /// The value's type, if it was traced without error.
    pub fn ty(&self) -> Option<TensorType> {
        self.value.map(|v| self.builder.state.borrow().graph.value_type(v).clone())
    }

    /// Names the node that produced this value (instead of the automatic `relu_3`).
    pub fn named(self, name: &str) -> Traced<'g> {
        if let Some(v) = self.value {
            let r = self.builder.state.borrow_mut().graph.rename_node(v.node, name);
            if let Err(e) = r {
                self.builder.record(e);
                return Traced { value: None, ..self };
            }
        }
        self
    }

    /// A constant i64 vector (axes, a shape, starts...) in this value's graph.
    pub fn ints(self, v: &[i64]) -> Traced<'g> {
        self.builder.anon_constant(Tensor::vector(v))
    }

    /// A scalar constant of this value's element type.
    pub fn scalar(self, v: f64) -> Traced<'g> {
        match self.ty() {
            Some(t) => self.builder.anon_constant(Tensor::full(t.dtype, &[], v)),
            None => self,
        }
    }

    pub fn unary(self, u: UnaryOp) -> Traced<'g> {
        self.builder.apply1(Op::Unary(u), &[Some(self)])
    }

    pub fn binary(self, b: BinaryOp, other: Traced<'g>) -> Traced<'g> {
        self.builder.apply1(Op::Binary(b), &[Some(self), Some(other)])
    }

    unary_methods! {
        relu => UnaryOp::Relu;
        sigmoid => UnaryOp::Sigmoid;
        tanh => UnaryOp::Tanh;
        exp => UnaryOp::Exp;
        log => UnaryOp::Log;
        sqrt => UnaryOp::Sqrt;
        neg => UnaryOp::Neg;
        abs => UnaryOp::Abs;
        reciprocal => UnaryOp::Reciprocal;
        erf => UnaryOp::Erf;
        /// Exact (erf) GELU.
        gelu => UnaryOp::Gelu { tanh: false };
        /// GELU with the tanh approximation.
        gelu_tanh => UnaryOp::Gelu { tanh: true };
    }

    binary_methods! {
        add => BinaryOp::Add;
        sub => BinaryOp::Sub;
        mul => BinaryOp::Mul;
        div => BinaryOp::Div;
        pow => BinaryOp::Pow;
        max => BinaryOp::Max;
        min => BinaryOp::Min;
        equal => BinaryOp::Equal;
        less => BinaryOp::Less;
        greater => BinaryOp::Greater;
    }

    /// `min(max(x, lo), hi)` with scalar bounds of this value's type.
    pub fn clip(self, lo: f64, hi: f64) -> Traced<'g> {
        let (l, h) = (self.scalar(lo), self.scalar(hi));
        self.builder.apply1(Op::Clip, &[Some(self), Some(l), Some(h)])
    }

    /// Elementwise choice: where `self` (bool) is true `a`, else `b`.
    pub fn select(self, a: Traced<'g>, b: Traced<'g>) -> Traced<'g> {
        self.builder.apply1(Op::Where, &[Some(self), Some(a), Some(b)])
    }

    pub fn cast(self, to: DType) -> Traced<'g> {
        self.builder.apply1(Op::Cast { to, saturate: true }, &[Some(self)])
    }

    pub fn identity(self) -> Traced<'g> {
        self.builder.apply1(Op::Identity, &[Some(self)])
    }

    pub fn matmul(self, other: Traced<'g>) -> Traced<'g> {
        self.binary_op(Op::MatMul, other)
    }

    fn binary_op(self, op: Op, other: Traced<'g>) -> Traced<'g> {
        self.builder.apply1(op, &[Some(self), Some(other)])
    }

    /// `alpha * self' b' + beta * c`.
    pub fn gemm(self, b: Traced<'g>, c: Option<Traced<'g>>, attrs: Gemm) -> Traced<'g> {
        self.builder.apply1(Op::Gemm(attrs), &[Some(self), Some(b), c])
    }

    /// A fully connected layer in PyTorch's layout: `self · weightᵀ + bias`, weight [out, in].
    pub fn linear(self, weight: Traced<'g>, bias: Traced<'g>) -> Traced<'g> {
        self.gemm(weight, Some(bias), Gemm { trans_b: true, ..Gemm::default() })
    }

    /// Convolution over every spatial axis of `self` [N, C, spatial...] with weight [M, C/group, kernel...].
    pub fn conv(self, weight: Traced<'g>, bias: Option<Traced<'g>>, o: ConvOptions) -> Traced<'g> {
        let spatial = weight.ty().map_or(0, |t| t.rank().saturating_sub(2));
        self.builder.apply1(
            Op::Conv(Conv { window: o.window(spatial), group: o.group }),
            &[Some(self), Some(weight), bias],
        )
    }

    fn pool(self, kind: PoolKind, kernel: usize, stride: usize, pad: usize) -> Traced<'g> {
        let spatial = self.ty().map_or(0, |t| t.rank().saturating_sub(2));
        let window = ConvOptions { stride, pad, ..ConvOptions::default() }.window(spatial);
        self.builder.apply1(
            Op::Pool(Pool {
                kind,
                kernel: vec![kernel; spatial],
                window,
                ceil_mode: false,
                column_major_indices: false,
            }),
            &[Some(self)],
        )
    }

    /// Max pooling with a square window.
    pub fn max_pool(self, kernel: usize, stride: usize, pad: usize) -> Traced<'g> {
        self.pool(PoolKind::Max, kernel, stride, pad)
    }

    /// Average pooling with a square window (padding not counted).
    pub fn avg_pool(self, kernel: usize, stride: usize, pad: usize) -> Traced<'g> {
        self.pool(PoolKind::Average { count_include_pad: false }, kernel, stride, pad)
    }

    pub fn global_avg_pool(self) -> Traced<'g> {
        self.builder
            .apply1(Op::GlobalPool(PoolKind::Average { count_include_pad: false }), &[Some(self)])
    }

    pub fn softmax(self, axis: i64) -> Traced<'g> {
        self.builder.apply1(Op::Softmax { axis }, &[Some(self)])
    }

    /// Layer normalisation over the axes from `axis` on.
    pub fn layer_norm(
        self,
        scale: Traced<'g>,
        bias: Traced<'g>,
        axis: i64,
        epsilon: f32,
    ) -> Traced<'g> {
        self.builder.apply1(Op::LayerNorm { axis, epsilon }, &[Some(self), Some(scale), Some(bias)])
    }

    /// Inference-mode batch normalisation of `self` [N, C, ...].
    pub fn batch_norm(
        self,
        scale: Traced<'g>,
        bias: Traced<'g>,
        mean: Traced<'g>,
        var: Traced<'g>,
        epsilon: f32,
    ) -> Traced<'g> {
        self.builder.apply1(
            Op::BatchNorm { epsilon },
            &[Some(self), Some(scale), Some(bias), Some(mean), Some(var)],
        )
    }

    /// A reduction over `axes` (all axes if empty).
    pub fn reduce(self, kind: ReduceKind, axes: &[i64], keepdims: bool) -> Traced<'g> {
        let axes = (!axes.is_empty()).then(|| self.ints(axes));
        self.builder.apply1(
            Op::Reduce(Reduce { kind, keepdims, noop_with_empty_axes: false }),
            &[Some(self), axes],
        )
    }

    pub fn reduce_sum(self, axes: &[i64], keepdims: bool) -> Traced<'g> {
        self.reduce(ReduceKind::Sum, axes, keepdims)
    }

    pub fn reduce_mean(self, axes: &[i64], keepdims: bool) -> Traced<'g> {
        self.reduce(ReduceKind::Mean, axes, keepdims)
    }

    pub fn reduce_max(self, axes: &[i64], keepdims: bool) -> Traced<'g> {
        self.reduce(ReduceKind::Max, axes, keepdims)
    }

    pub fn reduce_l2(self, axes: &[i64], keepdims: bool) -> Traced<'g> {
        self.reduce(ReduceKind::L2, axes, keepdims)
    }

    /// ONNX Reshape: `0` copies a dimension, `-1` is inferred.
    pub fn reshape(self, shape: &[i64]) -> Traced<'g> {
        let s = self.ints(shape);
        self.builder.apply1(Op::Reshape { allowzero: false }, &[Some(self), Some(s)])
    }

    pub fn flatten(self, axis: i64) -> Traced<'g> {
        self.builder.apply1(Op::Flatten { axis }, &[Some(self)])
    }

    pub fn transpose(self, perm: &[usize]) -> Traced<'g> {
        self.builder.apply1(Op::Transpose { perm: perm.to_vec() }, &[Some(self)])
    }

    pub fn squeeze(self, axes: &[i64]) -> Traced<'g> {
        let a = self.ints(axes);
        self.builder.apply1(Op::Squeeze, &[Some(self), Some(a)])
    }

    pub fn unsqueeze(self, axes: &[i64]) -> Traced<'g> {
        let a = self.ints(axes);
        self.builder.apply1(Op::Unsqueeze, &[Some(self), Some(a)])
    }

    /// Splits along `axis` into parts of the given sizes.
    pub fn split(self, axis: i64, sizes: &[i64]) -> Vec<Traced<'g>> {
        let s = self.ints(sizes);
        self.builder.apply(
            Op::Split { axis, num_outputs: sizes.len() },
            &[Some(self), Some(s)],
            sizes.len(),
        )
    }

    /// ONNX Slice: `starts`, `ends` and `steps` per axis of `axes`.
    pub fn slice(self, starts: &[i64], ends: &[i64], axes: &[i64], steps: &[i64]) -> Traced<'g> {
        let ops = [
            Some(self),
            Some(self.ints(starts)),
            Some(self.ints(ends)),
            Some(self.ints(axes)),
            Some(self.ints(steps)),
        ];
        self.builder.apply1(Op::Slice, &ops)
    }

    /// Takes entries of `self` along `axis` at `indices` (i32 or i64).
    pub fn gather(self, indices: Traced<'g>, axis: i64) -> Traced<'g> {
        self.builder.apply1(Op::Gather { axis }, &[Some(self), Some(indices)])
    }

    /// Broadcasts to `shape`.
    pub fn expand(self, shape: &[i64]) -> Traced<'g> {
        let s = self.ints(shape);
        self.builder.apply1(Op::Expand, &[Some(self), Some(s)])
    }
}

macro_rules! operator {
    ($tr:ident, $method:ident, $op:ident) => {
        impl<'g> std::ops::$tr for Traced<'g> {
            type Output = Traced<'g>;
            fn $method(self, rhs: Traced<'g>) -> Traced<'g> {
                Traced::$op(self, rhs)
            }
        }
    };
}

operator!(Add, add, add);
operator!(Sub, sub, sub);
operator!(Mul, mul, mul);
operator!(Div, div, div);

impl<'g> std::ops::Neg for Traced<'g> {
    type Output = Traced<'g>;
    fn neg(self) -> Traced<'g> {
        Traced::neg(self)
    }
}
