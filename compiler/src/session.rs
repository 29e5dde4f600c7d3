//! A model kept in process and compiled for what each run brings: `Session::run` binds the
//! model's symbolic sizes from the inputs, reuses a program compiled for them before, or compiles
//! one (through the compile cache). A decode loop whose KV cache grows a position a step would
//! compile at every step; so a symbol that `pad::plan` proves can be padded is compiled at a
//! capacity instead (the next power of two, at least 16), its inputs zero-padded and the length
//! passed as one more input, its outputs cut back: one program serves every length up to the
//! capacity. Other symbols, and input values that decide shapes, are compiled exactly, once per
//! distinct value.

use std::collections::{BTreeMap, HashMap};

use kiln_ir::{Dim, Graph, Tensor};
use kiln_runtime::{Executable, LoadOptions};

use crate::pad::{self, PadPlan};
use crate::passes::specialize;
use crate::{compile, CompileError, Options, Result};

/// The smallest capacity a padded symbol is compiled at.
const MIN_CAPACITY: usize = 16;

/// The capacity a padded symbol of size `n` is compiled at.
pub fn capacity(n: usize) -> usize {
    n.next_power_of_two().max(MIN_CAPACITY)
}

/// A compiled program and how it was specialised.
struct Program {
    exe: Executable,
    /// The padded symbol's plan and capacity, if it has one.
    padded: Option<(PadPlan, usize)>,
}

pub struct Session {
    graph: Graph,
    options: Options,
    load: LoadOptions,
    /// Inputs whose values decide shapes (compiled per distinct value).
    shape_inputs: Vec<usize>,
    /// Per symbol: whether it can be padded (decided the first time it is seen).
    plans: HashMap<String, std::result::Result<PadPlan, String>>,
    programs: HashMap<String, Program>,
    compiles: usize,
}

impl Session {
    /// A session for `graph`, compiling with `options` (its input sizes and values are the
    /// session's to set) and loading with `load`.
    pub fn new(graph: Graph, options: Options, load: LoadOptions) -> Session {
        let shape_inputs = specialize::shape_inputs(&graph);
        Session { graph, options, load, shape_inputs, plans: HashMap::new(), programs: HashMap::new(), compiles: 0 }
    }

    /// How many programs the session has compiled (or taken from the compile cache).
    pub fn compiles(&self) -> usize {
        self.compiles
    }

    /// Why `symbol` is compiled exactly rather than padded, once a run has seen it (`None`:
    /// padded, or not seen yet).
    pub fn not_padded(&self, symbol: &str) -> Option<&str> {
        self.plans.get(symbol).and_then(|p| p.as_ref().err()).map(String::as_str)
    }

    /// Runs the model on `inputs` (in the graph's input order).
    pub fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let sizes = self.bind(inputs)?;
        // At most one symbol is padded: the first, by name, that can be.
        let mut padded: Option<String> = None;
        for symbol in sizes.keys() {
            if !self.plans.contains_key(symbol) {
                let probe = self.shapes(inputs, &sizes, Some((symbol, 13)));
                let plan = pad::plan(&self.graph, symbol, &probe);
                self.plans.insert(symbol.clone(), plan);
            }
            if padded.is_none() && self.plans[symbol].is_ok() {
                padded = Some(symbol.clone());
            }
        }
        let mut key = String::new();
        for (symbol, &n) in &sizes {
            match &padded {
                Some(p) if p == symbol => key.push_str(&format!("{symbol}<={} ", capacity(n))),
                _ => key.push_str(&format!("{symbol}={n} ")),
            }
        }
        for &i in &self.shape_inputs {
            key.push_str(&format!("#{i}:{:016x} ", inputs[i].digest()));
        }
        if !self.programs.contains_key(&key) {
            let program = self.compile(inputs, &sizes, padded.as_deref())?;
            self.compiles += 1;
            self.programs.insert(key.clone(), program);
        }
        let program = &self.programs[&key];
        // The program's inputs by name: the model's (a padded symbol's axes zero-padded to the
        // capacity, those whose values were bound left out), then the padded length.
        let mut named: Vec<(String, Tensor)> =
            self.graph.inputs().iter().zip(inputs).map(|(&id, t)| (self.graph.node(id).name.clone(), t.clone())).collect();
        if let Some((plan, cap)) = &program.padded {
            for &(i, axis) in &plan.inputs {
                named[i].1 = inputs[i].resize_axis(axis, *cap)?;
            }
            named.push((pad::length_input(&plan.symbol), Tensor::scalar::<i64>(sizes[&plan.symbol] as i64)));
        }
        let args: Vec<Tensor> = program
            .exe
            .inputs()
            .iter()
            .map(|d| {
                named
                    .iter()
                    .find(|(n, _)| *n == d.name)
                    .map(|(_, t)| t.clone())
                    .ok_or_else(|| CompileError::Internal(format!("the program takes `{}`, which the model does not", d.name)))
            })
            .collect::<Result<_>>()?;
        let mut outs = program.exe.run(&args)?;
        if let Some((plan, _)) = &program.padded {
            let length = sizes[&plan.symbol];
            for &(o, axis, extra) in &plan.outputs {
                outs[o] = outs[o].resize_axis(axis, length + extra)?;
            }
        }
        Ok(outs)
    }

    /// Every symbol's size in `inputs`, checked against the declared types.
    fn bind(&self, inputs: &[Tensor]) -> Result<BTreeMap<String, usize>> {
        let declared = self.graph.inputs();
        if inputs.len() != declared.len() {
            return Err(CompileError::Usage(format!("`{}` takes {} inputs, {} given", self.graph.name, declared.len(), inputs.len())));
        }
        let mut sizes: BTreeMap<String, (usize, String)> = BTreeMap::new();
        for (t, &id) in inputs.iter().zip(declared) {
            let (name, ty) = (&self.graph.node(id).name, &self.graph.node(id).outputs[0]);
            if t.dtype() != ty.dtype || t.rank() != ty.rank() {
                return Err(CompileError::Usage(format!("input `{name}` is {ty}, got {}", t.ty())));
            }
            for (d, &n) in ty.shape.dims().iter().zip(t.dims()) {
                match d {
                    Dim::Fixed(m) if *m != n => return Err(CompileError::Usage(format!("input `{name}` is {ty}, got {}", t.ty()))),
                    Dim::Fixed(_) => {}
                    Dim::Sym(s) => match sizes.get(&**s) {
                        Some((m, other)) if *m != n => {
                            return Err(CompileError::Usage(format!("`{s}` is {m} in input `{other}` but {n} in input `{name}`")));
                        }
                        Some(_) => {}
                        None => {
                            sizes.insert(s.to_string(), (n, name.clone()));
                        }
                    },
                }
            }
        }
        Ok(sizes.into_iter().map(|(s, (n, _))| (s, n)).collect())
    }

    /// Every input's dims as `specialize` takes them, `resized` symbol at another size.
    fn shapes(&self, inputs: &[Tensor], sizes: &BTreeMap<String, usize>, resized: Option<(&str, usize)>) -> HashMap<String, Vec<usize>> {
        let mut shapes = HashMap::new();
        for (t, &id) in inputs.iter().zip(self.graph.inputs()) {
            let node = self.graph.node(id);
            let dims = node.outputs[0]
                .shape
                .dims()
                .iter()
                .zip(t.dims())
                .map(|(d, &n)| match (d, resized) {
                    (Dim::Sym(s), Some((r, size))) if &**s == r => size,
                    (Dim::Sym(s), _) => sizes.get(&**s).copied().unwrap_or(n),
                    (Dim::Fixed(_), _) => n,
                })
                .collect();
            shapes.insert(node.name.clone(), dims);
        }
        shapes
    }

    fn compile(&self, inputs: &[Tensor], sizes: &BTreeMap<String, usize>, padded: Option<&str>) -> Result<Program> {
        let values: HashMap<String, Tensor> =
            self.shape_inputs.iter().map(|&i| (self.graph.node(self.graph.inputs()[i]).name.clone(), inputs[i].clone())).collect();
        let Some(symbol) = padded else {
            let options = Options { input_shapes: self.shapes(inputs, sizes, None), input_values: values, ..self.options.clone() };
            let artifact = compile(&self.graph, &options, false)?.artifact;
            return Ok(Program { exe: Executable::load(artifact, &self.load)?, padded: None });
        };
        let plan = self.plans[symbol].clone().map_err(CompileError::Internal)?;
        let cap = capacity(sizes[symbol]);
        let graph = pad::apply(&self.graph, &plan, &self.shapes(inputs, sizes, Some((symbol, cap))))?;
        let options = Options { input_shapes: HashMap::new(), input_values: values, ..self.options.clone() };
        let artifact = compile(&graph, &options, false)?.artifact;
        Ok(Program { exe: Executable::load(artifact, &self.load)?, padded: Some((plan, cap)) })
    }
}
