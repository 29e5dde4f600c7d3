//! `kiln info MODEL`: inputs and outputs, opsets, op histogram, parameters, unsupported ops; a
//! model that does not import (a broken graph) fails the command, saying why. Given a compiled
//! artifact: what it was compiled for (target, CPU features or GPU architecture), its inputs and
//! outputs (a symbolic batch or padded symbol named), its programs and its size.

use std::path::PathBuf;

use kiln_ir::onnx;

use crate::Result;

#[derive(clap::Args)]
pub struct Args {
    /// An ONNX model, or a compiled artifact (`.kiln`).
    model: PathBuf,
}

pub fn run(args: &Args) -> Result<()> {
    if is_artifact(&args.model) {
        return describe_artifact(&args.model);
    }
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

/// Whether the file starts as an artifact does (it may still be a damaged one).
fn is_artifact(path: &std::path::Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 8];
    let n = kiln_runtime::artifact::MAGIC.len().min(magic.len());
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic[..n]))
        .is_ok_and(|()| magic[..n] == kiln_runtime::artifact::MAGIC[..n])
}

/// An artifact described: read and validated as the runtime would, nothing loaded or run.
fn describe_artifact(path: &std::path::Path) -> Result<()> {
    let bytes = std::fs::read(path).map_err(|e| super::common::file_err(path, e.to_string()))?;
    let art = kiln_runtime::artifact::Artifact::from_bytes(&bytes, &path.display().to_string())?;
    for line in artifact_lines(&art.manifest, bytes.len()) {
        println!("{line}");
    }
    Ok(())
}

/// What `kiln info` prints of an artifact's manifest (`size`: the file's bytes).
pub fn artifact_lines(m: &kiln_runtime::artifact::Manifest, size: usize) -> Vec<String> {
    use kiln_runtime::artifact::TensorDesc;
    let mut out = vec![
        format!("artifact of `{}`, compiled by kiln {}", m.model, m.kiln_version),
        format!("target: {} ({})", m.target.name(), m.target_detail),
    ];
    if !m.cpu_features.is_empty() {
        out.push(format!("CPU features it needs: {}", m.cpu_features.join(", ")));
    }
    // A symbolic batch's or a padded symbol's axis is shown by its symbol.
    let batch = m.batch.as_ref();
    let padded = m.padded.as_ref();
    let tensor = |t: &TensorDesc, i: usize, output: bool| {
        let mut dims: Vec<String> = t.dims.iter().map(|d| d.to_string()).collect();
        if let Some(b) = batch {
            let flags = if output { &b.outputs } else { &b.inputs };
            if flags.get(i) == Some(&true) && !dims.is_empty() {
                dims[0] = b.symbol.clone();
            }
        }
        if let Some(p) = padded {
            let axes = if output { &p.outputs } else { &p.inputs };
            if let Some(a) = axes.iter().find(|a| a.tensor == i) {
                if let Some(d) = dims.get_mut(a.axis) {
                    *d = if a.extra > 0 {
                        format!("{}+{}", p.symbol, a.extra)
                    } else {
                        p.symbol.clone()
                    };
                }
            }
        }
        // An output a host evaluation gives has dims known only at run time.
        let dynamic = output
            && m.control.as_ref().is_some_and(|c| {
                c.outputs.get(i).and_then(|&v| c.values.get(v)).is_some_and(|v| v.dynamic)
            });
        if dynamic {
            return format!("  {}: {} (dims known at run time)", t.name, t.dtype);
        }
        format!("  {}: {}[{}]", t.name, t.dtype, dims.join(","))
    };
    out.push("inputs:".into());
    out.extend(m.inputs.iter().enumerate().map(|(i, t)| tensor(t, i, false)));
    out.push("outputs:".into());
    out.extend(m.outputs.iter().enumerate().map(|(i, t)| tensor(t, i, true)));
    // A training step's parameters and optimizer state: the caller's tensors, written in place.
    if !m.state.is_empty() {
        out.push("state (the caller's tensors, each run writing its new value over it):".into());
        out.extend(m.state.iter().map(|s| {
            let dims: Vec<String> = s.dims.iter().map(|d| d.to_string()).collect();
            format!("  {}: {}[{}] <- {}", s.input, s.dtype, dims.join(","), s.output)
        }));
    }
    let program = |m: &kiln_runtime::artifact::Manifest| {
        let constants: u64 = m
            .buffers
            .iter()
            .filter(|b| matches!(b.kind, kiln_runtime::artifact::BufferKind::Constant(_)))
            .map(|b| b.bytes)
            .sum();
        format!(
            "{} kernel{}, {} launch{}, {} of constants, a {} scratch arena",
            m.kernels.len(),
            if m.kernels.len() == 1 { "" } else { "s" },
            m.launches.len(),
            if m.launches.len() == 1 { "" } else { "es" },
            kiln_ir::memory::human(constants),
            kiln_ir::memory::human(m.arena_bytes)
        )
    };
    if let Some(b) = batch {
        let sizes: Vec<String> = b.programs.iter().map(|p| p.batch.to_string()).collect();
        out.push(format!(
            "a symbolic batch `{}` of {} to {}, run as sums of programs for batch {}:",
            b.symbol,
            b.min,
            b.max,
            sizes.join(", ")
        ));
        for p in &b.programs {
            out.push(format!("  batch {}: {}", p.batch, program(&p.manifest)));
        }
    } else if let Some(c) = &m.control {
        out.push(format!(
            "control flow: {} program{} and {} host step{}",
            c.programs.len(),
            if c.programs.len() == 1 { "" } else { "s" },
            c.steps.len(),
            if c.steps.len() == 1 { "" } else { "s" }
        ));
        for (i, p) in c.programs.iter().enumerate() {
            out.push(format!("  program {i}: {}", program(p)));
        }
    } else if let Some(p) = padded {
        out.push(format!(
            "a padded symbol `{}` up to {}: one program, {}",
            p.symbol,
            p.capacity,
            program(&p.program)
        ));
    } else {
        out.push(format!("one program: {}", program(m)));
    }
    out.push(format!("size: {}", kiln_ir::memory::human(size as u64)));
    out
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
