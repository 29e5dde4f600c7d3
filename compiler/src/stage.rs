//! The stages of a compile, in order: the one list of their names, files and descriptions
//! (which targets have which is each target's `Rules::stages`). `kiln emit --stage`,
//! `--dump-dir`, the driver, the Python package and the docs all read it, and [`Stages`] holds
//! each stage's text keyed by it.

use std::collections::BTreeMap;
use std::fmt;

/// One stage whose text kiln prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// The graph after specialisation and after each graph pass (a trace, not one result).
    Passes,
    Graph,
    Fused,
    Schedule,
    Mlir,
    Lowered,
    Llvm,
    Asm,
    Ptx,
    Spirv,
}

impl Stage {
    /// Every stage, in the order a compile reaches them.
    pub const ALL: [Stage; 10] = [
        Stage::Passes,
        Stage::Graph,
        Stage::Fused,
        Stage::Schedule,
        Stage::Mlir,
        Stage::Lowered,
        Stage::Llvm,
        Stage::Asm,
        Stage::Ptx,
        Stage::Spirv,
    ];

    /// The name `--stage` takes.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Passes => "passes",
            Stage::Graph => "graph",
            Stage::Fused => "fused",
            Stage::Schedule => "schedule",
            Stage::Mlir => "mlir",
            Stage::Lowered => "lowered",
            Stage::Llvm => "llvm",
            Stage::Asm => "asm",
            Stage::Ptx => "ptx",
            Stage::Spirv => "spirv",
        }
    }

    /// The file `--dump-dir` writes it to (the pass trace is `emit`'s alone).
    pub fn file_name(self) -> Option<&'static str> {
        Some(match self {
            Stage::Passes => return None,
            Stage::Graph => "graph.kiln.txt",
            Stage::Fused => "fused.txt",
            Stage::Schedule => "schedule.txt",
            Stage::Mlir => "kernels.mlir",
            Stage::Lowered => "lowered.mlir",
            Stage::Llvm => "kernels.ll",
            Stage::Asm => "kernels.s",
            Stage::Ptx => "kernels.ptx",
            Stage::Spirv => "kernels.spvasm",
        })
    }

    /// What its text shows.
    pub fn description(self) -> &'static str {
        match self {
            Stage::Passes => "the op graph after specialisation and after each graph pass",
            Stage::Graph => "the op graph after the graph passes",
            Stage::Fused => "the kernels fusion made",
            Stage::Schedule => {
                "each kernel's ops as its CPU schedule reads them, and the schedule decided"
            }
            Stage::Mlir => "each kernel's MLIR as codegen builds it, before the target's pipeline",
            Stage::Lowered => "the MLIR after the target's pipeline (LLVM, NVVM or SPIR-V dialect)",
            Stage::Llvm => "LLVM IR after optimisation",
            Stage::Asm => "host assembly",
            Stage::Ptx => "NVIDIA PTX",
            Stage::Spirv => "SPIR-V, disassembled",
        }
    }

    /// True for the stages before code generation, which a model kiln cannot compile still has.
    pub fn is_front(self) -> bool {
        matches!(self, Stage::Passes | Stage::Graph | Stage::Fused)
    }

    pub fn from_name(name: &str) -> Option<Stage> {
        Stage::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Every name, comma-separated (for messages and help).
    pub fn names() -> String {
        Stage::ALL.map(Stage::name).join(", ")
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Stage {
    type Err = String;

    fn from_str(s: &str) -> Result<Stage, String> {
        Stage::from_name(s)
            .ok_or_else(|| format!("there is no stage `{s}`; the stages are {}", Stage::names()))
    }
}

/// `--stage`'s values and their help are this list's.
impl clap::ValueEnum for Stage {
    fn value_variants<'a>() -> &'a [Stage] {
        &Stage::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()).help(self.description()))
    }
}

/// Each stage's text, for the stages a compile produced.
#[derive(Default, Clone, Debug, PartialEq)]
pub struct Stages(BTreeMap<Stage, String>);

impl Stages {
    /// The stage's text; empty when it was not produced.
    pub fn get(&self, stage: Stage) -> &str {
        self.0.get(&stage).map_or("", String::as_str)
    }

    pub fn set(&mut self, stage: Stage, text: String) {
        self.0.insert(stage, text);
    }

    /// Appends to the stage's text.
    pub fn push(&mut self, stage: Stage, text: &str) {
        self.0.entry(stage).or_default().push_str(text);
    }

    /// The stages produced, in order, with their text.
    pub fn iter(&self) -> impl Iterator<Item = (Stage, &str)> {
        self.0.iter().filter(|(_, t)| !t.is_empty()).map(|(s, t)| (*s, t.as_str()))
    }
}

impl std::ops::Index<Stage> for Stages {
    type Output = str;

    fn index(&self, stage: Stage) -> &str {
        self.get(stage)
    }
}
