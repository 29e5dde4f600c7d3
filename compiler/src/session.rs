//! A model kept in process and compiled for what each run brings: `Session::run` binds the
//! model's symbolic sizes from the inputs, reuses a program compiled for them before, or compiles
//! one (through the compile cache). A decode loop whose KV cache grows a position a step would
//! compile at every step; so a symbol that `pad::plan` proves can be padded is compiled at a
//! capacity instead (the next power of two, at least 16; `Options::pad`, so the runtime pads its
//! inputs and cuts its outputs): one program serves every length up to the capacity. Other symbols, and input values that decide shapes, are compiled exactly, once per
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

pub struct Session {
    graph: Graph,
    options: Options,
    load: LoadOptions,
    /// Inputs whose values decide shapes (compiled per distinct value).
    shape_inputs: Vec<usize>,
    /// Per symbol: whether it can be padded (decided the first time it is seen).
    plans: HashMap<String, std::result::Result<PadPlan, String>>,
    /// Loaded programs by what they were compiled for (sizes, padded capacities, values), each
    /// with the turn it was last used on.
    programs: HashMap<String, (Executable, u64)>,
    /// The most programs kept loaded (each holds its code, scratch and threads): past it, the
    /// least recently used is dropped.
    max_programs: usize,
    turn: u64,
    compiles: usize,
}

/// Programs a session keeps loaded unless told otherwise.
pub const DEFAULT_MAX_PROGRAMS: usize = 16;

impl Session {
    /// A session for `graph`, compiling with `options` (its input sizes and values are the
    /// session's to set) and loading with `load`.
    pub fn new(graph: Graph, options: Options, load: LoadOptions) -> Session {
        let shape_inputs = specialize::shape_inputs(&graph);
        Session {
            graph,
            options,
            load,
            shape_inputs,
            plans: HashMap::new(),
            programs: HashMap::new(),
            max_programs: DEFAULT_MAX_PROGRAMS,
            turn: 0,
            compiles: 0,
        }
    }

    /// Keeps at most `n` programs loaded (at least 1; default [`DEFAULT_MAX_PROGRAMS`]): a run
    /// needing another drops the least recently used, freeing its code, scratch and threads.
    pub fn set_max_programs(&mut self, n: usize) {
        self.max_programs = n.max(1);
        self.evict_to(self.max_programs);
    }

    /// How many programs are loaded now.
    pub fn loaded_programs(&self) -> usize {
        self.programs.len()
    }

    /// Drops least recently used programs until at most `n` are loaded.
    fn evict_to(&mut self, n: usize) {
        while self.programs.len() > n {
            let oldest = self
                .programs
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
                .expect("more than n >= 1 programs");
            self.programs.remove(&oldest);
        }
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
        self.run_profiled(inputs, None)
    }

    /// `run`, recording the program's launches into `profile` when given.
    pub fn run_profiled(
        &mut self,
        inputs: &[Tensor],
        profile: Option<&mut kiln_runtime::Profile>,
    ) -> Result<Vec<Tensor>> {
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
            self.evict_to(self.max_programs - 1);
            self.programs.insert(key.clone(), (program, 0));
        }
        self.turn += 1;
        let entry = self.programs.get_mut(&key).expect("inserted above");
        entry.1 = self.turn;
        // The program's inputs by name: the model's, less those whose values were bound (a
        // padded program pads and cuts itself).
        let exe = &entry.0;
        let args: Vec<Tensor> = exe
            .inputs()
            .iter()
            .map(|d| {
                let i =
                    self.graph.inputs().iter().position(|&id| self.graph.node(id).name == d.name);
                // The program was compiled from this model.
                i.map(|i| inputs[i].clone()).ok_or_else(|| {
                    CompileError::Internal(format!(
                        "the program takes `{}`, which the model does not",
                        d.name
                    ))
                })
            })
            .collect::<Result<_>>()?;
        Ok(exe.run_profiled(&args, profile)?)
    }

    /// Every symbol's size in `inputs`, checked against the declared types.
    fn bind(&self, inputs: &[Tensor]) -> Result<BTreeMap<String, usize>> {
        let declared = self.graph.inputs();
        if inputs.len() != declared.len() {
            return Err(CompileError::Usage(format!(
                "`{}` takes {} inputs, {} given",
                self.graph.name,
                declared.len(),
                inputs.len()
            )));
        }
        let mut sizes: BTreeMap<String, (usize, String)> = BTreeMap::new();
        for (t, &id) in inputs.iter().zip(declared) {
            let (name, ty) = (&self.graph.node(id).name, &self.graph.node(id).outputs[0]);
            if t.dtype() != ty.dtype || t.rank() != ty.rank() {
                return Err(CompileError::Usage(format!("input `{name}` is {ty}, got {}", t.ty())));
            }
            for (d, &n) in ty.shape.dims().iter().zip(t.dims()) {
                match d {
                    Dim::Fixed(m) if *m != n => {
                        return Err(CompileError::Usage(format!(
                            "input `{name}` is {ty}, got {}",
                            t.ty()
                        )))
                    }
                    Dim::Fixed(_) => {}
                    Dim::Sym(s) => match sizes.get(&**s) {
                        Some((m, other)) if *m != n => {
                            return Err(CompileError::Usage(format!(
                                "`{s}` is {m} in input `{other}` but {n} in input `{name}`"
                            )));
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
    fn shapes(
        &self,
        inputs: &[Tensor],
        sizes: &BTreeMap<String, usize>,
        resized: Option<(&str, usize)>,
    ) -> HashMap<String, Vec<usize>> {
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

    fn compile(
        &self,
        inputs: &[Tensor],
        sizes: &BTreeMap<String, usize>,
        padded: Option<&str>,
    ) -> Result<Executable> {
        let values: HashMap<String, Tensor> = self
            .shape_inputs
            .iter()
            .map(|&i| (self.graph.node(self.graph.inputs()[i]).name.clone(), inputs[i].clone()))
            .collect();
        let pad = padded.map(|symbol| (symbol.to_string(), capacity(sizes[symbol])));
        let resized = pad.as_ref().map(|(s, c)| (s.as_str(), *c));
        let options = Options {
            input_shapes: self.shapes(inputs, sizes, resized),
            input_values: values,
            pad,
            ..self.options.clone()
        };
        Ok(Executable::load(compile(&self.graph, &options, false)?.artifact, &self.load)?)
    }
}
