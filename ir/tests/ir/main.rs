//! kiln-ir's test suite (one binary): op rules and interpreter values, broadcasting, errors,
//! the tracing API, and the text form.

mod builder;
mod errors;
mod onnx;
mod onnx_expanded;
mod onnx_training;
mod ops;
mod ops_collection;
mod ops_control;
mod ops_deform;
mod ops_fourier;
mod ops_generate;
mod ops_grid;
mod ops_indexing;
mod ops_select;
mod ops_sequence;
mod ops_signal;
mod ops_strings;
mod ops_windows;
mod text;

use kiln_ir::builder::{GraphBuilder, Traced};
use kiln_ir::{eval, DType, Tensor};

/// An f32 tensor.
pub fn f32s(dims: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_slice(dims, v).expect("test data matches its shape")
}

/// Asserts `t` has `dims` and values within `tol` of `want`.
#[track_caller]
pub fn assert_close(t: &Tensor, dims: &[usize], want: &[f64], tol: f64) {
    assert_eq!(t.dims(), dims, "shape");
    let got = t.to_f64s();
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol || (g.is_nan() && w.is_nan()),
            "element {i}: got {g}, want {w} (all: {got:?})"
        );
    }
}

/// Runs one op on constant operands (`None`: an omitted optional operand).
pub fn run_on_constants(op: kiln_ir::Op, operands: &[Option<Tensor>]) -> Result<Tensor, String> {
    let g = GraphBuilder::new("t");
    let xs: Vec<_> = operands
        .iter()
        .enumerate()
        .map(|(i, t)| t.as_ref().map(|t| g.constant(&format!("c{i}"), t.clone())))
        .collect();
    let y = g.apply(op, &xs, 1)[0];
    g.output("y", y);
    let graph = g.build().map_err(|e| e.to_string())?;
    eval::run(&graph, &[]).map(|mut v| v.remove(0)).map_err(|e| e.to_string())
}

/// Traces `f` over inputs of the given tensors' types, runs the graph on them, returns output 0.
pub fn run_traced(
    inputs: &[Tensor],
    f: impl for<'g> Fn(&'g GraphBuilder, &[Traced<'g>]) -> Traced<'g>,
) -> Tensor {
    let g = GraphBuilder::new("t");
    let xs: Vec<Traced> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| g.input(&format!("x{i}"), t.dtype(), t.dims()))
        .collect();
    let y = f(&g, &xs);
    g.output("y", y);
    let graph = g.build().expect("the test graph is valid");
    eval::run(&graph, inputs).expect("the test graph runs").remove(0)
}

/// The inferred type of output 0 of a traced graph, or the build error's text.
pub fn traced_type(
    inputs: &[(DType, &[usize])],
    f: impl for<'g> Fn(&'g GraphBuilder, &[Traced<'g>]) -> Traced<'g>,
) -> Result<String, String> {
    let g = GraphBuilder::new("t");
    let xs: Vec<Traced> =
        inputs.iter().enumerate().map(|(i, (d, s))| g.input(&format!("x{i}"), *d, *s)).collect();
    let y = f(&g, &xs);
    g.output("y", y);
    let graph = g.build().map_err(|e| e.to_string())?;
    Ok(graph.value_type(graph.outputs()[0].1).to_string())
}
