//! Integer ops for the CPU's integer kernels (`backend/cpu/quantized.c`):
//!
//! - `QuantizeLinear(Conv(DequantizeLinear(x), DequantizeLinear(w), DequantizeLinear(b)))`, as
//!   onnxruntime's quantizer writes a convolution in QDQ form and as the importer expands ONNX's
//!   QLinearConv, becomes one `QConv` node, run on the 8-bit values (u8 x s8 products summed in
//!   int32, the requantisation as it stores). Taken where the kernel can
//!   (`ukernel::runs_qconv` checks the node it would make): a 2-D convolution of one group or
//!   depthwise, u8 or s8 activations with one constant scale and zero point, constant s8
//!   weights with one scale or one per output channel and zero points 0, a constant int32 bias
//!   whose scale is `x_scale * w_scale` (as the quantizer writes it) or none, the result
//!   quantized to u8 or s8 with one constant scale and zero point, and the float convolution's
//!   result used by that QuantizeLinear alone.
//!   A Relu, or a Clip with constant bounds, between the convolution and the QuantizeLinear
//!   becomes a Clip of the 8-bit result to the bounds quantized (quantizing is increasing).
//! - `QuantizeLinear(Gemm(DequantizeLinear(a), DequantizeLinear(w), DequantizeLinear(b)))`, and
//!   the same of a MatMul (no bias), with the same conditions on the operands (the weights a
//!   constant matrix, per output column where per channel), become a `QConv` with a 1x1 window
//!   on the rows reshaped to `[rows, K, 1, 1]`, and a Reshape back: a matrix product is that
//!   convolution, and the CPU runs it on its integer matrix kernel (`kiln_uk_qgemm`). This is
//!   onnxruntime's QDQ Gemm/MatMul, the importer's QLinearMatMul, and classifier heads.
//! - `QuantizeLinear(MaxPool(DequantizeLinear(x, s, z)), s, z)` of u8 becomes `MaxPool(x)`.
//! - `QuantizeLinear(Add(DequantizeLinear(a), DequantizeLinear(b)))` (a residual Add), all three
//!   u8 or all s8 with constant scalar scales and zero points, gives onnxruntime's bytes: its
//!   optimizer makes the pattern a QLinearAdd, which computes `fma(a, sa/sc, fma(b, sb/sc, zc -
//!   fma(sa/sc, za, (sb/sc) zb)))` in f32, rounded half to even. ONNX's float form (dequantize,
//!   add, quantize with a division) rounds a few of the 65536 operand pairs the other way (0 to
//!   2 in mobilenet_v2's Adds), and in a deep network one step grows from layer to layer. kiln
//!   has no fused multiply-add op, so the pass keeps the float form, written out as elementwise
//!   ops, and selects onnxruntime's result for each pair found apart by trying all of them
//!   (`QuantizedAdd::corrections`, at most `MAX_CORRECTIONS`; past that the Add is left as it
//!   is). An emulation of the fused multiply-adds in f64 or with TwoSum in f32 cost 1.5 to 3
//!   times the Add's kernel time; a test of two bytes where there is a correction costs little.
//!
//! Anything else stays float arithmetic (`decompose`).

use kiln_ir::op::{Conv, PoolKind};
use kiln_ir::{DType, Graph, NodeId, Op, Tensor, ValueId};

use crate::Result;

pub fn run(graph: &mut Graph) -> Result<bool> {
    let mut changed = false;
    for id in graph.topo_order()? {
        let Some(node) = graph.try_node(id) else { continue };
        if !matches!(node.op, Op::Quantize { block_size: 0, .. }) {
            continue;
        }
        if let Some(pooled) = integer_max_pool(graph, id) {
            let name = graph.unique_name(&format!("{}/integer", graph.node(id).name));
            let op = graph.node(pooled.node).op.clone();
            let x = graph.operands(pooled.node)[0].and_then(|d| graph.operands(d.node)[0]);
            let new = graph.add_node(&name, op, &[x])?;
            graph.replace_uses(ValueId::from(id), ValueId::from(new))?;
            changed = true;
            continue;
        }
        if let Some(add) = integer_add(graph, id) {
            let name = graph.unique_name(&format!("{}/qlinear_add", graph.node(id).name));
            if let Some(new) = add.build(graph, &name)? {
                graph.replace_uses(ValueId::from(id), new)?;
                changed = true;
            }
            continue;
        }
        let name = graph.unique_name(&format!("{}/integer", graph.node(id).name));
        let (value, range) = if let Some((conv, operands, range)) = integer_conv(graph, id) {
            let operands = materialize(graph, &name, operands)?;
            changed = true;
            let new = graph.add_node(&name, Op::QConv(conv), &operands)?;
            if !crate::backend::cpu::ukernel::runs_qconv(graph, new) {
                graph.remove_node(new)?;
                continue;
            }
            (ValueId::from(new), range)
        } else if let Some(product) = integer_product(graph, id) {
            changed = true;
            let range = product.range;
            let Some(v) = product.build(graph, &name)? else { continue };
            (v, range)
        } else {
            continue;
        };
        let result = match quantized_bounds(graph, id, range) {
            // An activation's bounds, as a Clip of the 8-bit result.
            Some((lo, hi)) => {
                let d = graph.value_type(value).dtype;
                let clip_name = graph.unique_name(&format!("{name}/activation"));
                let lo = graph
                    .add_constant(&format!("{clip_name}/lo"), Tensor::from_f64s(d, &[], &[lo])?)?;
                let hi = graph
                    .add_constant(&format!("{clip_name}/hi"), Tensor::from_f64s(d, &[], &[hi])?)?;
                let clip =
                    graph.add_node(&clip_name, Op::Clip, &[Some(value), Some(lo), Some(hi)])?;
                ValueId::from(clip)
            }
            None => value,
        };
        graph.replace_uses(ValueId::from(id), result)?;
    }
    if changed {
        crate::passes::fold::remove_dead(graph)?;
    }
    Ok(changed)
}

/// `MaxPool(DequantizeLinear(x, s, z))` quantized again with the same `s` and `z` is
/// `MaxPool(x)` (dequantizing is increasing when `s > 0`, and quantizing undoes it exactly):
/// the pooling node, when `q` is such a QuantizeLinear of u8.
fn integer_max_pool(graph: &Graph, q: NodeId) -> Option<ValueId> {
    let q_ops = graph.operands(q);
    let (pooled, sy, zy) = (
        q_ops.first().copied().flatten()?,
        q_ops.get(1).copied().flatten()?,
        q_ops.get(2).copied().flatten()?,
    );
    let Op::Pool(p) = &graph.try_node(pooled.node)?.op else { return None };
    if p.kind != PoolKind::Max
        || graph.node(pooled.node).outputs.len() != 1
        || graph.users(pooled).len() != 1
    {
        return None;
    }
    if graph.outputs().iter().any(|(_, o)| *o == pooled) {
        return None;
    }
    let (x, sx, zx, _) =
        dequantized(graph, graph.operands(pooled.node).first().copied().flatten()?)?;
    let same = |a: ValueId, b: Option<ValueId>| -> Option<bool> {
        let (a, b) = (constant(graph, a)?, constant(graph, b?)?);
        Some(a.to_f64s() == b.to_f64s() && a.dims().len() <= 1 && a.to_f64s().len() == 1)
    };
    let positive = scalar(graph, Some(sx))? > 0.0;
    let u8_in_out = graph.value_type(x).dtype == DType::U8
        && graph.value_type(ValueId::from(q)).dtype == DType::U8;
    (positive && u8_in_out && same(sx, Some(sy))? && same(zy, zx)?).then_some(pooled)
}

/// An operand of the QConv to be: a value of the graph, or a zero point the pattern left out.
enum Operand {
    Value(ValueId),
    Zero(DType),
}

/// The zero points the pattern left out, as constants.
fn materialize(
    graph: &mut Graph,
    name: &str,
    operands: Vec<Option<Operand>>,
) -> Result<Vec<Option<ValueId>>> {
    operands
        .into_iter()
        .map(|o| match o {
            None => Ok(None),
            Some(Operand::Value(v)) => Ok(Some(v)),
            Some(Operand::Zero(d)) => {
                let zero = Tensor::from_f64s(d, &[], &[0.0])?;
                Ok(Some(
                    graph.add_constant(&graph.unique_name(&format!("{name}/zero_point")), zero)?,
                ))
            }
        })
        .collect()
}

/// The constant that `v` is, when it is one.
fn constant(graph: &Graph, v: ValueId) -> Option<&Tensor> {
    graph.constant_value(v)
}

/// One value, constant.
fn scalar(graph: &Graph, v: Option<ValueId>) -> Option<f64> {
    let t = constant(graph, v?)?;
    let values = t.to_f64s();
    (values.len() == 1).then(|| values[0])
}

/// `v` is made by a DequantizeLinear without blocks: its (x, scale, zero point).
fn dequantized(graph: &Graph, v: ValueId) -> Option<(ValueId, ValueId, Option<ValueId>, i64)> {
    let node = graph.try_node(v.node)?;
    let Op::Dequantize { axis, block_size: 0 } = node.op else { return None };
    let ops = graph.operands(v.node);
    Some((
        ops.first().copied().flatten()?,
        ops.get(1).copied().flatten()?,
        ops.get(2).copied().flatten(),
        axis,
    ))
}

/// An 8-bit activation's scale (one f32 constant) where its zero point is one constant or none.
fn activation_scale(graph: &Graph, x: ValueId, sx: ValueId, zx: Option<ValueId>) -> Option<f64> {
    if !matches!(graph.value_type(x).dtype, DType::U8 | DType::I8)
        || graph.value_type(sx).dtype != DType::F32
    {
        return None;
    }
    if zx.is_some() {
        scalar(graph, zx)?;
    }
    scalar(graph, Some(sx))
}

/// `Some` where a zero point is absent or a constant of zeros.
fn zero_or_absent(graph: &Graph, z: Option<ValueId>) -> Option<()> {
    match z {
        Some(z) => constant(graph, z)?.to_f64s().iter().all(|&v| v == 0.0).then_some(()),
        None => Some(()),
    }
}

/// Whether `v` is read by one node alone and is no graph output.
fn used_once(graph: &Graph, v: ValueId) -> bool {
    graph.users(v).len() == 1 && !graph.outputs().iter().any(|(_, o)| *o == v)
}

/// A Relu, or a Clip with constant bounds, between the convolution and the QuantizeLinear: its
/// operand and the float range it keeps.
fn activation(graph: &Graph, v: ValueId) -> Option<(ValueId, (f64, f64))> {
    let node = graph.try_node(v.node)?;
    let ops = graph.operands(v.node);
    let x = ops.first().copied().flatten()?;
    match node.op {
        Op::Unary(kiln_ir::UnaryOp::Relu) => Some((x, (0.0, f64::INFINITY))),
        Op::Clip => {
            let bound = |i: usize, none: f64| match ops.get(i).copied().flatten() {
                None => Some(none),
                Some(b) => scalar(graph, Some(b)),
            };
            Some((x, (bound(1, f64::NEG_INFINITY)?, bound(2, f64::INFINITY)?)))
        }
        _ => None,
    }
}

/// An activation's float range in the result's quantized domain (quantizing is increasing,
/// so clamping after it is the same): `None` when it clamps nothing the type does not.
fn quantized_bounds(graph: &Graph, q: NodeId, range: Option<(f64, f64)>) -> Option<(f64, f64)> {
    let (lo, hi) = range?;
    let ops = graph.operands(q);
    let (sy, zy) = (scalar(graph, ops[1])?, scalar(graph, ops.get(2).copied().flatten())?);
    let d = graph.value_type(ValueId::from(q)).dtype;
    let (tmin, tmax) = kiln_ir::eval::quantized_range(d);
    let quantize = |v: f64| ((v as f32 / sy as f32) as f64).round_ties_even() + zy;
    let qlo = if lo.is_finite() { quantize(lo).clamp(tmin, tmax) } else { tmin };
    let qhi = if hi.is_finite() { quantize(hi).clamp(tmin, tmax) } else { tmax };
    (qlo > tmin || qhi < tmax).then_some((qlo, qhi))
}

/// What a QuantizeLinear with one constant positive scale and one zero point quantizes: the
/// float result it alone reads (through a Relu or Clip, itself read only there: its range).
struct Quantized {
    real: ValueId,
    sy: ValueId,
    zy: ValueId,
    range: Option<(f64, f64)>,
}

fn quantized(graph: &Graph, q: NodeId) -> Option<Quantized> {
    let q_ops = graph.operands(q);
    let (mut real, sy, zy) = (
        q_ops.first().copied().flatten()?,
        q_ops.get(1).copied().flatten()?,
        q_ops.get(2).copied().flatten()?,
    );
    if scalar(graph, Some(sy))? <= 0.0 {
        return None;
    }
    scalar(graph, Some(zy))?;
    if !used_once(graph, real) {
        return None;
    }
    let mut range = None;
    if let Some((x, r)) = activation(graph, real) {
        if !used_once(graph, x) {
            return None;
        }
        real = x;
        range = Some(r);
    }
    Some(Quantized { real, sy, zy, range })
}

/// The QConv operands for QuantizeLinear `q` of a convolution of dequantized values (with a
/// Relu or Clip between them: its float range).
#[allow(clippy::type_complexity)]
fn integer_conv(
    graph: &Graph,
    q: NodeId,
) -> Option<(Conv, Vec<Option<Operand>>, Option<(f64, f64)>)> {
    let Quantized { real, sy, zy, range } = quantized(graph, q)?;
    let Op::Conv(conv) = &graph.try_node(real.node)?.op else { return None };
    let c_ops = graph.operands(real.node);
    let (x, sx, zx, _) = dequantized(graph, c_ops.first().copied().flatten()?)?;
    let (w, sw, zw, w_axis) = dequantized(graph, c_ops.get(1).copied().flatten()?)?;
    let x_scale = activation_scale(graph, x, sx, zx)?;
    // Weights: s8 constants, zero points 0, the scale one value or one per output channel.
    let wt = constant(graph, w)?;
    if wt.dtype() != DType::I8 || wt.dims().len() != 4 {
        return None;
    }
    let m = wt.dims()[0];
    let w_scales = constant(graph, sw)?.to_f64s();
    let per_channel = w_scales.len() == m && (w_axis == 0 || w_axis == -4);
    if w_scales.len() != 1 && !per_channel {
        return None;
    }
    zero_or_absent(graph, zw)?;
    // The bias: int32 in units of x_scale * w_scale (the quantizer's choice), zero point 0.
    let bias = match c_ops.get(2).copied().flatten() {
        None => None,
        Some(bd) => Some(quantized_bias(graph, bd, m, x_scale, &w_scales)?),
    };
    let zx = Some(match zx {
        Some(z) => Operand::Value(z),
        None => Operand::Zero(graph.value_type(x).dtype),
    });
    let zw = Some(match zw {
        Some(z) => Operand::Value(z),
        None => Operand::Zero(DType::I8),
    });
    let value = |v: ValueId| Some(Operand::Value(v));
    let operands = vec![
        value(x),
        value(sx),
        zx,
        value(w),
        value(sw),
        zw,
        value(sy),
        value(zy),
        bias.map(Operand::Value),
    ];
    Some((conv.clone(), operands, range))
}

/// A quantized matrix product found by `integer_product`: what the QConv that computes it
/// takes, and the shapes around it.
struct Product {
    a: ValueId,
    a_scale: ValueId,
    a_zero: Option<ValueId>,
    /// The weights as the convolution's `[M, K, 1, 1]`.
    weights: Tensor,
    w_scale: ValueId,
    w_zero: Option<ValueId>,
    y_scale: ValueId,
    y_zero: ValueId,
    bias: Option<ValueId>,
    rows: usize,
    k: usize,
    /// The product's result dims.
    out: Vec<usize>,
    range: Option<(f64, f64)>,
}

impl Product {
    /// Reshape -> QConv (1x1) -> Reshape; `None` (nothing added that stays) where the CPU's
    /// integer kernel does not take the QConv.
    fn build(self, graph: &mut Graph, name: &str) -> Result<Option<ValueId>> {
        let shape = |dims: &[usize]| {
            let d: Vec<f64> = dims.iter().map(|&d| d as f64).collect();
            Tensor::from_f64s(DType::I64, &[d.len()], &d)
        };
        let rows_shape = graph
            .add_constant(&format!("{name}/rows_shape"), shape(&[self.rows, self.k, 1, 1])?)?;
        let rows = graph.add_node(
            &format!("{name}/rows"),
            Op::Reshape { allowzero: false },
            &[Some(self.a), Some(rows_shape)],
        )?;
        let w = graph.add_constant(&format!("{name}/weights"), self.weights)?;
        let a_dtype = graph.value_type(self.a).dtype;
        let value = |v: ValueId| Some(Operand::Value(v));
        let operands = materialize(
            graph,
            name,
            vec![
                value(ValueId::from(rows)),
                value(self.a_scale),
                Some(self.a_zero.map_or(Operand::Zero(a_dtype), Operand::Value)),
                value(w),
                value(self.w_scale),
                Some(self.w_zero.map_or(Operand::Zero(DType::I8), Operand::Value)),
                value(self.y_scale),
                value(self.y_zero),
                self.bias.map(Operand::Value),
            ],
        )?;
        let conv = Conv { window: kiln_ir::op::Window::unit(2), group: 1 };
        let product = graph.add_node(name, Op::QConv(conv), &operands)?;
        if !crate::backend::cpu::ukernel::runs_qconv(graph, product) {
            graph.remove_node(product)?;
            graph.remove_node(rows)?;
            return Ok(None);
        }
        let out_shape = graph.add_constant(&format!("{name}/result_shape"), shape(&self.out)?)?;
        let result = graph.add_node(
            &format!("{name}/result"),
            Op::Reshape { allowzero: false },
            &[Some(ValueId::from(product)), Some(out_shape)],
        )?;
        Ok(Some(ValueId::from(result)))
    }
}

/// QuantizeLinear `q` of a Gemm (`alpha` = `beta` = 1, A not transposed) or MatMul of
/// dequantized 8-bit rows by dequantized constant s8 weights (a matrix), with the conditions of
/// `integer_conv` on scales, zero points and bias, and a Relu or Clip between allowed.
fn integer_product(graph: &Graph, q: NodeId) -> Option<Product> {
    let Quantized { real, sy, zy, range } = quantized(graph, q)?;
    let p_ops = graph.operands(real.node);
    let (trans_b, bias) = match &graph.try_node(real.node)?.op {
        Op::MatMul => (false, None),
        Op::Gemm(g) if g.alpha == 1.0 && g.beta == 1.0 && !g.trans_a => {
            (g.trans_b, p_ops.get(2).copied().flatten())
        }
        _ => return None,
    };
    let (a, sa, za, _) = dequantized(graph, p_ops.first().copied().flatten()?)?;
    let (w, sw, zw, w_axis) = dequantized(graph, p_ops.get(1).copied().flatten()?)?;
    let a_scale = activation_scale(graph, a, sa, za)?;
    let a_dims = graph.value_type(a).shape.as_fixed()?;
    if a_dims.len() < 2 {
        return None;
    }
    // The weights: an s8 constant matrix [K, M] ([M, K] transposed), zero points 0, one scale or
    // one per output column.
    let wt = constant(graph, w)?;
    if wt.dtype() != DType::I8 || wt.dims().len() != 2 {
        return None;
    }
    let (k, m) = if trans_b { (wt.dims()[1], wt.dims()[0]) } else { (wt.dims()[0], wt.dims()[1]) };
    if a_dims[a_dims.len() - 1] != k {
        return None;
    }
    let w_scales = constant(graph, sw)?.to_f64s();
    let column_axis = if trans_b { [0, -2] } else { [1, -1] };
    if w_scales.len() != 1 && !(w_scales.len() == m && column_axis.contains(&w_axis)) {
        return None;
    }
    zero_or_absent(graph, zw)?;
    let bias = match bias {
        None => None,
        Some(bd) => Some(quantized_bias(graph, bd, m, a_scale, &w_scales)?),
    };
    let values = wt.to_f64s();
    let weights: Vec<f64> = (0..m * k)
        .map(|i| {
            let (row, col) = (i / k, i % k);
            if trans_b {
                values[row * k + col]
            } else {
                values[col * m + row]
            }
        })
        .collect();
    let out = graph.value_type(real).shape.as_fixed()?;
    Some(Product {
        a,
        a_scale: sa,
        a_zero: za,
        weights: Tensor::from_f64s(DType::I8, &[m, k, 1, 1], &weights).ok()?,
        w_scale: sw,
        w_zero: zw,
        y_scale: sy,
        y_zero: zy,
        bias,
        rows: a_dims[..a_dims.len() - 1].iter().product(),
        k,
        out,
        range,
    })
}

/// A residual Add between quantized tensors, found by `integer_add`: its operands' bytes, their
/// and the result's scales and zero points (f32), and the result's type.
struct QuantizedAdd {
    a: ValueId,
    b: ValueId,
    /// (scale, zero point) of a, b and the result.
    qa: (f32, f32),
    qb: (f32, f32),
    qc: (f32, f32),
    dtype: DType,
}

/// The most operand pairs `QuantizedAdd::build` corrects one by one; past it the Add stays ONNX's
/// float arithmetic (a test on every element costs more than the rare step it saves).
const MAX_CORRECTIONS: usize = 4;

/// QuantizeLinear `q` of an Add (read by it alone) of two DequantizeLinears, all three of the same
/// 8-bit type with one constant f32 scale and zero point each.
fn integer_add(graph: &Graph, q: NodeId) -> Option<QuantizedAdd> {
    let Quantized { real, sy, zy, range } = quantized(graph, q)?;
    if range.is_some() || graph.try_node(real.node)?.op != Op::Binary(kiln_ir::BinaryOp::Add) {
        return None;
    }
    let dtype = graph.value_type(ValueId::from(q)).dtype;
    let ops = graph.operands(real.node);
    let operand = |i: usize| -> Option<(ValueId, (f32, f32))> {
        let (x, s, z, _) = dequantized(graph, ops.get(i).copied().flatten()?)?;
        let scale = activation_scale(graph, x, s, z)?;
        let zero = if z.is_some() { scalar(graph, z)? } else { 0.0 };
        (graph.value_type(x).dtype == dtype && scale > 0.0)
            .then_some((x, (scale as f32, zero as f32)))
    };
    let ((a, qa), (b, qb)) = (operand(0)?, operand(1)?);
    if graph.value_type(sy).dtype != DType::F32 {
        return None;
    }
    let qc = (scalar(graph, Some(sy))? as f32, scalar(graph, Some(zy))? as f32);
    Some(QuantizedAdd { a, b, qa, qb, qc, dtype })
}

impl QuantizedAdd {
    /// onnxruntime's QLinearAdd (MLAS's AVX2 kernel, what its optimizer makes of this
    /// pattern): the ratios of the scales and the zero points folded into one constant, then
    /// two fused multiply-adds in f32, rounded half to even, saturated.
    fn onnxruntime(&self, a: f32, b: f32) -> f32 {
        let (ra, rb) = (self.qa.0 / self.qc.0, self.qb.0 / self.qc.0);
        let fixed = self.qc.1 - ra.mul_add(self.qa.1, rb * self.qb.1);
        self.saturate(a.mul_add(ra, b.mul_add(rb, fixed)).round_ties_even())
    }

    /// ONNX's float form, as `build` computes it: `round(((a - za) sa + (b - zb) sb) / sc) + zc`.
    fn float_form(&self, a: f32, b: f32) -> f32 {
        let sum = (a - self.qa.1) * self.qa.0 + (b - self.qb.1) * self.qb.0;
        self.saturate((sum / self.qc.0).round_ties_even() + self.qc.1)
    }

    fn saturate(&self, v: f32) -> f32 {
        let (lo, hi) = kiln_ir::eval::quantized_range(self.dtype);
        v.clamp(lo as f32, hi as f32)
    }

    /// The operand pairs (a, b) whose results the two forms round apart, with onnxruntime's.
    fn corrections(&self) -> Vec<(f32, f32, f32)> {
        let (lo, hi) = kiln_ir::eval::quantized_range(self.dtype);
        let values = || (lo as i32..=hi as i32).map(|v| v as f32);
        values()
            .flat_map(|a| values().map(move |b| (a, b)))
            .filter_map(|(a, b)| {
                let want = self.onnxruntime(a, b);
                (self.float_form(a, b) != want).then_some((a, b, want))
            })
            .collect()
    }

    /// `float_form` as elementwise ops, each of `corrections` then selected where both operands
    /// are its pair; `None` where there are more than `MAX_CORRECTIONS`. The operands' casts
    /// are repeated for each reader: fusion makes one kernel of an elementwise tree, not of
    /// values with several readers (LLVM merges the repeats inside the kernel).
    fn build(&self, graph: &mut Graph, name: &str) -> Result<Option<ValueId>> {
        use kiln_ir::BinaryOp::{Add, And, Div, Equal, Mul, Sub};
        let corrections = self.corrections();
        if corrections.len() > MAX_CORRECTIONS {
            return Ok(None);
        }
        let mut g = Emitter { graph, name };
        let centred = |g: &mut Emitter, x: ValueId, (scale, zero): (f32, f32)| -> Result<ValueId> {
            let x = g.cast(x, DType::F32)?;
            let zero = g.constant(zero)?;
            let x = g.binary(Sub, x, zero)?;
            let scale = g.constant(scale)?;
            g.binary(Mul, x, scale)
        };
        let a = centred(&mut g, self.a, self.qa)?;
        let b = centred(&mut g, self.b, self.qb)?;
        let sum = g.binary(Add, a, b)?;
        let scale = g.constant(self.qc.0)?;
        let v = g.binary(Div, sum, scale)?;
        let v = g.node(Op::Unary(kiln_ir::UnaryOp::Round), &[v])?;
        let zero = g.constant(self.qc.1)?;
        let mut v = g.binary(Add, v, zero)?;
        for (pa, pb, want) in corrections {
            let is = |g: &mut Emitter, x: ValueId, value: f32| -> Result<ValueId> {
                let x = g.cast(x, DType::F32)?;
                let value = g.constant(value)?;
                g.binary(Equal, x, value)
            };
            let (ea, eb) = (is(&mut g, self.a, pa)?, is(&mut g, self.b, pb)?);
            let both = g.binary(And, ea, eb)?;
            let want = g.constant(want)?;
            v = g.node(Op::Where, &[both, want, v])?;
        }
        let (lo, hi) = kiln_ir::eval::quantized_range(self.dtype);
        let (lo, hi) = (g.constant(lo as f32)?, g.constant(hi as f32)?);
        let v = g.node(Op::Clip, &[v, lo, hi])?;
        Ok(Some(g.cast(v, self.dtype)?))
    }
}

/// Adds elementwise nodes and f32 scalar constants named under `name`.
struct Emitter<'a> {
    graph: &'a mut Graph,
    name: &'a str,
}

impl Emitter<'_> {
    fn node(&mut self, op: Op, operands: &[ValueId]) -> Result<ValueId> {
        let operands: Vec<Option<ValueId>> = operands.iter().copied().map(Some).collect();
        let name = self.graph.unique_name(&format!("{}/{}", self.name, op.name()));
        Ok(ValueId::from(self.graph.add_node(&name, op, &operands)?))
    }

    fn binary(&mut self, b: kiln_ir::BinaryOp, l: ValueId, r: ValueId) -> Result<ValueId> {
        self.node(Op::Binary(b), &[l, r])
    }

    fn cast(&mut self, x: ValueId, to: DType) -> Result<ValueId> {
        self.node(Op::Cast { to, saturate: true }, &[x])
    }

    fn constant(&mut self, v: f32) -> Result<ValueId> {
        let t = Tensor::from_f64s(DType::F32, &[], &[v as f64])?;
        let name = self.graph.unique_name(&format!("{}/constant", self.name));
        Ok(self.graph.add_constant(&name, t)?)
    }
}

/// A bias `DequantizeLinear(b)` of int32 `[m]` with zero point 0 and scale `x_scale * w_scale`
/// (per channel where the weights' is), as the quantizer writes it: `b`.
fn quantized_bias(
    graph: &Graph,
    bd: ValueId,
    m: usize,
    x_scale: f64,
    w_scales: &[f64],
) -> Option<ValueId> {
    let (b, sb, zb, _) = dequantized(graph, bd)?;
    let bt = constant(graph, b)?;
    if bt.dtype() != DType::I32 || bt.dims() != [m] {
        return None;
    }
    zero_or_absent(graph, zb)?;
    let sb = constant(graph, sb)?.to_f64s();
    if sb.len() != 1 && sb.len() != m {
        return None;
    }
    let at = |v: &[f64], i: usize| v[if v.len() == 1 { 0 } else { i }];
    let agrees = (0..m).all(|i| {
        let want = x_scale * at(w_scales, i);
        (at(&sb, i) - want).abs() <= 1e-6 * want.abs()
    });
    agrees.then_some(b)
}
