//! kiln's int8 CNN path rounds as onnxruntime does: a small QDQ network with mobilenet_v2's
//! parts (a pointwise expansion with ReLU6, a depthwise 3x3, a linear projection, the residual
//! Add, a mean over the plane and the classifier Gemm; u8 activations, s8 per-channel weights,
//! as onnxruntime's `quantize_static` writes them) against onnxruntime's integer arithmetic
//! computed here exactly: sums in integers, each QLinearConv's or QGemm's multiplier
//! `x_scale * w_scale / y_scale` formed in f32 one operation at a time, `f32(sum + bias) *
//! multiplier` rounded half to even, plus the zero point, saturated (MLAS's requantisation).
//! Every byte and the dequantized result must be equal, on the VNNI and the widening kernels, at
//! 1 and 2 threads.
//!
//! Some expansion channels' biases are chosen where the multiplier formed in f64 and rounded once
//! (what kiln did) rounds the other way: a step there is what grew to 8 steps at mobilenet_v2's
//! output. The Add is onnxruntime's QLinearAdd (fused multiply-adds; the next test tries it on
//! every pair of operands). The mean's input and result scales are powers of two, so that its
//! float sum is exact in any order and the test does not depend on a summation order.

use kiln_compiler::{Options, Stage};
use kiln_ir::builder::{ConvOptions, GraphBuilder, Traced};
use kiln_ir::{DType, Graph, Op, Tensor};
use kiln_runtime::LoadOptions;

use crate::integer::ints;

const C: usize = 8;
const E: usize = 16;
const HW: usize = 4;
const CLASSES: usize = 10;

/// The activations' scales and zero points, as calibration would give them (powers of two where
/// the mean reads and writes them, see the module's comment). With the input's, 37 / 1024, some
/// of the expansion's multipliers round differently in f32 and f64 at a sum that fits ReLU6.
const X: (f32, i64) = (37.0 / 1024.0, 128);
/// The expansion's result: scale 8/255, so ReLU6's upper bound is the byte 191, inside the range.
const EXPANDED: (f32, i64) = (8.0 / 255.0, 0);
const DEPTHWISE: (f32, i64) = (6.0 / 255.0, 0);
const PROJECTED: (f32, i64) = (0.0291, 131);
const ADDED: (f32, i64) = (1.0 / 16.0, 128);
const POOLED: (f32, i64) = (1.0 / 64.0, 128);
const LOGITS: (f32, i64) = (0.0173, 120);

/// onnxruntime's requantising multiplier (QLinearConv's output scale), in f32 step by step.
fn multiplier(x_scale: f32, w_scale: f32, y_scale: f32) -> f32 {
    x_scale * w_scale / y_scale
}

/// MLAS's requantisation of an int32 sum (the bias in it) to u8 within `[lo, hi]`.
fn requantise(sum: i64, multiplier: f32, zero: i64, lo: i64, hi: i64) -> i64 {
    ((sum as f32 * multiplier).round_ties_even() as i64 + zero).clamp(lo, hi)
}

/// The multiplier as kiln formed it before: in f64, rounded to f32 once.
fn multiplier_f64(x_scale: f32, w_scale: f32, y_scale: f32) -> f32 {
    (x_scale as f64 * w_scale as f64 / y_scale as f64) as f32
}

/// One quantized convolution's constants: s8 weights `[m, c/group, k, k]`, per-channel scales,
/// the int32 bias (in units of x_scale * w_scale).
struct Layer {
    w: Vec<i64>,
    scales: Vec<f32>,
    bias: Vec<i64>,
    m: usize,
    k: usize,
    group: usize,
}

impl Layer {
    fn new(m: usize, cg: usize, k: usize, group: usize, seed: u64) -> Layer {
        let w = ints(m * cg * k * k, -127, 127, seed).iter().map(|&v| v as i64).collect();
        let scales = ints(m, 1, 40, seed + 1).iter().map(|&v| (v * 0.0007) as f32).collect();
        let bias = ints(m, -2000, 2000, seed + 2).iter().map(|&v| v as i64).collect();
        Layer { w, scales, bias, m, k, group }
    }

    /// The integer sums `Σ (x - zx) w + bias` of a stride-1 convolution padded to keep the plane,
    /// NCHW with one image, padding holding the zero point.
    fn sums(&self, x: &[i64], c: usize, zx: i64) -> Vec<i64> {
        let (cg, mg, pad) = (c / self.group, self.m / self.group, (self.k / 2) as i64);
        let mut out = vec![0i64; self.m * HW * HW];
        for o in 0..self.m {
            let g = o / mg;
            for (p, sum) in out[o * HW * HW..(o + 1) * HW * HW].iter_mut().enumerate() {
                let (oh, ow) = ((p / HW) as i64, (p % HW) as i64);
                let mut acc = self.bias[o];
                for ci in 0..cg {
                    for t in 0..self.k * self.k {
                        let (ih, iw) =
                            (oh + (t / self.k) as i64 - pad, ow + (t % self.k) as i64 - pad);
                        if !(0..HW as i64).contains(&ih) || !(0..HW as i64).contains(&iw) {
                            continue;
                        }
                        let xv = x[((g * cg + ci) * HW + ih as usize) * HW + iw as usize] - zx;
                        acc += xv * self.w[((o * cg + ci) * self.k * self.k) + t];
                    }
                }
                *sum = acc;
            }
        }
        out
    }

    /// onnxruntime's result of the layer on `x` (u8 of `from`) into `to`, clamped to `[lo, hi]`.
    fn run(&self, x: &[i64], c: usize, from: (f32, i64), to: (f32, i64), hi: i64) -> Vec<i64> {
        let plane = HW * HW;
        self.sums(x, c, from.1)
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                let m = multiplier(from.0, self.scales[i / plane], to.0);
                requantise(s, m, to.1, 0, hi)
            })
            .collect()
    }

    /// The QDQ form: DequantizeLinear of the weights (of `dims`, scales along axis 0) and of
    /// the bias.
    fn dequantized<'g>(
        &self,
        g: &'g GraphBuilder,
        name: &str,
        dims: &[usize],
        x_scale: f32,
    ) -> (Traced<'g>, Traced<'g>) {
        let f = |v: &[i64]| v.iter().map(|&v| v as f64).collect::<Vec<_>>();
        let wq = g.constant(&format!("{name}.w"), tensor(DType::I8, dims, f(&self.w)));
        let sw = g.constant(&format!("{name}.sw"), floats(&self.scales));
        let zw = g.constant(&format!("{name}.zw"), tensor(DType::I8, &[self.m], vec![0.0; self.m]));
        let bq = g.constant(&format!("{name}.b"), tensor(DType::I32, &[self.m], f(&self.bias)));
        let bias_scales: Vec<f32> = self.scales.iter().map(|&s| x_scale * s).collect();
        let sb = g.constant(&format!("{name}.sb"), floats(&bias_scales));
        (dequantize(g, wq, sw, Some(zw), 0), dequantize(g, bq, sb, None, 0))
    }
}

fn tensor(d: DType, dims: &[usize], v: Vec<f64>) -> Tensor {
    Tensor::from_f64s(d, dims, &v).unwrap()
}

fn floats(v: &[f32]) -> Tensor {
    tensor(DType::F32, &[v.len()], v.iter().map(|&s| s as f64).collect())
}

fn dequantize<'g>(
    g: &'g GraphBuilder,
    v: Traced<'g>,
    s: Traced<'g>,
    z: Option<Traced<'g>>,
    axis: i64,
) -> Traced<'g> {
    g.apply(Op::Dequantize { axis, block_size: 0 }, &[Some(v), Some(s), z], 1)[0]
}

/// DequantizeLinear / QuantizeLinear with one scale and zero point of `q`.
fn dq<'g>(g: &'g GraphBuilder, v: Traced<'g>, q: (f32, i64)) -> Traced<'g> {
    let s = g.anon_constant(Tensor::scalar(q.0));
    let z = g.anon_constant(tensor(DType::U8, &[], vec![q.1 as f64]));
    dequantize(g, v, s, Some(z), 1)
}

fn quantize<'g>(g: &'g GraphBuilder, v: Traced<'g>, q: (f32, i64)) -> Traced<'g> {
    let s = g.anon_constant(Tensor::scalar(q.0));
    let z = g.anon_constant(tensor(DType::U8, &[], vec![q.1 as f64]));
    g.apply(
        Op::Quantize { axis: 1, block_size: 0, dtype: None, saturate: true },
        &[Some(v), Some(s), Some(z)],
        1,
    )[0]
}

struct Net {
    expand: Layer,
    depthwise: Layer,
    project: Layer,
    classifier: Layer,
}

impl Net {
    fn new() -> Net {
        let mut expand = Layer::new(E, C, 1, 1, 3);
        choose_tie_biases(&mut expand);
        Net {
            expand,
            depthwise: Layer::new(E, 1, 3, E, 7),
            project: Layer::new(C, E, 1, 1, 11),
            classifier: Layer::new(CLASSES, C, 1, 1, 13),
        }
    }

    /// The graph: x -> expand (1x1, ReLU6 as a Clip before its QuantizeLinear) -> depthwise 3x3 ->
    /// project (1x1) -> x + that -> mean over the plane -> Gemm; every intermediate byte tensor
    /// and the dequantized logits are outputs.
    fn graph(&self) -> Graph {
        let g = GraphBuilder::new("qdq_mobilenet_block");
        let x = g.input("x", DType::U8, [1, C, HW, HW]);
        let conv = |v, layer: &Layer, name: &str, from: (f32, i64)| {
            let cg = layer.w.len() / (layer.m * layer.k * layer.k);
            let (w, b) = layer.dequantized(&g, name, &[layer.m, cg, layer.k, layer.k], from.0);
            let o = ConvOptions { stride: 1, pad: layer.k / 2, dilation: 1, group: layer.group };
            dq(&g, v, from).conv(w, Some(b), o)
        };
        let expanded = quantize(&g, conv(x, &self.expand, "expand", X).clip(0.0, 6.0), EXPANDED);
        let depthwise =
            quantize(&g, conv(expanded, &self.depthwise, "depthwise", EXPANDED), DEPTHWISE);
        let projected =
            quantize(&g, conv(depthwise, &self.project, "project", DEPTHWISE), PROJECTED);
        let added = quantize(&g, dq(&g, x, X).add(dq(&g, projected, PROJECTED)), ADDED);
        let mean = dq(&g, added, ADDED).reduce_mean(&[2, 3], true).reshape(&[1, C as i64]);
        let pooled = quantize(&g, mean, POOLED);
        let (w, b) = self.classifier.dequantized(&g, "classifier", &[CLASSES, C], POOLED.0);
        let gemm = kiln_ir::op::Gemm { trans_b: true, ..Default::default() };
        let logits =
            g.apply(Op::Gemm(gemm), &[Some(dq(&g, pooled, POOLED)), Some(w), Some(b)], 1)[0];
        let logits = dq(&g, quantize(&g, logits, LOGITS), LOGITS);
        for (name, v) in [
            ("expanded", expanded),
            ("depthwise", depthwise),
            ("projected", projected),
            ("added", added),
            ("pooled", pooled),
            ("logits", logits),
        ] {
            g.output(name, v);
        }
        g.build().unwrap()
    }

    /// onnxruntime's arithmetic on `x`: each output as `graph` lists them.
    fn reference(&self, x: &[i64]) -> Vec<Vec<f64>> {
        let relu6 = (6.0f32 / EXPANDED.0).round_ties_even() as i64 + EXPANDED.1;
        let expanded = self.expand.run(x, C, X, EXPANDED, relu6);
        let depthwise = self.depthwise.run(&expanded, E, EXPANDED, DEPTHWISE, 255);
        let projected = self.project.run(&depthwise, E, DEPTHWISE, PROJECTED, 255);
        let added: Vec<i64> = x.iter().zip(&projected).map(|(&a, &b)| qlinear_add(a, b)).collect();
        let pooled: Vec<i64> = added
            .chunks(HW * HW)
            .map(|plane| {
                let sum: f32 = plane.iter().map(|&v| (v - ADDED.1) as f32 * ADDED.0).sum();
                let mean = sum / (HW * HW) as f32;
                ((mean / POOLED.0).round_ties_even() as i64 + POOLED.1).clamp(0, 255)
            })
            .collect();
        let logits: Vec<f64> = (0..CLASSES)
            .map(|o| {
                let w = &self.classifier.w[o * C..(o + 1) * C];
                let sum: i64 = self.classifier.bias[o]
                    + pooled.iter().zip(w).map(|(&a, &w)| (a - POOLED.1) * w).sum::<i64>();
                let m = multiplier(POOLED.0, self.classifier.scales[o], LOGITS.0);
                let q = requantise(sum, m, LOGITS.1, 0, 255);
                ((q - LOGITS.1) as f32 * LOGITS.0) as f64
            })
            .collect();
        let f = |v: Vec<i64>| v.into_iter().map(|v| v as f64).collect();
        vec![f(expanded), f(depthwise), f(projected), f(added), f(pooled), logits]
    }
}

/// onnxruntime's QLinearAdd of u8 `a` (X) and `b` (PROJECTED) into ADDED.
fn qlinear_add(a: i64, b: i64) -> i64 {
    qlinear_add_of(&[X, PROJECTED, ADDED], a, b)
}

/// Gives the expansion's channels whose f32 multiplier differs from the f64 one a bias where
/// the two round a sum apart (the input's first row is the zero point, so there the sum is the
/// bias alone), inside ReLU6's range. Asserts that there are such channels, so that the test
/// tells the two apart.
fn choose_tie_biases(layer: &mut Layer) {
    let mut chosen = 0;
    for o in 0..layer.m {
        let (m32, m64) = (
            multiplier(X.0, layer.scales[o], EXPANDED.0),
            multiplier_f64(X.0, layer.scales[o], EXPANDED.0),
        );
        if m32 == m64 {
            continue;
        }
        let apart = |b: &i64| {
            let (p, q) = (requantise(*b, m32, 0, 0, 255), requantise(*b, m64, 0, 0, 255));
            p != q && (1..190).contains(&p)
        };
        if let Some(b) = (1..1_000_000i64).find(apart) {
            layer.bias[o] = b;
            chosen += 1;
        }
    }
    assert!(chosen >= 2, "only {chosen} expansion channels round apart in f32 and f64");
}

/// The input: the first row of every channel the zero point (where the expansion's sums are its
/// biases), the rest spread over the bytes.
fn input() -> Vec<i64> {
    let v = ints(C * HW * HW, 0, 255, 5);
    (0..C * HW * HW).map(|i| if (i / HW).is_multiple_of(HW) { X.1 } else { v[i] as i64 }).collect()
}

#[test]
fn a_quantized_mobilenet_block_rounds_as_onnxruntime_does() {
    let net = Net::new();
    let graph = net.graph();
    let x = input();
    let want = net.reference(&x);
    let xt = tensor(DType::U8, &[1, C, HW, HW], x.iter().map(|&v| v as f64).collect());
    // The reference must not be trivial: the expansion and the Add span the bytes.
    for (i, name) in [(0, "expanded"), (3, "added")] {
        let distinct: std::collections::BTreeSet<i64> = want[i].iter().map(|&v| v as i64).collect();
        assert!(distinct.len() > 20, "{name}: only {} distinct values", distinct.len());
    }
    for (vnni, threads) in [(true, 2), (false, 1)] {
        let options = Options { cache: false, vnni, ..Options::default() };
        let schedule = kiln_compiler::driver::emit(&graph, Stage::Schedule, &options).unwrap();
        for kernel in ["integer conv", "integer depthwise conv", "integer matrix product"] {
            assert!(
                schedule.contains(&format!("microkernel: {kernel}")),
                "no {kernel}:\n{schedule}"
            );
        }
        let exe = kiln_compiler::jit(
            &graph,
            &options,
            &LoadOptions { threads: Some(threads), ..Default::default() },
        )
        .unwrap_or_else(|e| panic!("compile failed: {e}"));
        let got = exe.run(std::slice::from_ref(&xt)).unwrap();
        let names = ["expanded", "depthwise", "projected", "added", "pooled", "logits"];
        for ((name, got), want) in names.iter().zip(&got).zip(&want) {
            let got = got.to_f64s();
            let off: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
            assert!(
                off.is_empty(),
                "{name} (vnni {vnni}, {threads} threads): {} of {} differ from onnxruntime's arithmetic, first at {}: {} against {}",
                off.len(),
                got.len(),
                off[0],
                got[off[0]],
                want[off[0]]
            );
        }
    }
}

/// (scale, zero point) of a, b and the result of three of mobilenet_v2's residual Adds as
/// onnxruntime's quantizer calibrated them (`add_1`, `add_6`, `add_8`): ONNX's float form rounds
/// one or two of their 65536 operand pairs apart from onnxruntime's QLinearAdd.
const ADDS: [[(f32, i64); 3]; 3] = [
    [(0.039219916, 125), (0.040052, 130), (0.058004223, 111)],
    [(0.035400078, 125), (0.03871004, 119), (0.053303294, 126)],
    [(0.03542502, 132), (0.037332162, 126), (0.04993159, 138)],
];

/// onnxruntime's QLinearAdd of u8 `a` and `b` (MLAS's AVX2 kernel): the scale ratios and zero
/// points folded into one constant, two fused multiply-adds, rounded half to even, saturated.
fn qlinear_add_of(q: &[(f32, i64); 3], a: i64, b: i64) -> i64 {
    let [(sa, za), (sb, zb), (sc, zc)] = *q;
    let (ra, rb) = (sa / sc, sb / sc);
    let fixed = zc as f32 - ra.mul_add(za as f32, rb * zb as f32);
    let v = (a as f32).mul_add(ra, (b as f32).mul_add(rb, fixed));
    (v.round_ties_even() as i64).clamp(0, 255)
}

/// ONNX's QuantizeLinear(DequantizeLinear(a) + DequantizeLinear(b)) in f32.
fn float_add_of(q: &[(f32, i64); 3], a: i64, b: i64) -> i64 {
    let [(sa, za), (sb, zb), (sc, zc)] = *q;
    let sum = (a - za) as f32 * sa + (b - zb) as f32 * sb;
    ((sum / sc).round_ties_even() as i64 + zc).clamp(0, 255)
}

/// A residual Add in QDQ form gives onnxruntime's bytes for every pair of operands, where ONNX's
/// float arithmetic rounds some pairs the other way (the `integer` pass corrects those pairs).
#[test]
fn a_quantized_add_rounds_every_pair_as_onnxruntime_does() {
    let n = 256 * 256;
    let a: Vec<i64> = (0..n as i64).map(|i| i / 256).collect();
    let b: Vec<i64> = (0..n as i64).map(|i| i % 256).collect();
    let bytes = |v: &[i64]| tensor(DType::U8, &[n], v.iter().map(|&v| v as f64).collect());
    for q in &ADDS {
        let g = GraphBuilder::new("qdq_add");
        let (x, y) = (g.input("a", DType::U8, [n]), g.input("b", DType::U8, [n]));
        let sum = quantize(&g, dq(&g, x, q[0]).add(dq(&g, y, q[1])), q[2]);
        g.output("c", sum);
        let graph = g.build().unwrap();
        let want: Vec<f64> = (0..n).map(|i| qlinear_add_of(q, a[i], b[i]) as f64).collect();
        let apart = (0..n).filter(|&i| float_add_of(q, a[i], b[i]) as f64 != want[i]).count();
        assert!(
            apart > 0,
            "{q:?}: the float form rounds as onnxruntime does: the case tells nothing"
        );
        let options = Options { cache: false, ..Options::default() };
        let exe = kiln_compiler::jit(
            &graph,
            &options,
            &LoadOptions { threads: Some(2), ..Default::default() },
        )
        .unwrap_or_else(|e| panic!("compile failed: {e}"));
        let got = exe.run(&[bytes(&a), bytes(&b)]).unwrap().remove(0).to_f64s();
        let off: Vec<usize> = (0..n).filter(|&i| got[i] != want[i]).collect();
        assert!(
            off.is_empty(),
            "{q:?}: {} pairs differ from onnxruntime's QLinearAdd, first (a {}, b {}): {} against {}",
            off.len(),
            a[off[0]],
            b[off[0]],
            got[off[0]],
            want[off[0]]
        );
    }
}
