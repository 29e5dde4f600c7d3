//! Depthwise convolutions (one group a channel, as MobileNets have): a thread an output, its
//! window's taps unrolled with the weights read once a tap (every thread of a channel reads the
//! same, so they come from cache), neighbouring threads on neighbouring output columns so input
//! rows are read together. A depthwise convolution does about one multiply-add a byte it moves:
//! it is bound by memory, not arithmetic, and the tile of a GEMM would only add copies.

use kiln_ir::{DType, Graph, Op, ValueId};

use super::builder::KernelBuilder;
use super::tail::{source_of, Source, Tail};
use super::{Args, BuildContext, TileTarget, BLOCK};
use crate::fuse::Kernel;

#[derive(Clone, Debug)]
pub struct DepthwisePlan {
    pub images: usize,
    pub channels: usize,
    /// Output channels a group (the depth multiplier).
    pub multiplier: usize,
    pub height: usize,
    pub width: usize,
    pub out: [usize; 2],
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub pad: [usize; 2],
    pub dilation: [usize; 2],
    pub input: usize,
    pub weight: usize,
    pub bias: Option<(ValueId, Source)>,
    pub tail: Tail,
}

pub fn plan(_t: &TileTarget, graph: &Graph, kernel: &Kernel) -> Option<DepthwisePlan> {
    let tail = Tail::of(graph, kernel)?;
    let root = tail.root;
    let Op::Conv(cv) = &graph.node(root).op else { return None };
    let operands = graph.operands(root);
    let (x, w) = (operands.first().copied().flatten()?, operands.get(1).copied().flatten()?);
    let (xt, wt) = (graph.value_type(x), graph.value_type(w));
    let (xd, wd) = (xt.shape.as_fixed()?, wt.shape.as_fixed()?);
    let b = operands.get(2).copied().flatten();
    let all_f32 = [Some(x), Some(w), b]
        .into_iter()
        .flatten()
        .all(|v| graph.value_type(v).dtype == DType::F32);
    if !all_f32 || xd.len() != 4 || wd.len() != 4 || cv.group < 2 || cv.group != xd[1] {
        return None;
    }
    if wd[1] != 1 || !wd[0].is_multiple_of(cv.group) || xd.iter().product::<usize>() == 0 {
        return None;
    }
    let axes: Vec<_> = (0..2)
        .map(|i| cv.window.resolve(i, xd[2 + i], wd[2 + i], false).ok())
        .collect::<Option<_>>()?;
    let mut constants = tail.constant_values().len();
    let bias = match b {
        Some(v) => Some((v, source_of(graph, kernel, v, &mut constants)?)),
        None => None,
    };
    Some(DepthwisePlan {
        images: xd[0],
        channels: xd[1],
        multiplier: wd[0] / cv.group,
        height: xd[2],
        width: xd[3],
        out: [axes[0].output, axes[1].output],
        kernel: [wd[2], wd[3]],
        stride: [axes[0].stride, axes[1].stride],
        pad: [axes[0].pad_begin, axes[1].pad_begin],
        dilation: [axes[0].dilation, axes[1].dilation],
        input: kernel.inputs.iter().position(|&v| v == x)?,
        weight: kernel.inputs.iter().position(|&v| v == w)?,
        bias,
        tail,
    })
}

impl DepthwisePlan {
    fn outputs(&self) -> usize {
        self.images * self.channels * self.multiplier * self.out[0] * self.out[1]
    }

    pub fn describe(&self, graph: &Graph) -> String {
        format!(
            "tile depthwise: Conv {}x{} /{} over {} channels of {}x{} ({} outputs, a thread each){}",
            self.kernel[0],
            self.kernel[1],
            self.stride[0],
            self.channels * self.multiplier,
            self.height,
            self.width,
            self.outputs(),
            self.tail.describe(graph)
        )
    }

    pub fn constants(&self) -> Vec<ValueId> {
        let mut out = self.tail.constant_values();
        if let Some((v, Source::Constant(_))) = self.bias {
            out.push(v);
        }
        out
    }

    pub fn build(&self, cx: &mut BuildContext) -> crate::Result<()> {
        let graph = cx.graph;
        let grid = [self.outputs().div_ceil(BLOCK) as u32, 1, 1];
        cx.launch("depthwise", grid, [BLOCK as u32, 1, 1], &[], |kb, a| self.kernel(kb, a, graph))
    }

    fn kernel(&self, kb: &KernelBuilder, a: &Args, graph: &Graph) -> crate::Result<()> {
        let total = self.outputs();
        let idx = kb.add(kb.mul_k(kb.block_id(0), BLOCK as i64), kb.thread_id(0));
        let valid = kb.lt_k(idx, total as i64);
        let mut result = Ok(());
        kb.when(valid, |kb| {
            let [oh, ow] = self.out;
            let co_all = self.channels * self.multiplier;
            let ox = kb.rem_k(idx, ow as i64);
            let t = kb.div_k(idx, ow as i64);
            let oy = kb.rem_k(t, oh as i64);
            let t = kb.div_k(t, oh as i64);
            let co = kb.rem_k(t, co_all as i64);
            let img = kb.div_k(t, co_all as i64);
            let ci = kb.div_k(co, self.multiplier as i64);
            let x = a.buffers[self.input];
            let w = a.buffers[self.weight];
            let plane = kb.mul_k(
                kb.add(kb.mul_k(img, self.channels as i64), ci),
                (self.height * self.width) as i64,
            );
            let taps = self.kernel[0] * self.kernel[1];
            let wbase = kb.mul_k(co, taps as i64);
            // Signed positions as unsigned: left of the image wraps past its end.
            let y0 = kb.sub(kb.mul_k(oy, self.stride[0] as i64), kb.index(self.pad[0] as i64));
            let x0 = kb.sub(kb.mul_k(ox, self.stride[1] as i64), kb.index(self.pad[1] as i64));
            let zero = kb.f32(0.0);
            let mut acc = match self.bias {
                Some((_, source)) => {
                    let mem = match source {
                        Source::Buffer(i) => a.buffers[i],
                        Source::Constant(i) => a.constants[i],
                    };
                    kb.load(mem, co)
                }
                None => zero,
            };
            for r in 0..self.kernel[0] {
                let y = kb.add_k(y0, (r * self.dilation[0]) as i64);
                let row_in = kb.lt_k(y, self.height as i64);
                let row = kb.add(plane, kb.mul_k(y, self.width as i64));
                for s in 0..self.kernel[1] {
                    let xx = kb.add_k(x0, (s * self.dilation[1]) as i64);
                    let inside = kb.and(row_in, kb.lt_k(xx, self.width as i64));
                    let v = kb.load_or(inside, x, kb.add(row, xx), zero);
                    let wv = kb.load(w, kb.add_k(wbase, (r * self.kernel[1] + s) as i64));
                    acc = kb.fma(v, wv, acc);
                }
            }
            let rank = self.tail.dims.len();
            result = self.tail.store(kb, graph, a, acc, &[(idx, 0, rank)]);
        });
        result
    }
}
