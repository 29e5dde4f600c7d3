//! ONNX backend-style test directories (`model.onnx` + `test_data_set_*/{input,output}_N.pb`):
//! finding them, running them on any engine, and comparing outputs.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::{DType, Graph, IrError, Tensor, Value};

/// Comparison tolerance for float outputs: `|got - want| <= atol + rtol * |want|`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
}

impl Default for Tolerance {
    fn default() -> Tolerance {
        Tolerance { rtol: 1e-3, atol: 1e-5 }
    }
}

/// How an output differs from its reference ([`compare`], [`compare_values`]).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Mismatch {
    /// Another element type or shape.
    #[error("got {got}, expected {want}")]
    Type { got: crate::TensorType, want: crate::TensorType },
    /// Values outside the tolerance: the first one (its index and both values, as text), and
    /// how many of all differ.
    #[error("element {at} is {got}, expected {want} ({bad} of {total} elements differ)")]
    Values { at: String, got: String, want: String, bad: usize, total: usize },
    #[error("a sequence of {got} tensors, expected {want}")]
    SequenceLength { got: usize, want: usize },
    #[error("element {index}: {mismatch}")]
    Element { index: usize, mismatch: Box<Mismatch> },
    /// A tensor, sequence or optional where another kind was expected ([`Value::describe`]).
    #[error("got {got}, expected {want}")]
    Kind { got: String, want: String },
}

/// How one test ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Pass,
    /// Ran and was wrong, or failed to run: the reason.
    Fail(String),
    /// Uses something kiln does not support: the reason (an op, a type).
    Skip(String),
}

/// One test's result.
#[derive(Clone, Debug)]
pub struct CaseResult {
    pub name: String,
    pub outcome: Outcome,
    pub time: Duration,
}

/// The test directories under `paths`: each path is a test (it holds `model.onnx`) or a folder of
/// tests (its subfolders that hold one), sorted by name.
pub fn find_tests(paths: &[PathBuf]) -> Result<Vec<PathBuf>, IrError> {
    let mut out = Vec::new();
    for p in paths {
        if p.join("model.onnx").is_file() {
            out.push(p.clone());
            continue;
        }
        let entries =
            std::fs::read_dir(p).map_err(|e| IrError::Onnx(format!("{}: {e}", p.display())))?;
        let mut found: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|d| d.join("model.onnx").is_file())
            .collect();
        if found.is_empty() {
            return Err(IrError::Onnx(format!(
                "{}: no model.onnx in it or in its subfolders",
                p.display()
            )));
        }
        found.sort();
        out.extend(found);
    }
    Ok(out)
}

/// Why an engine could not produce outputs.
#[derive(Clone, Debug)]
pub enum EngineError {
    /// The engine does not support something the model uses (the test is skipped).
    Unsupported(String),
    /// It failed (the test fails).
    Failed(String),
}

impl From<IrError> for EngineError {
    fn from(e: IrError) -> EngineError {
        match e {
            IrError::Unsupported(_) | IrError::NotSupported(_) => {
                EngineError::Unsupported(e.to_string())
            }
            other => EngineError::Failed(other.to_string()),
        }
    }
}

/// The engine a test runs on: the graph and its inputs in, the outputs out.
pub type Engine<'a> = dyn Fn(&Graph, &[Value]) -> Result<Vec<Value>, EngineError> + Sync + 'a;

/// Runs one test directory on `engine` and compares every data set's outputs.
pub fn run_case(dir: &Path, engine: &Engine, tol: Tolerance) -> Outcome {
    let model = match super::load(dir.join("model.onnx")) {
        Ok(m) => m,
        Err(e) => return classify(e),
    };
    let graph = &model.graph;
    let mut sets: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.is_dir()
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("test_data_set_"))
            })
            .collect(),
        Err(e) => return Outcome::Fail(format!("{}: {e}", dir.display())),
    };
    sets.sort();
    if sets.is_empty() {
        return Outcome::Fail("no test_data_set_* folder".into());
    }
    for set in &sets {
        // Each file holds what the graph declares there: a tensor, a sequence or an optional.
        let input_types: Vec<&crate::TensorType> =
            graph.inputs().iter().map(|&id| &graph.node(id).outputs[0]).collect();
        let output_types: Vec<&crate::TensorType> =
            graph.outputs().iter().map(|(_, v)| graph.value_type(*v)).collect();
        let read = |prefix: &str, types: &[&crate::TensorType]| -> Result<Vec<Value>, IrError> {
            let mut v = Vec::new();
            while set.join(format!("{prefix}_{}.pb", v.len())).is_file() {
                let path = set.join(format!("{prefix}_{}.pb", v.len()));
                v.push(match types.get(v.len()) {
                    Some(ty) => super::read_value(path, ty)?,
                    None => Value::Tensor(super::read_tensor(path)?),
                });
            }
            Ok(v)
        };
        let (inputs, expected) = match (read("input", &input_types), read("output", &output_types))
        {
            (Ok(i), Ok(o)) => (i, o),
            (Err(e), _) | (_, Err(e)) => return classify(e),
        };
        let got = match engine(graph, &inputs) {
            Ok(g) => g,
            Err(EngineError::Unsupported(why)) => return Outcome::Skip(why),
            Err(EngineError::Failed(why)) => return Outcome::Fail(why),
        };
        if got.len() < expected.len() {
            return Outcome::Fail(format!("{} outputs, {} expected", got.len(), expected.len()));
        }
        for (i, (want, have)) in expected.iter().zip(&got).enumerate() {
            if let Err(why) = compare_values(want, have, tol) {
                let name = graph.outputs().get(i).map_or("?", |(n, _)| n.as_str());
                let set_name =
                    set.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
                return Outcome::Fail(format!("{set_name}: output {i} `{name}`: {why}"));
            }
        }
    }
    Outcome::Pass
}

/// Unsupported ops and features skip a test; anything else fails it.
fn classify(e: IrError) -> Outcome {
    match e {
        IrError::Unsupported(ops) => Outcome::Skip(format!(
            "unsupported op{} {}",
            if ops.len() == 1 { "" } else { "s" },
            ops.iter().map(|o| o.op_type.as_str()).collect::<Vec<_>>().join(", ")
        )),
        IrError::NotSupported(m) => Outcome::Skip(m),
        other => Outcome::Fail(other.to_string()),
    }
}

/// Compares values: tensors as [`compare`] does, sequences element by element, optionals by
/// whether they hold a value and then what.
pub fn compare_values(want: &Value, got: &Value, tol: Tolerance) -> Result<(), Mismatch> {
    match (want, got) {
        (Value::Tensor(w), Value::Tensor(g)) => compare(w, g, tol),
        (Value::Sequence(w), Value::Sequence(g)) => {
            if w.len() != g.len() {
                return Err(Mismatch::SequenceLength { got: g.len(), want: w.len() });
            }
            for (i, (w, g)) in w.iter().zip(g).enumerate() {
                compare(w, g, tol)
                    .map_err(|e| Mismatch::Element { index: i, mismatch: Box::new(e) })?;
            }
            Ok(())
        }
        (Value::Optional(None), Value::Optional(None)) => Ok(()),
        (Value::Optional(Some(w)), Value::Optional(Some(g))) => compare_values(w, g, tol),
        (w, g) => Err(Mismatch::Kind { got: g.describe(), want: w.describe() }),
    }
}

/// Compares an output with its reference: same dtype and shape; floats within `tol` (NaN matches
/// NaN, infinities must be equal); integers, bools and strings exactly.
pub fn compare(want: &Tensor, got: &Tensor, tol: Tolerance) -> Result<(), Mismatch> {
    if want.dtype() != got.dtype() || want.dims() != got.dims() {
        return Err(Mismatch::Type { got: got.ty(), want: want.ty() });
    }
    if let (Some(w), Some(g)) = (want.strings(), got.strings()) {
        let differ: Vec<usize> = (0..w.len()).filter(|&i| w[i] != g[i]).collect();
        let Some(&i) = differ.first() else { return Ok(()) };
        let idx = crate::eval::strides(want.dims())
            .iter()
            .zip(want.dims())
            .map(|(s, d)| (i / s) % d.max(&1))
            .collect::<Vec<usize>>();
        return Err(Mismatch::Values {
            at: format!("{idx:?}"),
            got: format!("{:?}", g[i]),
            want: format!("{:?}", w[i]),
            bad: differ.len(),
            total: w.len(),
        });
    }
    let float = want.dtype().is_float();
    let (w, g) = if float || want.dtype() == DType::Bool {
        (want.to_f64s(), got.to_f64s())
    } else {
        (Vec::new(), Vec::new())
    };
    let mut bad = 0usize;
    // The first difference: its index, the value got and the value expected.
    let mut first: Option<(String, String, String)> = None;
    let at = |i: usize| {
        let strides = crate::eval::strides(want.dims());
        let idx: Vec<usize> =
            strides.iter().zip(want.dims()).map(|(s, d)| (i / s) % d.max(&1)).collect();
        format!("{idx:?}")
    };
    if float || want.dtype() == DType::Bool {
        for i in 0..w.len() {
            let (a, b) = (w[i], g[i]);
            let ok = if a.is_nan() || b.is_nan() {
                a.is_nan() && b.is_nan()
            } else if a.is_infinite() || b.is_infinite() {
                a == b
            } else if float {
                (a - b).abs() <= tol.atol + tol.rtol * a.abs()
            } else {
                a == b
            };
            if !ok {
                bad += 1;
                first.get_or_insert_with(|| (at(i), b.to_string(), a.to_string()));
            }
        }
    } else {
        let (w, g) = (want.to_i64s(), got.to_i64s());
        for i in 0..w.len() {
            if w[i] != g[i] {
                bad += 1;
                first.get_or_insert_with(|| (at(i), g[i].to_string(), w[i].to_string()));
            }
        }
    }
    match first {
        None => Ok(()),
        Some((at, got, want_v)) => {
            Err(Mismatch::Values { at, got, want: want_v, bad, total: want.len() })
        }
    }
}

/// Runs every test on `engine` with `threads` workers; `done` is told of each result as it comes.
/// Results come back in the order of `tests`. A panic in the engine fails that test only.
pub fn run_all(
    tests: &[PathBuf],
    engine: &Engine,
    tol: Tolerance,
    threads: usize,
    done: &(dyn Fn(&CaseResult) + Sync),
) -> Vec<CaseResult> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<CaseResult>>> = Mutex::new(vec![None; tests.len()]);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(dir) = tests.get(i) else { break };
                let start = Instant::now();
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    run_case(dir, engine, tol)
                }))
                .unwrap_or_else(|p| Outcome::Fail(format!("panicked: {}", panic_text(&p))));
                let r = CaseResult { name: test_name(dir), outcome, time: start.elapsed() };
                done(&r);
                results.lock().expect("no worker panics while holding the lock")[i] = Some(r);
            });
        }
    });
    results
        .into_inner()
        .expect("workers finished")
        .into_iter()
        .map(|r| r.expect("every test ran"))
        .collect()
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "?".into())
}

/// A test's name: `suite/test`, its parent folder's name and its own (`node/test_abs`), so tests
/// of several suites can share one ratchet list.
pub fn test_name(dir: &Path) -> String {
    let own = dir
        .file_name()
        .map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().to_string());
    match dir.parent().and_then(|p| p.file_name()) {
        Some(suite) => format!("{}/{own}", suite.to_string_lossy()),
        None => own,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(dims: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_vec(dims, v.to_vec()).unwrap()
    }

    #[test]
    fn floats_match_within_the_tolerance_and_nan_matches_nan() {
        let tol = Tolerance { rtol: 1e-3, atol: 1e-5 };
        let want = f32s(&[3], &[1.0, f32::NAN, f32::INFINITY]);
        assert_eq!(compare(&want, &f32s(&[3], &[1.0005, f32::NAN, f32::INFINITY]), tol), Ok(()));
        assert_eq!(
            compare(&want, &f32s(&[3], &[1.01, 0.0, f32::NEG_INFINITY]), tol),
            Err(Mismatch::Values {
                at: "[0]".into(),
                got: "1.0099999904632568".into(),
                want: "1".into(),
                bad: 3,
                total: 3
            })
        );
    }

    #[test]
    fn mismatches_name_the_first_element_the_type_or_the_kind() {
        let tol = Tolerance::default();
        let want = Tensor::from_vec(&[2, 2], vec![1i64, 2, 3, 4]).unwrap();
        let got = Tensor::from_vec(&[2, 2], vec![1i64, 2, 3, 5]).unwrap();
        let e = compare(&want, &got, tol).unwrap_err();
        assert_eq!(e.to_string(), "element [1, 1] is 5, expected 4 (1 of 4 elements differ)");
        let e = compare(&want, &want.reshape(&[4]).unwrap(), tol).unwrap_err();
        assert_eq!(e.to_string(), "got i64[4], expected i64[2,2]");
        let seq = |n: i64| Value::Sequence(vec![Tensor::vector(&[n])]);
        assert_eq!(compare_values(&seq(1), &seq(1), tol), Ok(()));
        assert_eq!(
            compare_values(&seq(1), &seq(2), tol).unwrap_err().to_string(),
            "element 0: element [0] is 2, expected 1 (1 of 1 elements differ)"
        );
        assert_eq!(
            compare_values(&seq(1), &Value::Sequence(vec![]), tol),
            Err(Mismatch::SequenceLength { got: 0, want: 1 })
        );
        assert_eq!(
            compare_values(&Value::Optional(None), &seq(1), tol).unwrap_err().to_string(),
            "got a sequence of 1 tensors, expected an empty optional"
        );
    }

    #[test]
    fn test_names_are_the_suite_and_the_test() {
        assert_eq!(test_name(Path::new("/data/node/test_abs")), "node/test_abs");
        assert_eq!(test_name(Path::new("test_abs")), "test_abs");
    }
}
