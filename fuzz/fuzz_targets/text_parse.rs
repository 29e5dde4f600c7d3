//! kiln's text form -> Graph (parse, inference); a parsed graph prints and parses again.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(graph) = kiln_ir::text::parse(text) {
        let printed = kiln_ir::text::print(&graph, kiln_ir::text::Weights::Full);
        let _ = kiln_ir::text::parse(&printed);
    }
});
