//! ONNX bytes -> kiln Graph (import, shape inference), then the graph's own verification and its
//! text form. Any input must give a graph or an error, never a panic or an abort.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(model) = kiln_ir::onnx::load_bytes(data, None) {
        let _ = model.graph.verify();
        let _ = kiln_ir::text::print(&model.graph, kiln_ir::text::Weights::Summary);
    }
});
