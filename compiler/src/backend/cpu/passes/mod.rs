//! The CPU's own graph passes: they make the nodes its kernels run whole (one `Attention`, an
//! integer convolution), which the GPU targets would only decompose back.

pub mod attention;
pub mod dynamic;
pub mod integer;

use kiln_ir::Graph;

use crate::passes::Pass;
use crate::Result;

/// Run after the shared passes, before decomposition.
pub fn passes() -> Vec<Pass> {
    vec![
        // Attention becomes one node where the attention kernel runs it whole.
        Pass { name: "attention", run: attention::run },
        // Quantized convolutions (DequantizeLinear -> Conv -> QuantizeLinear) become integer
        // ones where the CPU's integer kernel runs them.
        Pass { name: "integer", run: integer::run },
        // Dynamically quantized products (DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul,
        // onnxruntime's `quantize_dynamic`) become one op where the CPU's integer kernel runs it.
        Pass { name: "dynamic", run: dynamic::run },
    ]
}

/// Decomposition that keeps what the CPU runs whole: recurrent layers its recurrent kernel runs
/// (`ukernel::runs_recurrent`: one kernel a layer, its time loop inside) and attention its
/// attention kernel runs (`ukernel::runs_attention`).
pub fn decompose(graph: &mut Graph) -> Result<bool> {
    crate::passes::decompose::decompose(graph, super::ukernel::runs_whole)
}
