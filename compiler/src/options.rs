//! What a compile is asked to do.

use std::collections::HashMap;
use std::path::PathBuf;

/// The kind of code to generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TargetKind {
    Cpu,
    Cuda,
    Opencl,
}

impl TargetKind {
    pub fn name(self) -> &'static str {
        match self {
            TargetKind::Cpu => "cpu",
            TargetKind::Cuda => "cuda",
            TargetKind::Opencl => "opencl",
        }
    }
}

/// Compile options. Everything that changes the generated code is part of the cache key.
#[derive(Clone, Debug)]
pub struct Options {
    pub target: TargetKind,
    /// Concrete shapes for inputs with symbolic dimensions.
    pub input_shapes: HashMap<String, Vec<usize>>,
    /// Write every stage's text into this folder.
    pub dump_dir: Option<PathBuf>,
    /// Use the compile cache (on by default).
    pub cache: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options { target: TargetKind::Cpu, input_shapes: HashMap::new(), dump_dir: None, cache: true }
    }
}
