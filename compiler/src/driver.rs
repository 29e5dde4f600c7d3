//! The driver: `compile(&Graph, &Options) -> Compiled` runs every stage in order (specialise,
//! graph passes, fusion, codegen and the target pipeline, artifact assembly), times each, keeps
//! each stage's text when asked, and caches artifacts by content; `jit` compiles and loads.

use std::time::{Duration, Instant};

use kiln_ir::{text, Graph, Op};
use kiln_runtime::artifact::Artifact;
use kiln_runtime::{Executable, LoadOptions};

use crate::backend;
use crate::options::Options;
use crate::stage::{Stage, Stages};
use crate::{artifact, cache, fuse, passes, CompileError, Result};

/// A compiled model.
pub struct Compiled {
    pub artifact: Artifact,
    pub stages: Stages,
    /// (stage, time) in order.
    pub timings: Vec<(&'static str, Duration)>,
    pub from_cache: bool,
}

/// What a long compile reports as it goes (for a progress bar).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// The graph is partitioned into this many kernels; code generation starts.
    Kernels(usize),
    /// This many kernels have their code.
    KernelsDone(usize),
    /// Whole-program work after the kernels (LLVM optimisation and emission, PTX or SPIR-V).
    Finishing,
}

/// Compiles a graph. `keep_stages` keeps every stage's text (for `emit` and `--dump-dir`).
pub fn compile(graph: &Graph, options: &Options, keep_stages: bool) -> Result<Compiled> {
    compile_reporting(graph, options, keep_stages, &|_| {})
}

/// [`compile`], telling `progress` how far it is.
pub fn compile_reporting(
    graph: &Graph,
    options: &Options,
    keep_stages: bool,
    progress: &dyn Fn(Progress),
) -> Result<Compiled> {
    let backend = backend::for_options(options)?;
    compile_on(graph, options, &*backend, keep_stages, progress)
}

/// [`compile_reporting`] by `backend`, whatever `options.target` says: every stage asks the
/// backend (its rules for the passes, fusion's views and the stage names, itself for the
/// kernels' code), so a target the compiler does not list compiles through the same driver (a
/// test builds one). The options' remaining settings (shapes, bound values, batch, padding,
/// cache) apply as for any target; the cache keys the compile by the backend's name.
pub fn compile_on(
    graph: &Graph,
    options: &Options,
    backend: &dyn backend::Backend,
    keep_stages: bool,
    progress: &dyn Fn(Progress),
) -> Result<Compiled> {
    // In place: one static CPU program (the runtime binds state there only).
    if let Some((input, output)) = options.in_place.first() {
        let refuse = |why: &str| {
            Err(CompileError::InPlace {
                input: input.clone(),
                output: output.clone(),
                why: why.to_string(),
            })
        };
        if options.target != crate::TargetKind::Cpu {
            return refuse(&format!(
                "state updated in place is the CPU's, not {}'s (run it with the outputs fed back)",
                options.target.name()
            ));
        }
        if options.pad.is_some() || !options.batch_ranges.is_empty() {
            return refuse("a padded symbol or a symbolic batch compiles several programs");
        }
    }
    if let Some((symbol, capacity)) = &options.pad {
        return compile_padded(graph, options, backend, symbol, *capacity, keep_stages, progress);
    }
    if let Some(plan) = crate::batch::plan(graph, options)? {
        if let Some((input, output)) = options.in_place.first() {
            return Err(CompileError::InPlace {
                input: input.clone(),
                output: output.clone(),
                why: "a symbolic batch compiles several programs".into(),
            });
        }
        return compile_batched(graph, options, backend, &plan, keep_stages, progress);
    }
    let mut timings = Vec::new();
    let mut clock = Instant::now();
    let mut lap = |name: &'static str, timings: &mut Vec<(&'static str, Duration)>| {
        timings.push((name, clock.elapsed()));
        clock = Instant::now();
    };
    let keep = keep_stages || options.dump_dir.is_some();
    let rules = backend.rules();
    let key = if options.cache && !keep && cache::limit()? > 0 {
        Some(cache::key_on(graph, options, rules.name()))
    } else {
        None
    };
    if let Some(hit) = key.as_ref().and_then(|k| cache::load(k)) {
        lap("cache", &mut timings);
        return Ok(Compiled {
            artifact: hit,
            stages: Stages::default(),
            timings,
            from_cache: true,
        });
    }
    let mut stages = Stages::default();
    let g = optimize_for(graph, options, rules)?;
    if let Some(split) = crate::control::split(&g)? {
        if let Some((input, output)) = options.in_place.first() {
            return Err(CompileError::InPlace {
                input: input.clone(),
                output: output.clone(),
                why: "the graph has run-time control flow, which compiles several programs".into(),
            });
        }
        let compiled = compile_control(&g, options, backend, &split, keep_stages, progress)?;
        if let Some(k) = &key {
            cache::store(k, &compiled.artifact);
        }
        return Ok(compiled);
    }
    if keep {
        stages.set(Stage::Graph, text::print(&g, text::Weights::Summary));
    }
    lap("passes", &mut timings);
    let in_place_inputs = in_place_inputs(&g, options);
    let partition = fuse::partition_in_place(&g, rules.views(), &in_place_inputs)?;
    let in_place = crate::inplace::plan(&g, &partition, &options.in_place)?;
    if keep {
        stages.set(Stage::Fused, fuse::print(&g, &partition));
    }
    lap("fuse", &mut timings);
    progress(Progress::Kernels(partition.kernels.len()));
    // When the kernels are done and the whole-program step starts: codegen's time splits there
    // (the timings and `--trace` show the two phases).
    let finishing = std::cell::Cell::new(None);
    let kernel_done = |n: usize| {
        progress(Progress::KernelsDone(n));
        if n == partition.kernels.len() {
            finishing.set(Some(Instant::now()));
            progress(Progress::Finishing);
        }
    };
    let code =
        backend.compile(&g, &partition.kernels, keep.then_some(&mut stages), &kernel_done)?;
    let finish = finishing.get().map(|at: Instant| at.elapsed());
    lap("codegen", &mut timings);
    if let (Some(finish), Some(codegen)) = (finish, timings.last_mut()) {
        codegen.1 = codegen.1.saturating_sub(finish);
        timings.push((rules.finish_phase(), finish));
    }
    let art = artifact::assemble(&g, &partition, code, &in_place)?;
    lap("artifact", &mut timings);
    if let Some(dir) = &options.dump_dir {
        dump(dir, &stages)?;
    }
    if let Some(k) = &key {
        cache::store(k, &art);
    }
    Ok(Compiled { artifact: art, stages, timings, from_cache: false })
}

/// A symbolic batch: one static program per planned batch size (each through the cache), in
/// one artifact. The stages kept are the largest program's; `--dump-dir` gets a folder per size.
fn compile_batched(
    graph: &Graph,
    options: &Options,
    backend: &dyn backend::Backend,
    plan: &crate::batch::BatchPlan,
    keep_stages: bool,
    progress: &dyn Fn(Progress),
) -> Result<Compiled> {
    let mut timings: Vec<(&'static str, Duration)> = Vec::new();
    let mut stages: Option<Stages> = None;
    let mut from_cache = true;
    let mut programs = Vec::with_capacity(plan.sizes.len());
    for &size in &plan.sizes {
        let mut o = plan.options_for(options, size);
        o.dump_dir = options.dump_dir.as_ref().map(|d| d.join(format!("batch-{size}")));
        let c = compile_on(graph, &o, backend, keep_stages, progress)?;
        add_timings(&mut timings, c.timings);
        from_cache &= c.from_cache;
        stages.get_or_insert(c.stages);
        programs.push((size, c.artifact));
    }
    let clock = Instant::now();
    let artifact = artifact::assemble_batched(plan, programs)?;
    timings.push(("batch artifact", clock.elapsed()));
    Ok(Compiled { artifact, stages: stages.unwrap_or_default(), timings, from_cache })
}

/// Run-time control flow: each program of the split compiled as a model of its own (through the
/// cache; an If inside one splits again), in one artifact with the split's steps. Each stage's
/// text is the programs' in order, each under a header; `--dump-dir` gets a folder per program.
fn compile_control(
    graph: &Graph,
    options: &Options,
    backend: &dyn backend::Backend,
    split: &crate::control::ControlSplit,
    keep_stages: bool,
    progress: &dyn Fn(Progress),
) -> Result<Compiled> {
    use kiln_runtime::artifact::{ControlDesc, TensorDesc, ValueDesc};
    let mut timings: Vec<(&'static str, Duration)> = Vec::new();
    let mut stages = Stages::default();
    stages.set(Stage::Graph, text::print(graph, text::Weights::Summary));
    stages.set(Stage::Fused, split.to_string());
    let mut from_cache = true;
    let mut programs = Vec::with_capacity(split.programs.len());
    for (i, (role, piece)) in split.programs.iter().enumerate() {
        let o = Options {
            dump_dir: options.dump_dir.as_ref().map(|d| d.join(format!("{i}-{}", role.name()))),
            ..program_options(options)
        };
        let c = compile_on(piece, &o, backend, keep_stages, progress)?;
        add_timings(&mut timings, c.timings);
        from_cache &= c.from_cache;
        let header =
            format!("// program {i}: {} of `{}` ({})\n", role.name(), split.node, piece.name);
        for (stage, text) in c.stages.iter().filter(|(s, _)| *s != Stage::Graph) {
            if !stages.get(stage).is_empty() {
                stages.push(stage, "\n");
            }
            stages.push(stage, &header);
            stages.push(stage, text);
        }
        programs.push(c.artifact);
    }
    let clock = Instant::now();
    let desc = |name: &str, ty: &kiln_ir::TensorType| TensorDesc {
        name: name.to_string(),
        dtype: ty.dtype.name().to_string(),
        dims: ty.shape.as_fixed().unwrap_or_default(),
        buffer: 0,
    };
    let inputs = graph
        .inputs()
        .iter()
        .map(|&id| desc(&graph.node(id).name, &graph.node(id).outputs[0]))
        .collect();
    let outputs =
        graph.outputs().iter().map(|(name, v)| desc(name, graph.value_type(*v))).collect();
    let values = split
        .values
        .iter()
        .map(|(name, ty)| ValueDesc {
            name: name.clone(),
            dtype: ty.dtype.name().to_string(),
            dims: ty.shape.as_fixed().unwrap_or_default(),
            dynamic: ty.shape.as_fixed().is_none(),
        })
        .collect();
    let artifact =
        artifact::assemble_control(&graph.name, inputs, outputs, programs, |programs| {
            ControlDesc {
                programs,
                values,
                steps: split.steps.clone(),
                outputs: split.outputs.clone(),
            }
        })?;
    timings.push(("control artifact", clock.elapsed()));
    Ok(Compiled { artifact, stages, timings, from_cache })
}

/// A padded symbol: the graph specialised with `symbol` at `capacity` and rewritten so nothing
/// reads the padding (`pad::plan` proves it or says which node reads it), compiled as one
/// program (through the cache), and described so the runtime pads and cuts (`Manifest::padded`).
/// The plan prints as the first part of the fused stage.
fn compile_padded(
    graph: &Graph,
    options: &Options,
    backend: &dyn backend::Backend,
    symbol: &str,
    capacity: usize,
    keep_stages: bool,
    progress: &dyn Fn(Progress),
) -> Result<Compiled> {
    let (plan, padded, o) = padded(graph, options, symbol, capacity)?;
    let mut c = compile_on(&padded, &o, backend, keep_stages, progress)?;
    if !c.stages.get(Stage::Fused).is_empty() {
        c.stages.set(Stage::Fused, format!("{plan}\n{}", c.stages.get(Stage::Fused)));
    }
    let clock = Instant::now();
    c.artifact = artifact::assemble_padded(&graph.name, &plan, capacity, c.artifact)?;
    c.timings.push(("padded artifact", clock.elapsed()));
    Ok(c)
}

/// The graph with `symbol` padded to `capacity` (`pad::plan` proves nothing reads the padding,
/// or says which node does), its plan, and the options that compile it as one static program.
fn padded(
    graph: &Graph,
    options: &Options,
    symbol: &str,
    capacity: usize,
) -> Result<(crate::pad::PadPlan, Graph, Options)> {
    use kiln_ir::Dim;
    let mut shapes = options.input_shapes.clone();
    for &id in graph.inputs() {
        let node = graph.node(id);
        if shapes.contains_key(&node.name) {
            continue;
        }
        let dims: Option<Vec<usize>> = node.outputs[0]
            .shape
            .dims()
            .iter()
            .map(|d| match d {
                Dim::Sym(s) if &**s == symbol => Some(capacity),
                d => d.fixed(),
            })
            .collect();
        if let Some(dims) = dims {
            shapes.insert(node.name.clone(), dims);
        }
    }
    let plan = crate::pad::plan(graph, symbol, &shapes).map_err(|why| {
        CompileError::Usage(format!(
            "`{symbol}` cannot be padded to a capacity: {why}; give its size with --input-shape"
        ))
    })?;
    let padded = crate::pad::apply(graph, &plan, &shapes)?;
    let o = Options { pad: None, input_shapes: Default::default(), ..options.clone() };
    Ok((plan, padded, o))
}

/// Adds a program's stage times to those of the programs compiled before it, stage by stage.
fn add_timings(into: &mut Vec<(&'static str, Duration)>, from: Vec<(&'static str, Duration)>) {
    for (name, t) in from {
        match into.iter_mut().find(|(n, _)| *n == name) {
            Some(e) => e.1 += t,
            None => into.push((name, t)),
        }
    }
}

/// The artifact's view of GPU code: one function per `gpu.func`, launches by function index.
/// The graph after specialisation and the graph passes.
pub(crate) fn optimize(graph: &Graph, options: &Options) -> Result<Graph> {
    optimize_for(graph, options, backend::rules(options.target))
}

/// [`optimize`] with `rules`' graph passes.
fn optimize_for(graph: &Graph, options: &Options, rules: &dyn backend::Rules) -> Result<Graph> {
    optimize_traced(graph, options, rules, &mut |_, _, _| {})
}

/// `optimize`, calling `after(stage, graph, changed)` after specialisation and each pass.
fn optimize_traced(
    graph: &Graph,
    options: &Options,
    rules: &dyn backend::Rules,
    after: &mut dyn FnMut(&str, &Graph, bool),
) -> Result<Graph> {
    use passes::specialize;
    let passes = passes::default_passes(rules);
    let mut g = graph.clone();
    specialize::specialize(&mut g, &options.input_shapes)?;
    after("specialize", &g, true);
    passes::run_passes(&mut g, &passes, &mut *after)?;
    // Shapes that only data-dependent ops (NonZero, Unique...) and what follows them leave
    // open: that part runs on the host (`control::host_tail`), the rest compiles.
    let host_part = |g: &Graph| -> Result<bool> {
        Ok(specialize::shape_inputs(g).is_empty() && crate::control::host_tail(g)?.is_some())
    };
    if specialize::has_dynamic_shapes(&g) && host_part(&g)? {
        passes::sequences::check_resolved(&g)?;
    } else if specialize::has_dynamic_shapes(&g) {
        // Shapes that depend on input values: bind those inputs when their values are known.
        let names: Vec<String> = specialize::shape_inputs(&g)
            .into_iter()
            .map(|i| g.node(g.inputs()[i]).name.clone())
            .collect();
        let bound: Vec<(String, kiln_ir::Tensor)> = names
            .iter()
            .filter_map(|n| options.input_values.get(n).map(|t| (n.clone(), t.clone())))
            .collect();
        if names.is_empty() {
            passes::sequences::check_resolved(&g)?;
        }
        if bound.len() < names.len() || names.is_empty() {
            let missing: Vec<&String> =
                names.iter().filter(|n| !options.input_values.contains_key(*n)).collect();
            let what = if missing.is_empty() {
                "the model's result shapes depend on values computed at run time".to_string()
            } else {
                format!(
                    "the result shapes depend on the values of {}",
                    missing.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
                )
            };
            return Err(CompileError::DynamicShapes(format!(
                "{what}; kiln compiles static shapes (run the model with `kiln run`, which binds input values, or give the shapes)"
            )));
        }
        specialize::bind_values(&mut g, &bound)?;
        after("bind-values", &g, true);
        passes::run_passes(&mut g, &passes, &mut *after)?;
        passes::sequences::check_resolved(&g)?;
        if specialize::has_dynamic_shapes(&g) && !host_part(&g)? {
            return Err(CompileError::DynamicShapes(
                "result shapes depend on data (NonZero, Compress...), which static compilation cannot express".into(),
            ));
        }
    } else {
        // Static shapes, but codegen may still need operands as constants (CumSum's axis, TopK's
        // k): bind those inputs when their values are given.
        let bound: Vec<(String, kiln_ir::Tensor)> = specialize::shape_inputs(&g)
            .into_iter()
            .map(|i| g.node(g.inputs()[i]).name.clone())
            .filter_map(|n| options.input_values.get(&n).map(|t| (n, t.clone())))
            .collect();
        if !bound.is_empty() {
            specialize::bind_values(&mut g, &bound)?;
            passes::run_passes(&mut g, &passes, |_, _, _| {})?;
        }
    }
    g.verify()?;
    refuse_storage_types(&g)?;
    Ok(g)
}

/// Compiled code converts the storage types (8- and 4-bit floats, 4- and 2-bit integers) only
/// in casts (QuantizeLinear and DequantizeLinear decompose into them): a value of one must come
/// from an input, a constant or a Cast, and go only to Casts and graph outputs. Anything else
/// (an Add on f8e5m2) is refused, naming the node.
fn refuse_storage_types(g: &Graph) -> Result<()> {
    // Strings run on the host (`control::host_tail`); one outside it would reach codegen, and a
    // program's string input (one nothing reads, or the graph has no host part) a buffer.
    let tail = crate::control::host_tail(g)?;
    for &id in g.inputs() {
        let ty = &g.node(id).outputs[0];
        if ty.dtype.is_string() && tail.is_none() && ty.shape.numel() != Some(0) {
            let node = g.node(id);
            return Err(CompileError::Strings { node: node.name.clone(), op: node.op.name() });
        }
    }
    if let Some(id) = g.nodes().map(|(id, _)| id).find(|&id| crate::control::holds_strings(g, id)) {
        if tail.as_ref().is_none_or(|tail| !tail.contains(&id)) {
            let node = g.node(id);
            return Err(CompileError::Strings { node: node.name.clone(), op: node.op.name() });
        }
    }
    let converts = |op: &Op| matches!(op, Op::Input | Op::Constant(_) | Op::Cast { .. });
    for (id, node) in g.nodes() {
        let storage_in = g
            .operands(id)
            .into_iter()
            .flatten()
            .map(|v| g.value_type(v).dtype)
            .find(|d| d.is_storage());
        let storage_out = node.outputs.iter().map(|t| t.dtype).find(|d| d.is_storage());
        let bad = match (storage_in, storage_out) {
            (Some(d), _) if !matches!(node.op, Op::Cast { .. }) => Some(d),
            (_, Some(d)) if !converts(&node.op) => Some(d),
            _ => None,
        };
        if let Some(dtype) = bad {
            return Err(CompileError::StorageType {
                node: node.name.clone(),
                op: node.op.name(),
                dtype,
            });
        }
    }
    Ok(())
}

/// The graph after specialisation and after each graph pass, in kiln's text form (a pass that
/// changed nothing is named without its graph).
pub fn pass_trace(graph: &Graph, options: &Options) -> Result<String> {
    let mut out = String::new();
    optimize_traced(graph, options, backend::rules(options.target), &mut |name, g, changed| {
        if changed {
            out.push_str(&format!("// after {name}\n{}\n", text::print(g, text::Weights::Summary)));
        } else {
            out.push_str(&format!("// after {name}: no change\n\n"));
        }
    })?;
    Ok(out)
}

/// One stage's text for `options.target`: what `kiln emit` prints. `passes`, `graph` and
/// `fused` stop before code generation, so a model kiln cannot compile still prints them; `mlir`
/// stops after codegen (no target pipeline, LLVM or linker).
pub fn emit(graph: &Graph, stage: Stage, options: &Options) -> Result<String> {
    let (options, _) = emitted_program(graph, options);
    let options = &options;
    let target = options.target;
    if !backend::stages_of(target).contains(&stage) {
        if stage == Stage::Llvm {
            return Err(CompileError::Usage(format!(
                "stage llvm: the {} target goes through SPIR-V, not LLVM IR; try stage lowered or spirv",
                target.name()
            )));
        }
        let theirs: Vec<&str> = backend::targets_having(stage).iter().map(|t| t.name()).collect();
        let theirs = theirs.join(" or ");
        return Err(CompileError::Usage(format!(
            "stage {stage} is the {theirs} target's code: compile for target {theirs}"
        )));
    }
    match stage {
        Stage::Passes => {
            let (g, o, plan) = emitted_graph(graph, options)?;
            Ok(format!(
                "{}{}",
                plan.map_or(String::new(), |p| format!("{p}\n")),
                pass_trace(&g, &o)?
            ))
        }
        Stage::Graph | Stage::Fused | Stage::Mlir => {
            let (g, o, plan) = emitted_graph(graph, options)?;
            let text = front(&g, &o, stage == Stage::Mlir)?.get(stage).to_string();
            Ok(match plan.filter(|_| stage == Stage::Fused) {
                Some(plan) => format!("{plan}\n{text}"),
                None => text,
            })
        }
        _ => Ok(compile(graph, options, true)?.stages.get(stage).to_string()),
    }
}

/// Which program `emit` shows a model's stages for, and the options that give it. A model of
/// one program (static sizes, or sizes given) is shown as it is (`None`); a symbolic batch by
/// its largest program, the one `kiln compile` makes first; a padded symbol (`Options::pad`) by
/// its one program, compiled at the capacity. The text says which, for people: without it a
/// batch-8 program would pass for the model.
pub fn emitted_program(graph: &Graph, options: &Options) -> (Options, Option<String>) {
    if let Some((symbol, capacity)) = &options.pad {
        let note = format!(
            "showing the one program for every `{symbol}` up to {capacity}: compiled at {symbol}={capacity}, the inputs zero-padded to it (the fused stage starts with the plan)"
        );
        return (options.clone(), Some(note));
    }
    // A model whose symbols are not a batch says why when its stage is made, not here.
    let Ok(Some(plan)) = crate::batch::plan(graph, options) else {
        return (options.clone(), None);
    };
    let largest = plan.sizes.first().copied().unwrap_or(1);
    let input = plan.shapes.iter().zip(&plan.inputs).find(|(_, &b)| b).map_or(
        String::new(),
        |((name, dims), _)| {
            let rest: Vec<String> = dims.iter().skip(1).map(|d| d.to_string()).collect();
            format!(
                " (--input-shape {name}={})",
                std::iter::once("N".to_string()).chain(rest).collect::<Vec<_>>().join(",")
            )
        },
    );
    let sizes: Vec<String> = plan.sizes.iter().map(|s| s.to_string()).collect();
    let note = format!(
        "`{}` is a symbolic batch: showing the program for {}={largest}, the largest of the programs an artifact holds (batch {}); give a batch size{input} for another",
        plan.symbol,
        plan.symbol,
        sizes.join(", ")
    );
    (plan.options_for(options, largest), Some(note))
}

/// The graph `emit` shows the early stages of: with a padded symbol the padded graph (and its
/// plan's text), compiled as one static program.
fn emitted_graph<'g>(
    graph: &'g Graph,
    options: &Options,
) -> Result<(std::borrow::Cow<'g, Graph>, Options, Option<String>)> {
    match &options.pad {
        None => Ok((std::borrow::Cow::Borrowed(graph), options.clone(), None)),
        Some((symbol, capacity)) => {
            let (plan, g, o) = padded(graph, options, symbol, *capacity)?;
            Ok((std::borrow::Cow::Owned(g), o, Some(plan.to_string())))
        }
    }
}

/// The options a program of a control-flow split compiles with: its inputs are fully typed and
/// the values bound already, so the whole graph's sizes and values do not apply.
fn program_options(options: &Options) -> Options {
    Options {
        input_shapes: Default::default(),
        input_values: Default::default(),
        batch_ranges: Default::default(),
        ..options.clone()
    }
}

/// The fused stage as a Graphviz digraph (`kiln emit --stage fused --format dot`): the kernels
/// and the buffers between them (`dot.rs`); a control-flow split draws each program in a box of
/// its own. `options` as `emit` takes them (see [`emitted_program`]).
pub fn fused_dot(graph: &Graph, options: &Options) -> Result<String> {
    let (options, _) = emitted_program(graph, options);
    let (g, o, _) = emitted_graph(graph, &options)?;
    Ok(crate::dot::digraph(&graph.name, &fused_dot_body(&g, &o, "")?))
}

/// One program's kernels and buffers, or each program's in a cluster when it splits at run-time
/// control flow (as `front` prints them).
fn fused_dot_body(graph: &Graph, options: &Options, prefix: &str) -> Result<String> {
    let g = optimize(graph, options)?;
    let Some(split) = crate::control::split(&g)? else {
        let in_place = in_place_inputs(&g, options);
        let partition =
            fuse::partition_in_place(&g, backend::rules(options.target).views(), &in_place)?;
        return Ok(crate::dot::fused_body(&g, &partition, prefix));
    };
    let mut out = String::new();
    for (i, (role, piece)) in split.programs.iter().enumerate() {
        let o = program_options(options);
        let id = format!("{prefix}p{i}_");
        let label = format!("program {i}: {} of `{}` ({})", role.name(), split.node, piece.name);
        out.push_str(&crate::dot::cluster(&id, &label, &fused_dot_body(piece, &o, &id)?));
    }
    Ok(out)
}

/// The stages up to fusion (the optimised graph and the fused kernels), and with `codegen` each
/// kernel's MLIR, for printing. A symbolic batch's MLIR is its largest program's.
pub fn front(graph: &Graph, options: &Options, codegen: bool) -> Result<Stages> {
    if let Some(plan) = crate::batch::plan(graph, options)?.filter(|_| codegen) {
        let largest = plan.sizes.iter().copied().max().unwrap_or(1);
        return front(graph, &plan.options_for(options, largest), codegen);
    }
    let g = optimize(graph, options)?;
    let mut stages = Stages::default();
    stages.set(Stage::Graph, text::print(&g, text::Weights::Summary));
    if let Some(split) = crate::control::split(&g)? {
        let mut fused = split.to_string();
        let mut mlir = String::new();
        for (i, (role, piece)) in split.programs.iter().enumerate() {
            let o = program_options(options);
            let header =
                format!("// program {i}: {} of `{}` ({})\n", role.name(), split.node, piece.name);
            let inner = front(piece, &o, codegen)?;
            fused.push_str(&format!("\n{header}{}", inner.get(Stage::Fused)));
            if codegen {
                mlir.push_str(&format!(
                    "{}{header}{}",
                    if mlir.is_empty() { "" } else { "\n" },
                    inner.get(Stage::Mlir)
                ));
            }
        }
        stages.set(Stage::Fused, fused);
        stages.set(Stage::Mlir, mlir);
        return Ok(stages);
    }
    let in_place = in_place_inputs(&g, options);
    let partition =
        fuse::partition_in_place(&g, backend::rules(options.target).views(), &in_place)?;
    stages.set(Stage::Fused, fuse::print(&g, &partition));
    if codegen {
        let backend = backend::for_options(options)?;
        stages.set(Stage::Mlir, backend.kernel_mlir(&g, &partition.kernels)?);
    }
    Ok(stages)
}

/// The inputs of `g` that `options.in_place` writes over (those it names; `inplace::plan` refuses
/// a name that is none).
fn in_place_inputs(g: &Graph, options: &Options) -> std::collections::HashSet<kiln_ir::ValueId> {
    g.inputs()
        .iter()
        .filter(|&&i| options.in_place.iter().any(|(name, _)| *name == g.node(i).name))
        .map(|&i| kiln_ir::ValueId::from(i))
        .collect()
}

/// Compiles a graph and loads it into an executable in this process.
pub fn jit(graph: &Graph, options: &Options, load: &LoadOptions) -> Result<Executable> {
    let compiled = compile(graph, options, false)?;
    Ok(Executable::load(compiled.artifact, load)?)
}

fn dump(dir: &std::path::Path, stages: &Stages) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| CompileError::File { path: dir.display().to_string(), msg: e.to_string() })?;
    for (stage, text) in stages.iter() {
        let Some(name) = stage.file_name() else { continue };
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|e| CompileError::File {
            path: p.display().to_string(),
            msg: e.to_string(),
        })?;
    }
    Ok(())
}
