//! Tile kernels: the GPU's microkernels. Where a fused kernel is one of the shapes they know
//! (a reduction, a row normalisation, a contraction), kiln builds its `gpu.func`s directly, op
//! by op, with the work spread as a hand-written CUDA kernel would spread it (warps and blocks
//! a row, register tiles, workgroup-memory staging, 128-bit loads), instead of scheduling the
//! kernel's linalg ops with transform scripts (`schedule.rs`), which stays the path for every
//! other kernel.
//!
//! Each shape is a module with the same three steps: `plan` (a pure function of the graph, the
//! kernel and the target: whether it applies and how the work is spread, which prints in
//! `--stage lowered` and is pinned by tests), `describe`, and `build` (its functions in the
//! device module and its launch plan). The fused elementwise tail (bias, activation, residual)
//! is applied as results are stored (`tail.rs`).

pub mod builder;
pub mod depthwise;
pub mod exchange;
pub mod gemm;
pub mod load;
pub mod mma;
pub mod reduce;
pub mod rows;
pub mod tail;

use kiln_ir::Graph;
use melior::ir::TypeLike;
use mlir_sys::{MlirBlock, MlirType};

use super::launch::{Arg, DeviceLaunch, LaunchPlan};
use crate::codegen::mlir::dtype_type;
use crate::fuse::Kernel;
use crate::{CompileError, Result};
use builder::{Flavor, KernelBuilder, V};

/// Threads a block, for every tile kernel but the contractions'.
pub const BLOCK: usize = 256;

/// The multiprocessors grids are sized for when the GPU is not known: the H100's and H200's 132.
pub const ASSUMED_SMS: usize = 132;

/// The arguments of one tile function: the fused kernel's buffers (inputs, then outputs), its
/// scratch buffers, its tail's constants.
pub struct Args {
    pub buffers: Vec<V>,
    pub output: V,
    pub scratch: Vec<V>,
    pub constants: Vec<V>,
}

/// What the tile kernels are planned for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileTarget {
    pub flavor: Flavor,
    /// Streaming multiprocessors (NVIDIA) or compute units the grids are sized for: the H100
    /// and H200 have 132. A kernel run on a smaller GPU only queues its blocks.
    pub sms: usize,
    /// NVIDIA's compute capability as a number (80: sm_80), 0 for OpenCL.
    pub sm: u32,
    /// The contractions' arithmetic.
    pub precision: crate::Precision,
    /// Contractions take the tensor-core path whatever the precision and target (tests: on
    /// OpenCL the matrix instruction is emulated).
    pub tensor_cores: bool,
}

impl TileTarget {
    /// The threads a launch moving real data (over 1 MB, or over 10 MFLOP) should have at least,
    /// so that every SM has work: 128 a multiprocessor.
    pub fn min_threads(&self) -> usize {
        self.sms * 128
    }
}

/// A kernel's tile plan.
#[derive(Clone, Debug)]
pub enum TilePlan {
    Gemm(Box<gemm::GemmPlan>),
    Depthwise(depthwise::DepthwisePlan),
    Reduce(reduce::ReducePlan),
    Rows(rows::RowsPlan),
}

impl TilePlan {
    /// The strategy's name, as `KILN_GPU_SCHEDULE` and the lowered stage spell it.
    pub fn name(&self) -> &'static str {
        match self {
            TilePlan::Gemm(_) => "tile gemm",
            TilePlan::Depthwise(_) => "tile depthwise",
            TilePlan::Reduce(_) => "tile reduce",
            TilePlan::Rows(_) => "tile rows",
        }
    }

    pub fn describe(&self, graph: &Graph) -> String {
        match self {
            TilePlan::Gemm(p) => p.describe(graph),
            TilePlan::Depthwise(p) => p.describe(graph),
            TilePlan::Reduce(p) => p.describe(graph),
            TilePlan::Rows(p) => p.describe(graph),
        }
    }

    /// The small constants its launches read (the tail's first, in `Source::Constant` order).
    fn constants(&self) -> Vec<kiln_ir::ValueId> {
        match self {
            TilePlan::Gemm(p) => p.constants(),
            TilePlan::Depthwise(p) => p.constants(),
            TilePlan::Reduce(p) => p.tail.constant_values(),
            TilePlan::Rows(p) => p.constants(),
        }
    }

    fn build(&self, cx: &mut BuildContext) -> Result<()> {
        match self {
            TilePlan::Gemm(p) => p.build(cx),
            TilePlan::Depthwise(p) => p.build(cx),
            TilePlan::Reduce(p) => p.build(cx),
            TilePlan::Rows(p) => p.build(cx),
        }
    }
}

/// The tile plan for `kernel`, when a tile kernel takes it.
pub fn plan(t: &TileTarget, graph: &Graph, kernel: &Kernel) -> Option<TilePlan> {
    gemm::plan(t, graph, kernel)
        .map(|p| TilePlan::Gemm(Box::new(p)))
        .or_else(|| depthwise::plan(t, graph, kernel).map(TilePlan::Depthwise))
        .or_else(|| reduce::plan(t, graph, kernel).map(TilePlan::Reduce))
        .or_else(|| rows::plan(t, graph, kernel).map(TilePlan::Rows))
}

/// Builds `plan`'s functions at the end of `device` (the `gpu.module`'s body); returns the
/// kernel's launch plan.
pub fn build(
    ctx: &melior::Context,
    device: MlirBlock,
    flavor: Flavor,
    graph: &Graph,
    kernel: &Kernel,
    plan: &TilePlan,
) -> Result<LaunchPlan> {
    let constants = plan.constants();
    let kb = KernelBuilder::at(ctx, device, flavor);
    let constant_types = constants
        .iter()
        .map(|&v| {
            let t = graph.value_type(v);
            let n = graph.constant_value(v).map_or(1, |c| c.len()).max(1);
            kb.buffer_t(n, dtype_type(ctx, t.dtype).to_raw())
        })
        .collect();
    let mut cx = BuildContext {
        ctx,
        device,
        flavor,
        graph,
        kernel,
        n_constants: constants.len(),
        constant_types,
        plan: LaunchPlan::default(),
    };
    cx.plan.constants = constants
        .iter()
        .map(|&v| graph.constant_value(v).expect("a constant").bytes().to_vec())
        .collect();
    plan.build(&mut cx)?;
    Ok(cx.plan)
}

/// What a launch tells the compiler and the profiles beyond its shape.
#[derive(Clone, Copy, Debug, Default)]
pub struct Hints {
    /// Blocks that should be resident on each multiprocessor at once (NVIDIA: the compiler keeps
    /// the registers a thread uses within what that allows).
    pub min_blocks: Option<u32>,
    /// Floating-point operations one launch does (profiles; 0: not counted).
    pub flops: u64,
}

/// What a tile kernel's `build` adds functions and launches through.
pub struct BuildContext<'c, 'g> {
    pub ctx: &'c melior::Context,
    device: MlirBlock,
    pub flavor: Flavor,
    pub graph: &'g Graph,
    pub kernel: &'g Kernel,
    n_constants: usize,
    constant_types: Vec<MlirType>,
    plan: LaunchPlan,
}

impl<'c, 'g> BuildContext<'c, 'g> {
    /// A temporary of `bytes` for the kernel's launches; returns its index.
    pub fn scratch(&mut self, bytes: usize) -> usize {
        self.plan.scratch.push(bytes.max(4) as u64);
        self.plan.scratch.len() - 1
    }

    /// Adds a function (named after the kernel and `suffix`) and its launch over `grid` blocks
    /// of `block` threads. It takes the kernel's buffers, the scratch buffers `scratch` (by
    /// index, each f32) and the tail's constants; `body` writes its code.
    pub fn launch(
        &mut self,
        suffix: &str,
        grid: [u32; 3],
        block: [u32; 3],
        scratch: &[usize],
        body: impl FnOnce(&KernelBuilder<'c>, &Args) -> Result<()>,
    ) -> Result<()> {
        self.launch_with(suffix, grid, block, scratch, Hints::default(), body)
    }

    /// `launch` with `hints`.
    pub fn launch_with(
        &mut self,
        suffix: &str,
        grid: [u32; 3],
        block: [u32; 3],
        scratch: &[usize],
        hints: Hints,
        body: impl FnOnce(&KernelBuilder<'c>, &Args) -> Result<()>,
    ) -> Result<()> {
        let Hints { min_blocks, flops } = hints;
        let (graph, kernel) = (self.graph, self.kernel);
        let name = format!("{}_tile_{suffix}", kernel.name);
        let kb = KernelBuilder::at(self.ctx, self.device, self.flavor);
        let values: Vec<_> = kernel.inputs.iter().chain(&kernel.outputs).copied().collect();
        let mut types: Vec<MlirType> = values
            .iter()
            .map(|&v| {
                let t = graph.value_type(v);
                let n = t.shape.as_fixed().map_or(1, |d| d.iter().product::<usize>()).max(1);
                kb.buffer_t(n, dtype_type(self.ctx, t.dtype).to_raw())
            })
            .collect();
        for &s in scratch {
            types.push(kb.buffer_t((self.plan.scratch[s] / 4) as usize, kb.f32_t()));
        }
        types.extend_from_slice(&self.constant_types);
        let n_buf = values.len();
        let n_scratch = scratch.len();
        let mut failed = None;
        let func = builder::kernel_func(
            self.ctx,
            self.device,
            self.flavor,
            &name,
            &types,
            block,
            |kb, params| {
                let args = Args {
                    buffers: params[..n_buf].to_vec(),
                    output: params[n_buf - 1],
                    scratch: params[n_buf..n_buf + n_scratch].to_vec(),
                    constants: params[n_buf + n_scratch..].to_vec(),
                };
                if let Err(e) = body(kb, &args) {
                    failed = Some(e);
                }
            },
        );
        if let Some(e) = failed {
            return Err(CompileError::in_kernel(kernel, "tile kernel", e.to_string()));
        }
        if let (Some(n), Flavor::Nvvm) = (min_blocks, self.flavor) {
            let a = melior::ir::attribute::IntegerAttribute::new(
                melior::ir::r#type::IntegerType::new(self.ctx, 32).into(),
                n as i64,
            );
            func.set_attr("nvvm.minctasm", melior::ir::attribute::AttributeLike::to_raw(&a));
        }
        let mut args: Vec<Arg> = (0..n_buf).map(Arg::Buffer).collect();
        args.extend(scratch.iter().map(|&s| Arg::Scratch(s)));
        args.extend((0..self.n_constants).map(Arg::Constant));
        // It writes the kernel's outputs and its scratch.
        let writes = (kernel.inputs.len()..n_buf + n_scratch).collect();
        // Every function takes all the kernel's buffers; the bytes it moves are those of the
        // arguments it uses.
        let entry = func.block(0).expect("a function body");
        let bytes = types
            .iter()
            .enumerate()
            .filter(|&(i, _)| {
                // SAFETY: argument `i` of the function's entry block.
                let arg = unsafe { mlir_sys::mlirBlockGetArgument(entry, i as isize) };
                !crate::backend::edit::users(arg).is_empty()
            })
            .map(|(_, &t)| {
                let n: usize =
                    crate::backend::edit::static_dims(t).map_or(0, |d| d.iter().product());
                (n * crate::backend::edit::element_bytes(t).unwrap_or(4)) as u64
            })
            .sum();
        self.plan.launches.push(DeviceLaunch {
            func: name,
            grid,
            block,
            args,
            writes,
            flops,
            bytes: Some(bytes),
        });
        Ok(())
    }
}
