//! `kiln info MODEL`: inputs and outputs, opsets, op histogram, parameters, unsupported ops; a
//! model that does not import (a broken graph) fails the command, saying why.

use std::path::PathBuf;

use kiln_ir::onnx;

use crate::Result;

#[derive(clap::Args)]
pub struct Args {
    /// An ONNX model.
    model: PathBuf,
}

pub fn run(args: &Args) -> Result<()> {
    let s = onnx::inspect_with(&args.model, &super::common::import_options())?;
    println!("model: {}", args.model.display());
    if !s.producer.is_empty() {
        println!("producer: {}", s.producer);
    }
    let opsets: Vec<String> = s
        .opsets
        .iter()
        .map(|(d, v)| format!("{} {v}", if d.is_empty() { "ai.onnx" } else { d }))
        .collect();
    println!("ir version {}, opsets: {}", s.ir_version, opsets.join(", "));
    println!("inputs:");
    for (name, ty) in &s.inputs {
        println!("  {name}: {ty}");
    }
    println!("outputs:");
    for (name, ty) in &s.outputs {
        println!("  {name}: {ty}");
    }
    let mut hist: Vec<(&String, &usize)> = s.ops.iter().collect();
    hist.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let hist: Vec<String> = hist.iter().map(|(op, n)| format!("{op} {n}")).collect();
    println!("ops ({} node{}): {}", s.nodes, if s.nodes == 1 { "" } else { "s" }, hist.join(", "));
    println!(
        "parameters: {} ({})",
        group_digits(s.parameters),
        kiln_ir::memory::human(s.parameter_bytes as u64)
    );
    if s.unsupported.is_empty() {
        println!("unsupported ops: none");
    } else {
        println!("unsupported ops:");
        for u in &s.unsupported {
            println!("  {u}");
        }
    }
    // A model kiln cannot import as it is (a cycle, an undefined value, a bad attribute, an
    // opset it does not know) is described as far as it goes, then the command fails with why.
    match s.import_error {
        Some(e) => Err(crate::CompileError::Usage(format!(
            "{} does not import: {e}",
            args.model.display()
        ))),
        None => Ok(()),
    }
}

fn group_digits(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
