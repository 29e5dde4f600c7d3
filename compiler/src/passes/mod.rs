//! Graph passes: one pass a file, each `fn run(&mut Graph) -> Result<bool>` (whether it changed
//! anything), run in order by `PassManager`, which can print the graph after each pass.

pub mod absorb_pad;
pub mod decompose;
pub mod empty;
pub mod fold;
pub mod recognize;
pub mod sequences;
pub mod simplify;
pub mod specialize;
pub mod unroll;

use kiln_ir::Graph;

use crate::Result;

/// A named graph-to-graph stage.
pub struct Pass {
    pub name: &'static str,
    pub run: fn(&mut Graph) -> Result<bool>,
}

/// The passes every compile for a target runs, in order: the shared ones, the target's own
/// (`Rules::graph_passes`), then decomposition as the target wants it.
pub fn default_passes(target: &dyn crate::backend::Rules) -> Vec<Pass> {
    let mut passes = vec![
        Pass { name: "fold", run: fold::run },
        // Contractions over nothing become their result (zeros, or the bias) written out.
        Pass { name: "empty", run: empty::run },
        // Small loops of a known length become straight-line code (their trip counts are
        // constants by now).
        Pass { name: "unroll", run: unroll::run },
        // Sequences and optionals whose lengths and positions are known become tensors
        // (folding and unrolling in between; a no-op for graphs without them).
        Pass { name: "sequences", run: sequences::run },
        // Normalisations written as chains of small ops become the one op (their axes and eps
        // are constants by now).
        Pass { name: "recognize", run: recognize::run },
        // A zero Pad before a Conv becomes the Conv's padding (the pads are constants by now).
        Pass { name: "absorb-pad", run: absorb_pad::run },
    ];
    passes.extend(target.graph_passes());
    passes.extend([
        // Ops without kernels of their own become ops that have them (but those the target
        // runs whole); simplification and folding then tidy what they made (weight slices of
        // constant weights fold away).
        Pass { name: "decompose", run: target.decompose() },
        Pass { name: "simplify", run: simplify::run },
        // Simplification exposes more constants (a Reshape of a folded shape...).
        Pass { name: "fold-again", run: fold::run },
    ]);
    passes
}

/// Runs passes in order; `after` is told the graph after each one (for `--dump-dir` and
/// `emit --stage`).
pub fn run_passes(
    graph: &mut Graph,
    passes: &[Pass],
    mut after: impl FnMut(&str, &Graph, bool),
) -> Result<()> {
    for p in passes {
        let changed = (p.run)(graph)?;
        after(p.name, graph, changed);
    }
    Ok(())
}
