//! `kiln cache [--prune | --clear]`: where the compile cache is, what it holds against its
//! limit, and pruning or emptying it by hand.

use crate::{cache, CompileError, Result};

#[derive(clap::Args)]
pub struct Args {
    /// Remove the least recently used artifacts until the cache is under its limit
    /// (`KILN_CACHE_SIZE`), as compiles do now and then by themselves.
    #[arg(long, conflicts_with = "clear")]
    prune: bool,
    /// Remove every compiled artifact (tuning records stay).
    #[arg(long)]
    clear: bool,
}

fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

pub fn run(args: &Args) -> Result<()> {
    let dir = cache::dir().ok_or_else(|| {
        CompileError::Usage("no compile cache: neither KILN_CACHE nor HOME is set".into())
    })?;
    let limit = cache::limit()?;
    let io = |e: std::io::Error| CompileError::File {
        path: dir.display().to_string(),
        msg: e.to_string(),
    };
    if args.prune || args.clear {
        let done =
            if args.clear { cache::clear(&dir) } else { cache::prune(&dir, limit) }.map_err(io)?;
        println!(
            "removed {} artifacts ({}); {} left ({})",
            done.removed.entries,
            size(done.removed.bytes),
            done.kept.entries,
            size(done.kept.bytes)
        );
        return Ok(());
    }
    let usage = cache::usage(&dir).map_err(io)?;
    println!("compile cache: {}", dir.display());
    println!("  {} artifacts, {}", usage.entries, size(usage.bytes));
    match limit {
        0 => println!("  off (KILN_CACHE_SIZE=0)"),
        l => println!("  limit {} (KILN_CACHE_SIZE; the least recently used go first)", size(l)),
    }
    Ok(())
}
