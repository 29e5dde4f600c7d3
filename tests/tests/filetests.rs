//! Graph-pass filetests, as Cranelift writes them: each `tests/filetests/*.kiln` holds a
//! `// pass: NAME` line, a graph in kiln's text form, and after `// expect:` the graph that pass
//! makes of it (`// expect: unchanged` when it changes nothing). `KILN_BLESS=1` rewrites the
//! expectations from what the passes make now; review the diff like any snapshot.

use std::path::Path;

use kiln_compiler::passes;
use kiln_ir::text::{self, Weights};

const EXPECT: &str = "// expect:";

/// What `pass` makes of `input`: the printed graph, or `unchanged`.
fn run(name: &str, input: &str) -> Result<String, String> {
    let mut g = text::parse(input).map_err(|e| format!("the input does not parse: {e}"))?;
    let all = passes::default_passes(kiln_compiler::backend::rules(kiln_compiler::TargetKind::Cpu));
    let pass = all.iter().find(|p| p.name == name).ok_or_else(|| format!("no pass `{name}`"))?;
    let changed = (pass.run)(&mut g).map_err(|e| format!("the pass failed: {e}"))?;
    g.verify().map_err(|e| format!("the pass made an invalid graph: {e}"))?;
    Ok(if changed { text::print(&g, Weights::Full) } else { "unchanged".to_string() })
}

#[test]
fn graph_pass_filetests() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("filetests");
    let bless = std::env::var_os("KILN_BLESS").is_some();
    let mut files: Vec<_> =
        std::fs::read_dir(&dir).expect("tests/filetests").map(|e| e.unwrap().path()).collect();
    files.sort();
    let mut failures = Vec::new();
    for path in files.iter().filter(|p| p.extension().is_some_and(|e| e == "kiln")) {
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        let content = std::fs::read_to_string(path).unwrap();
        let (input, expected) = match content.find(EXPECT) {
            Some(i) => (&content[..i], Some(content[i + EXPECT.len()..].trim())),
            None => (content.as_str(), None),
        };
        let name = input.lines().find_map(|l| l.strip_prefix("// pass: ")).map(str::trim);
        let Some(name) = name else {
            failures.push(format!("{file}: no `// pass: NAME` line"));
            continue;
        };
        let got = match run(name, input) {
            Ok(g) => g,
            Err(e) => {
                failures.push(format!("{file}: {e}"));
                continue;
            }
        };
        if bless {
            let sep = if got.contains('\n') { "\n" } else { " " };
            std::fs::write(
                path,
                format!("{}\n{EXPECT}{sep}{}\n", input.trim_end(), got.trim_end()),
            )
            .unwrap();
        } else if expected != Some(got.trim()) {
            failures.push(format!(
                "{file}: pass `{name}` made\n{got}\nexpected\n{}",
                expected.unwrap_or("(nothing: bless it)")
            ));
        }
    }
    assert!(files.len() >= 6, "the filetests are missing");
    assert!(
        failures.is_empty(),
        "{} filetest(s) failed (KILN_BLESS=1 rewrites the expectations):\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
