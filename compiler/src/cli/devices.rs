//! `kiln devices [--json]`: the devices this machine has for kiln (the CPU, CUDA GPUs, OpenCL
//! devices), what `--device auto` would pick, and why a kind of device is missing.

use kiln_runtime::{auto_device, list_devices, DeviceInfo};

use crate::Result;

#[derive(clap::Args)]
pub struct Args {
    /// Print JSON: {"devices": [...], "auto": {"target", "reason"}}.
    #[arg(long)]
    json: bool,
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// One device (or note) as a readable block.
fn describe(d: &DeviceInfo) -> String {
    if d.index.is_none() {
        return format!("{:<10} {}", d.id, d.note.as_deref().unwrap_or("unavailable"));
    }
    let mut facts = Vec::new();
    facts.extend(d.compute_capability.clone());
    if let Some(n) = d.compute_units {
        facts.push(format!(
            "{n} {}",
            match d.target {
                kiln_runtime::Target::Cpu => "cores",
                kiln_runtime::Target::Cuda => "SMs",
                kiln_runtime::Target::Opencl => "compute units",
            }
        ));
    }
    facts.extend(d.memory_bytes.map(gib));
    facts.extend(d.version.clone());
    let mut out = format!("{:<10} {} [{}] {}", d.id, d.name, d.kind, facts.join(", "));
    if let Some(p) = &d.platform {
        out.push_str(&format!("\n{:<10}   platform: {p}", ""));
    }
    if let Some(il) = &d.il_versions {
        out.push_str(&format!("\n{:<10}   IL: {}", "", if il.is_empty() { "none" } else { il }));
    }
    if let Some(n) = &d.note {
        out.push_str(&format!("\n{:<10}   not usable: {n}", ""));
    }
    out
}

pub fn run(args: &Args) -> Result<()> {
    let devices = list_devices();
    let (target, reason) = auto_device();
    if args.json {
        let v = serde_json::json!({ "devices": devices, "auto": { "target": target, "reason": reason } });
        println!("{}", serde_json::to_string_pretty(&v).expect("device lists serialise"));
        return Ok(());
    }
    for d in &devices {
        println!("{}", describe(d));
    }
    // The reason starts with the device it picks.
    println!("\n--device auto: {reason}");
    Ok(())
}
