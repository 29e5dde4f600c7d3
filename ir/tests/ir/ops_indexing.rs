//! GatherElements, GatherND, ScatterElements, ScatterND, Tile, Pad, OneHot, Trilu, DepthToSpace, SpaceToDepth, NonZero, Compress, ReverseSequence.
//!
//! Expected values were computed with numpy 2.4 in /tmp/devenv (`np.take_along_axis`, `np.pad`,
//! `np.tile`, `np.triu`, `np.compress`, the reshape/transpose formulas of the ONNX spec, and the
//! loops of onnx.reference for the scatters and GatherND) unless a comment says otherwise.

use kiln_ir::builder::GraphBuilder;
use kiln_ir::op::{PadMode, ScatterReduction};
use kiln_ir::{eval, DType, Dim, Op, Shape, Tensor};

use super::{assert_close, f32s};

/// One operand of a test node: a graph input, a constant, or omitted.
enum A {
    In(Tensor),
    K(Tensor),
    /// A graph input of a type only (for shape rules).
    Ty(DType, Shape),
    Skip,
}

/// Builds a one-node graph; returns its result type and, when every operand has a value, the
/// interpreter's result. Errors are the graph's or the interpreter's messages.
fn go(op: Op, args: Vec<A>) -> Result<(String, Option<Tensor>), String> {
    let g = GraphBuilder::new("t");
    let mut inputs = Vec::new();
    let mut runnable = true;
    let xs: Vec<_> = args
        .into_iter()
        .enumerate()
        .map(|(i, a)| match a {
            A::In(t) => {
                let x = g.input(&format!("x{i}"), t.dtype(), t.dims());
                inputs.push(t);
                Some(x)
            }
            A::K(t) => Some(g.constant(&format!("k{i}"), t)),
            A::Ty(d, s) => {
                runnable = false;
                Some(g.input(&format!("x{i}"), d, s))
            }
            A::Skip => None,
        })
        .collect();
    let y = g.apply(op, &xs, 1)[0];
    g.output("y", y);
    let graph = g.build().map_err(|e| e.to_string())?;
    let ty = graph.value_type(graph.outputs()[0].1).to_string();
    if !runnable {
        return Ok((ty, None));
    }
    let out = eval::run(&graph, &inputs).map_err(|e| e.to_string())?;
    Ok((ty, Some(out[0].clone())))
}

/// The interpreter's result of `op` on `args`.
#[track_caller]
fn run(op: Op, args: Vec<A>) -> Tensor {
    match go(op, args) {
        Ok((_, Some(t))) => t,
        Ok((ty, None)) => panic!("nothing to run (type {ty})"),
        Err(e) => panic!("{e}"),
    }
}

/// The inferred result type.
#[track_caller]
fn ty(op: Op, args: Vec<A>) -> String {
    go(op, args).unwrap_or_else(|e| panic!("{e}")).0
}

/// The error building or running the node.
#[track_caller]
fn err(op: Op, args: Vec<A>) -> String {
    match go(op, args) {
        Ok((ty, _)) => panic!("expected an error, got a result of type {ty}"),
        Err(e) => e,
    }
}

fn i64s(dims: &[usize], v: &[i64]) -> Tensor {
    Tensor::from_slice(dims, v).unwrap()
}

fn sym(dims: &[&str]) -> Shape {
    Shape(
        dims.iter()
            .map(|d| d.parse::<usize>().map(Dim::Fixed).unwrap_or_else(|_| Dim::sym(d)))
            .collect(),
    )
}

fn vals<T: kiln_ir::Element>(t: &Tensor) -> Vec<T> {
    t.as_slice::<T>().unwrap().to_vec()
}

// ----- GatherElements -----

#[test]
fn gather_elements_along_each_axis_with_negative_indices() {
    let x = || f32s(&[3, 3], &[1., 2., 3., 4., 5., 6., 7., 8., 9.]);
    let y = run(
        Op::GatherElements { axis: 0 },
        vec![A::In(x()), A::In(i64s(&[2, 3], &[1, -1, 0, 2, 0, -3]))],
    );
    assert_close(&y, &[2, 3], &[4., 8., 3., 7., 2., 3.], 0.0);
    let y = run(
        Op::GatherElements { axis: -1 },
        vec![A::In(x()), A::In(i64s(&[3, 2], &[0, 0, 1, 0, -1, 2]))],
    );
    assert_close(&y, &[3, 2], &[1., 1., 5., 4., 9., 9.], 0.0);
    // Off the axis, indices may be smaller than data (onnxruntime agrees: [[6], [0]]).
    let idx = Tensor::from_slice(&[2, 1], &[2i32, 0]).unwrap();
    let y = run(
        Op::GatherElements { axis: 0 },
        vec![A::In(f32s(&[3, 3], &[0., 1., 2., 3., 4., 5., 6., 7., 8.])), A::In(idx)],
    );
    assert_close(&y, &[2, 1], &[6., 0.], 0.0);
}

#[test]
fn gather_elements_copies_integers_exactly() {
    let x = Tensor::vector(&[i64::MAX, i64::MIN + 1, 3]);
    let y = run(Op::GatherElements { axis: 0 }, vec![A::In(x), A::In(i64s(&[4], &[1, 0, 0, -1]))]);
    assert_eq!(vals::<i64>(&y), [i64::MIN + 1, i64::MAX, i64::MAX, 3]);
}

#[test]
fn gather_elements_shapes_and_errors() {
    let f = DType::F32;
    assert_eq!(
        ty(
            Op::GatherElements { axis: 1 },
            vec![A::Ty(f, sym(&["b", "5"])), A::Ty(DType::I64, sym(&["b", "7"]))]
        ),
        "f32[b,7]"
    );
    let e = err(
        Op::GatherElements { axis: 0 },
        vec![A::Ty(f, sym(&["3", "3"])), A::Ty(DType::I64, sym(&["3"]))],
    );
    assert_eq!(e, "node `gatherelements` (GatherElements): indices i64[3] must have the rank of data f32[3,3]");
    let e = err(
        Op::GatherElements { axis: 0 },
        vec![A::Ty(f, sym(&["3", "3"])), A::Ty(DType::I64, sym(&["2", "4"]))],
    );
    assert_eq!(e, "node `gatherelements` (GatherElements): indices i64[2,4] is larger than data f32[3,3] in dimension 1");
    let e = err(
        Op::GatherElements { axis: 2 },
        vec![A::Ty(f, sym(&["3", "3"])), A::Ty(DType::I64, sym(&["3", "3"]))],
    );
    assert_eq!(e, "node `gatherelements` (GatherElements): axis 2 is out of range for f32[3,3]");
    let e = err(
        Op::GatherElements { axis: 1 },
        vec![A::In(f32s(&[2, 2], &[1., 2., 3., 4.])), A::In(i64s(&[2, 1], &[0, -3]))],
    );
    assert_eq!(e, "evaluating node `gatherelements` (GatherElements): index -3 is out of range for axis 1 of size 2");
}

// ----- GatherND -----

#[test]
fn gather_nd_elements_slices_and_batch_dims() {
    let x = || i64s(&[2, 2, 2], &[0, 1, 2, 3, 4, 5, 6, 7]);
    let y = run(Op::GatherNd { batch_dims: 0 }, vec![A::In(x()), A::In(i64s(&[2, 1], &[1, 0]))]);
    assert_eq!((y.dims(), vals::<i64>(&y)), (&[2, 2, 2][..], vec![4, 5, 6, 7, 0, 1, 2, 3]));
    // Full tuples give scalars; -1 counts from the end.
    let y = run(
        Op::GatherNd { batch_dims: 0 },
        vec![A::In(x()), A::In(i64s(&[2, 1, 3], &[0, 1, 1, 1, 0, -1]))],
    );
    assert_eq!((y.dims(), vals::<i64>(&y)), (&[2, 1][..], vec![3, 5]));
    let y = run(Op::GatherNd { batch_dims: 1 }, vec![A::In(x()), A::In(i64s(&[2, 1], &[1, 0]))]);
    assert_eq!((y.dims(), vals::<i64>(&y)), (&[2, 2][..], vec![2, 3, 4, 5]));
    let y = run(
        Op::GatherNd { batch_dims: 1 },
        vec![A::In(x()), A::In(i64s(&[2, 2, 2], &[0, 1, 1, 1, 1, 0, 0, 0]))],
    );
    assert_eq!((y.dims(), vals::<i64>(&y)), (&[2, 2][..], vec![1, 3, 6, 4]));
}

#[test]
fn gather_nd_shapes_and_errors() {
    let (f, i) = (DType::F32, DType::I64);
    assert_eq!(
        ty(
            Op::GatherNd { batch_dims: 0 },
            vec![A::Ty(f, sym(&["4", "5", "6"])), A::Ty(i, sym(&["n", "2"]))]
        ),
        "f32[n,6]"
    );
    assert_eq!(
        ty(
            Op::GatherNd { batch_dims: 1 },
            vec![A::Ty(f, sym(&["b", "5", "6"])), A::Ty(i, sym(&["3", "7", "1"]))]
        ),
        "f32[3,7,6]"
    );
    let e = err(
        Op::GatherNd { batch_dims: 0 },
        vec![A::Ty(f, sym(&["4", "5"])), A::Ty(i, sym(&["2", "3"]))],
    );
    assert_eq!(e, "node `gathernd` (GatherND): index tuples of length 3 (indices i64[2,3]) cannot index data f32[4,5] with batch_dims 0");
    let e = err(
        Op::GatherNd { batch_dims: 1 },
        vec![A::Ty(f, sym(&["4", "5"])), A::Ty(i, sym(&["3", "1"]))],
    );
    assert_eq!(e, "node `gathernd` (GatherND): batch dimension 0 differs between data f32[4,5] and indices i64[3,1]");
    let e = err(
        Op::GatherNd { batch_dims: 0 },
        vec![A::Ty(f, sym(&["4", "5"])), A::Ty(i, sym(&["2", "k"]))],
    );
    assert_eq!(
        e,
        "node `gathernd` (GatherND): the last dimension of indices i64[2,k] must be known"
    );
    let e = err(
        Op::GatherNd { batch_dims: 0 },
        vec![A::In(f32s(&[2, 2], &[1., 2., 3., 4.])), A::In(i64s(&[2, 2], &[0, 1, 1, 2]))],
    );
    assert_eq!(
        e,
        "evaluating node `gathernd` (GatherND): index 2 is out of range for axis 1 of size 2"
    );
}

// ----- ScatterElements -----

#[test]
fn scatter_elements_places_updates_along_the_axis() {
    let upd = f32s(&[2, 3], &[1., 1.1, 1.2, 2., 2.1, 2.2]);
    let op = Op::ScatterElements { axis: 0, reduction: ScatterReduction::None };
    let y = run(
        op,
        vec![
            A::In(Tensor::zeros(DType::F32, &[3, 3])),
            A::In(i64s(&[2, 3], &[1, 0, 2, 0, 2, 1])),
            A::In(upd),
        ],
    );
    assert_close(&y, &[3, 3], &[2., 1.1, 0., 1., 0., 2.2, 0., 2.1, 1.2], 1e-7);
}

#[test]
fn scatter_elements_reduces_duplicate_negative_indices() {
    // Indices 1 and -4 are both column 1 of 5; updates 2.1 then 1.1 meet there.
    let case = |r| {
        let op = Op::ScatterElements { axis: 1, reduction: r };
        let idx = i64s(&[1, 4], &[1, -4, 3, -2]);
        run(
            op,
            vec![
                A::In(f32s(&[1, 5], &[1., 2., 3., 4., 5.])),
                A::In(idx),
                A::In(f32s(&[1, 4], &[1.1, 2.1, -3., 0.5])),
            ],
        )
    };
    assert_close(&case(ScatterReduction::None), &[1, 5], &[1., 2.1, 3., 0.5, 5.], 1e-6);
    assert_close(&case(ScatterReduction::Add), &[1, 5], &[1., 5.2, 3., 1.5, 5.], 1e-6);
    assert_close(&case(ScatterReduction::Mul), &[1, 5], &[1., 4.62, 3., -6., 5.], 1e-6);
    assert_close(&case(ScatterReduction::Max), &[1, 5], &[1., 2.1, 3., 4., 5.], 1e-6);
    assert_close(&case(ScatterReduction::Min), &[1, 5], &[1., 1.1, 3., -3., 5.], 1e-6);
}

#[test]
fn scatter_elements_on_integers_wrap_and_bools_combine_logically() {
    let op = |r| Op::ScatterElements { axis: 0, reduction: r };
    let x = || Tensor::vector(&[250u8, 7, 9]);
    let y = run(
        op(ScatterReduction::Add),
        vec![A::In(x()), A::In(i64s(&[2], &[0, 0])), A::In(Tensor::vector(&[3u8, 4]))],
    );
    assert_eq!(vals::<u8>(&y), [1, 7, 9], "250 + 3 + 4 wraps to 1");
    let y = run(
        op(ScatterReduction::Mul),
        vec![A::In(x()), A::In(i64s(&[2], &[2, 1])), A::In(Tensor::vector(&[2u8, 0]))],
    );
    assert_eq!(vals::<u8>(&y), [250, 0, 18]);
    let b = || Tensor::vector(&[true, false, false]);
    let y = run(
        op(ScatterReduction::Max),
        vec![A::In(b()), A::In(i64s(&[2], &[1, 0])), A::In(Tensor::vector(&[true, false]))],
    );
    assert_eq!(vals::<bool>(&y), [true, true, false], "max is or");
    let y = run(
        op(ScatterReduction::Min),
        vec![A::In(b()), A::In(i64s(&[2], &[0, 2])), A::In(Tensor::vector(&[false, true]))],
    );
    assert_eq!(vals::<bool>(&y), [false, false, false], "min is and");
}

#[test]
fn scatter_elements_errors() {
    let f = DType::F32;
    let op = || Op::ScatterElements { axis: 0, reduction: ScatterReduction::None };
    let e = err(
        op(),
        vec![
            A::Ty(f, sym(&["3", "3"])),
            A::Ty(DType::I64, sym(&["2", "3"])),
            A::Ty(f, sym(&["3", "2"])),
        ],
    );
    assert_eq!(e, "node `scatterelements` (ScatterElements): updates f32[3,2] must have the shape of indices i64[2,3]");
    let e = err(
        op(),
        vec![A::Ty(f, sym(&["3"])), A::Ty(DType::I64, sym(&["2"])), A::Ty(DType::F64, sym(&["2"]))],
    );
    assert_eq!(e, "node `scatterelements` (ScatterElements): data and updates must have the same element type, got f32[3] and f64[2]");
    let e = err(
        op(),
        vec![
            A::In(f32s(&[3], &[0., 0., 0.])),
            A::In(i64s(&[2], &[0, 3])),
            A::In(f32s(&[2], &[1., 2.])),
        ],
    );
    assert_eq!(e, "evaluating node `scatterelements` (ScatterElements): index 3 is out of range for axis 0 of size 3");
}

// ----- ScatterND -----

#[test]
fn scatter_nd_writes_slices_and_reduces_duplicates() {
    let x = || i64s(&[2, 2, 2], &[1, 2, 3, 4, 5, 6, 7, 8]);
    let upd = i64s(&[2, 2, 2], &[10, 11, 12, 13, 20, 21, 22, 23]);
    let y = run(
        Op::ScatterNd { reduction: ScatterReduction::None },
        vec![A::In(x()), A::In(i64s(&[2, 1], &[1, 0])), A::In(upd)],
    );
    assert_eq!(vals::<i64>(&y), [20, 21, 22, 23, 10, 11, 12, 13]);
    // Tuples (0,1), (0,1) and (-1,0) = (1,0), each taking a row of 2.
    let case = |r| {
        let idx = i64s(&[3, 2], &[0, 1, 0, 1, -1, 0]);
        vals::<i64>(&run(
            Op::ScatterNd { reduction: r },
            vec![A::In(x()), A::In(idx), A::In(i64s(&[3, 2], &[5, 6, 7, 8, -9, 9]))],
        ))
    };
    assert_eq!(case(ScatterReduction::Add), [1, 2, 15, 18, -4, 15, 7, 8]);
    assert_eq!(case(ScatterReduction::Mul), [1, 2, 105, 192, -45, 54, 7, 8]);
    assert_eq!(case(ScatterReduction::Max), [1, 2, 7, 8, 5, 9, 7, 8]);
    assert_eq!(case(ScatterReduction::Min), [1, 2, 3, 4, -9, 6, 7, 8]);
    assert_eq!(case(ScatterReduction::None), [1, 2, 7, 8, -9, 9, 7, 8], "the last write wins");
}

#[test]
fn scatter_nd_shapes_and_errors() {
    let (f, i) = (DType::F32, DType::I64);
    let op = || Op::ScatterNd { reduction: ScatterReduction::Add };
    assert_eq!(
        ty(
            op(),
            vec![
                A::Ty(f, sym(&["4", "b"])),
                A::Ty(i, sym(&["n", "1"])),
                A::Ty(f, sym(&["n", "b"]))
            ]
        ),
        "f32[4,b]"
    );
    let e = err(
        op(),
        vec![
            A::Ty(f, sym(&["4", "5", "6"])),
            A::Ty(i, sym(&["3", "2"])),
            A::Ty(f, sym(&["3", "5"])),
        ],
    );
    assert_eq!(e, "node `scatternd` (ScatterND): updates f32[3,5] must have shape [3,6] for data f32[4,5,6] and indices i64[3,2]");
    let e =
        err(op(), vec![A::Ty(f, sym(&["4"])), A::Ty(i, sym(&["3", "2"])), A::Ty(f, sym(&["3"]))]);
    assert_eq!(e, "node `scatternd` (ScatterND): index tuples of length 2 (indices i64[3,2]) cannot index data f32[4]");
    let e = err(
        op(),
        vec![
            A::In(f32s(&[2, 2], &[0.; 4])),
            A::In(i64s(&[1, 2], &[-3, 0])),
            A::In(f32s(&[1], &[1.])),
        ],
    );
    assert_eq!(
        e,
        "evaluating node `scatternd` (ScatterND): index -3 is out of range for axis 0 of size 2"
    );
}

// ----- Tile -----

#[test]
fn tile_repeats_each_axis() {
    let x = Tensor::from_slice(&[2, 2], &[1i32, 2, 3, 4]).unwrap();
    let y = run(Op::Tile, vec![A::In(x.clone()), A::K(i64s(&[2], &[2, 3]))]);
    assert_eq!(y.dims(), [4, 6]);
    assert_eq!(
        vals::<i32>(&y),
        [1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4, 1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4]
    );
    // Repeats known only at run time give fresh sizes, and still run.
    let (t, y) = go(Op::Tile, vec![A::In(x), A::In(i64s(&[2], &[1, 0]))]).unwrap();
    assert_eq!(t, r#"i32["tile.d0","tile.d1"]"#);
    assert_eq!(y.unwrap().dims(), [2, 0]);
}

#[test]
fn tile_shapes_and_errors() {
    let f = DType::F32;
    assert_eq!(
        ty(Op::Tile, vec![A::Ty(f, sym(&["b", "3", "c"])), A::K(i64s(&[3], &[1, 2, 0]))]),
        "f32[b,6,0]"
    );
    assert_eq!(
        ty(Op::Tile, vec![A::Ty(f, sym(&["b", "3"])), A::K(i64s(&[2], &[2, 1]))]),
        r#"f32["tile.d0",3]"#
    );
    let e = err(Op::Tile, vec![A::Ty(f, sym(&["2", "3"])), A::K(i64s(&[1], &[2]))]);
    assert_eq!(e, "node `tile` (Tile): repeats [2] must have one entry per dimension of f32[2,3]");
    let e = err(Op::Tile, vec![A::Ty(f, sym(&["2", "3"])), A::K(i64s(&[2], &[2, -1]))]);
    assert_eq!(e, "node `tile` (Tile): repeats [2, -1] has the negative entry -1");
}

// ----- Pad -----

fn pad(mode: PadMode, x: Tensor, pads: &[i64]) -> Tensor {
    run(Op::Pad { mode }, vec![A::In(x), A::K(Tensor::vector(pads)), A::Skip, A::Skip])
}

#[test]
fn pad_in_each_mode() {
    let x = || f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let y = run(
        Op::Pad { mode: PadMode::Constant },
        vec![A::In(x()), A::K(Tensor::vector(&[1i64, 2, 0, 1])), A::K(Tensor::scalar(9.5f32))],
    );
    #[rustfmt::skip]
    assert_close(&y, &[3, 6], &[9.5, 9.5, 9.5, 9.5, 9.5, 9.5, 9.5, 9.5, 1., 2., 3., 9.5, 9.5, 9.5, 4., 5., 6., 9.5], 0.0);
    let y = pad(PadMode::Constant, x(), &[0, 1, 0, 0]);
    assert_close(&y, &[2, 4], &[0., 1., 2., 3., 0., 4., 5., 6.], 0.0);
    // Pads [1, 2] before and [1, 3] after: np.pad(x, ((1, 1), (2, 3)), mode).
    #[rustfmt::skip]
    let reflect = [6., 5., 4., 5., 6., 5., 4., 5., 3., 2., 1., 2., 3., 2., 1., 2., 6., 5., 4., 5., 6., 5., 4., 5., 3., 2., 1., 2., 3., 2., 1., 2.];
    assert_close(&pad(PadMode::Reflect, x(), &[1, 2, 1, 3]), &[4, 8], &reflect, 0.0);
    #[rustfmt::skip]
    let edge = [1., 1., 1., 2., 3., 3., 3., 3., 1., 1., 1., 2., 3., 3., 3., 3., 4., 4., 4., 5., 6., 6., 6., 6., 4., 4., 4., 5., 6., 6., 6., 6.];
    assert_close(&pad(PadMode::Edge, x(), &[1, 2, 1, 3]), &[4, 8], &edge, 0.0);
    #[rustfmt::skip]
    let wrap = [5., 6., 4., 5., 6., 4., 5., 6., 2., 3., 1., 2., 3., 1., 2., 3., 5., 6., 4., 5., 6., 4., 5., 6., 2., 3., 1., 2., 3., 1., 2., 3.];
    assert_close(&pad(PadMode::Wrap, x(), &[1, 2, 1, 3]), &[4, 8], &wrap, 0.0);
}

#[test]
fn pad_longer_than_the_axis_repeats_as_numpy_does() {
    let x = || Tensor::vector(&[1i64, 2, 3]);
    // np.pad([1, 2, 3], 7, mode): reflect and wrap repeat their pattern.
    assert_eq!(
        vals::<i64>(&pad(PadMode::Reflect, x(), &[7, 7])),
        [2, 3, 2, 1, 2, 3, 2, 1, 2, 3, 2, 1, 2, 3, 2, 1, 2]
    );
    assert_eq!(
        vals::<i64>(&pad(PadMode::Wrap, x(), &[7, 7])),
        [3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1]
    );
    assert_eq!(vals::<i64>(&pad(PadMode::Reflect, Tensor::vector(&[5i64]), &[2, 1])), [5, 5, 5, 5]);
}

#[test]
fn pads_at_the_ends_of_the_i64_range_do_not_overflow() {
    // Crop everything from the front, pad i64::MAX at the back: 1 + MIN + MAX = 0 elements.
    let y = pad(PadMode::Constant, Tensor::vector(&[1i64]), &[i64::MIN, i64::MAX]);
    assert_eq!(y.dims(), [0]);
    let y = pad(PadMode::Constant, Tensor::vector(&[1i64, 2]), &[i64::MIN + 1, i64::MAX]);
    // 2 + (MIN + 1) + MAX = 2: everything cropped, two zeros padded.
    assert_eq!((y.dims(), vals::<i64>(&y)), (&[2][..], vec![0, 0]));
}

#[test]
fn negative_pads_crop_before_padding() {
    // Values from onnxruntime 1.31 (numpy's pad has no negative pads): crop, then pad what is left.
    let x = || f32s(&[1, 6], &[1., 2., 3., 4., 5., 6.]);
    let cases: [(PadMode, [i64; 4], &[f64]); 8] = [
        (PadMode::Constant, [0, -1, 0, 3], &[2., 3., 4., 5., 6., 0., 0., 0.]),
        (PadMode::Constant, [0, -2, 0, -1], &[3., 4., 5.]),
        (PadMode::Reflect, [0, -1, 0, 3], &[2., 3., 4., 5., 6., 5., 4., 3.]),
        (PadMode::Reflect, [0, 3, 0, -2], &[4., 3., 2., 1., 2., 3., 4.]),
        (PadMode::Edge, [0, 3, 0, -2], &[1., 1., 1., 1., 2., 3., 4.]),
        (PadMode::Edge, [0, -1, 0, 3], &[2., 3., 4., 5., 6., 6., 6., 6.]),
        (PadMode::Wrap, [0, -1, 0, 3], &[2., 3., 4., 5., 6., 2., 3., 4.]),
        (PadMode::Wrap, [0, 3, 0, -2], &[2., 3., 4., 1., 2., 3., 4.]),
    ];
    for (mode, pads, want) in cases {
        let y = pad(mode, x(), &pads);
        assert_close(&y, &[1, want.len()], want, 0.0);
    }
}

#[test]
fn pad_with_axes_and_an_integer_value() {
    // onnxruntime: Pad(x, pads=[2, -1], value=-7, axes=[-1]).
    let x = Tensor::from_slice(&[2, 3], &[1i32, 2, 3, 4, 5, 6]).unwrap();
    let y = run(
        Op::Pad { mode: PadMode::Constant },
        vec![
            A::In(x),
            A::K(Tensor::vector(&[2i64, -1])),
            A::K(Tensor::scalar(-7i32)),
            A::K(Tensor::vector(&[-1i64])),
        ],
    );
    assert_eq!((y.dims(), vals::<i32>(&y)), (&[2, 4][..], vec![-7, -7, 1, 2, -7, -7, 4, 5]));
}

#[test]
fn pad_shapes_and_errors() {
    let f = DType::F32;
    let op = || Op::Pad { mode: PadMode::Constant };
    let t = ty(
        op(),
        vec![
            A::Ty(f, sym(&["b", "3", "4"])),
            A::K(Tensor::vector(&[0i64, 1, 0, 2])),
            A::Skip,
            A::K(Tensor::vector(&[0i64, 2])),
        ],
    );
    assert_eq!(t, "f32[b,3,7]");
    let t = ty(op(), vec![A::Ty(f, sym(&["b", "3"])), A::K(Tensor::vector(&[1i64, 0, 0, 0]))]);
    assert_eq!(t, r#"f32["pad.d0",3]"#);
    // Pads known at run time: the listed axes get fresh sizes, or every axis without a list.
    let t = ty(
        op(),
        vec![
            A::Ty(f, sym(&["2", "3"])),
            A::Ty(DType::I64, sym(&["2"])),
            A::Skip,
            A::K(Tensor::vector(&[1i64])),
        ],
    );
    assert_eq!(t, r#"f32[2,"pad.d1"]"#);
    assert_eq!(
        ty(op(), vec![A::Ty(f, sym(&["2", "3"])), A::Ty(DType::I64, sym(&["4"]))]),
        r#"f32["pad.d0","pad.d1"]"#
    );
    let e = err(op(), vec![A::Ty(f, sym(&["2", "3"])), A::K(Tensor::vector(&[1i64, 1]))]);
    assert_eq!(e, "node `pad` (Pad): pads [1, 1] must have 2 entries per padded axis (2 axes)");
    let e = err(op(), vec![A::Ty(f, sym(&["2", "3"])), A::K(Tensor::vector(&[0i64, -2, 0, -2]))]);
    assert_eq!(e, "node `pad` (Pad): pads [0, -2, 0, -2] give axis 1 of f32[2,3] the size -1");
    let e = err(
        op(),
        vec![A::Ty(f, sym(&["2"])), A::K(Tensor::vector(&[1i64, 1])), A::K(Tensor::scalar(1.0f64))],
    );
    assert_eq!(e, "node `pad` (Pad): data and the pad value must have the same element type, got f32[2] and f64[]");
    let e = err(
        Op::Pad { mode: PadMode::Edge },
        vec![A::Ty(f, sym(&["2", "0"])), A::K(Tensor::vector(&[0i64, 1, 0, 0]))],
    );
    assert_eq!(e, "node `pad` (Pad): edge padding of axis 1 of f32[2,0] by pads [0, 1, 0, 0] has no elements to copy from");
    // With the pads an input, the same checks happen when the graph runs.
    let e = err(
        Op::Pad { mode: PadMode::Wrap },
        vec![A::In(f32s(&[3], &[1., 2., 3.])), A::In(Tensor::vector(&[-3i64, 1]))],
    );
    assert_eq!(e, "evaluating node `pad` (Pad): wrap padding of axis 0 of f32[3] by pads [-3, 1] has no elements to copy from");
}

// ----- OneHot -----

#[test]
fn one_hot_negative_and_out_of_range_indices() {
    // onnxruntime 1.31: 5 and -5 (outside [-4, 4)) give rows of off values; -1 and -4 count from depth.
    let idx = i64s(&[2, 3], &[0, 3, -1, 5, -4, -5]);
    let y = run(
        Op::OneHot { axis: -1 },
        vec![A::In(idx), A::K(Tensor::scalar(4i64)), A::In(f32s(&[2], &[0., 1.]))],
    );
    #[rustfmt::skip]
    assert_close(&y, &[2, 3, 4], &[1., 0., 0., 0., 0., 0., 0., 1., 0., 0., 0., 1., 0., 0., 0., 0., 1., 0., 0., 0., 0., 0., 0., 0.], 0.0);
}

#[test]
fn one_hot_axis_float_indices_and_depth_and_integer_values() {
    // Float indices and depth are truncated: indices [1, -1, 2] with depth 3 along a new axis 0,
    // so row d holds on where the index is d: [[off, off, off], [on, off, off], [off, on, on]].
    let idx = f32s(&[3], &[1.7, -1.0, 2.2]);
    let values = Tensor::vector(&[-2i32, 7]);
    let y = run(
        Op::OneHot { axis: 0 },
        vec![A::In(idx), A::K(Tensor::vector(&[3.9f32])), A::In(values)],
    );
    assert_eq!((y.dims(), vals::<i32>(&y)), (&[3, 3][..], vec![-2, -2, -2, 7, -2, -2, -2, 7, 7]));
}

#[test]
fn one_hot_shapes_and_errors() {
    let (i, f) = (DType::I64, DType::F32);
    let t = ty(
        Op::OneHot { axis: 1 },
        vec![
            A::Ty(i, sym(&["b", "5"])),
            A::K(Tensor::scalar(10i64)),
            A::Ty(DType::F16, sym(&["2"])),
        ],
    );
    assert_eq!(t, "f16[b,10,5]");
    let t = ty(
        Op::OneHot { axis: -1 },
        vec![A::Ty(i, sym(&["b"])), A::Ty(i, sym(&[])), A::Ty(f, sym(&["2"]))],
    );
    assert_eq!(t, r#"f32[b,"onehot.d1"]"#);
    let e = err(
        Op::OneHot { axis: 3 },
        vec![A::Ty(i, sym(&["2", "3"])), A::K(Tensor::scalar(4i64)), A::Ty(f, sym(&["2"]))],
    );
    assert_eq!(e, "node `onehot` (OneHot): axis 3 is out of range for the result of rank 3 from indices i64[2,3]");
    let e = err(
        Op::OneHot { axis: -1 },
        vec![A::Ty(i, sym(&["2"])), A::K(Tensor::scalar(0i64)), A::Ty(f, sym(&["2"]))],
    );
    assert_eq!(e, "node `onehot` (OneHot): depth must be positive, got 0");
    let e = err(
        Op::OneHot { axis: -1 },
        vec![A::Ty(i, sym(&["2"])), A::K(Tensor::scalar(4i64)), A::Ty(f, sym(&["3"]))],
    );
    assert_eq!(e, "node `onehot` (OneHot): values must be [off_value, on_value], got f32[3]");
}

// ----- Trilu -----

#[test]
fn trilu_keeps_a_triangle_from_diagonal_k() {
    let x = || i64s(&[3, 4], &(1..=12).collect::<Vec<_>>());
    let y = run(Op::Trilu { upper: true }, vec![A::In(x()), A::K(Tensor::scalar(1i64))]);
    assert_eq!(vals::<i64>(&y), [0, 2, 3, 4, 0, 0, 7, 8, 0, 0, 0, 12]);
    let y = run(Op::Trilu { upper: false }, vec![A::In(x()), A::In(Tensor::scalar(-1i64))]);
    assert_eq!(vals::<i64>(&y), [0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0]);
    // Without k: the main diagonal; batched over leading axes.
    let y = run(Op::Trilu { upper: false }, vec![A::In(x()), A::Skip]);
    assert_eq!(vals::<i64>(&y), [1, 0, 0, 0, 5, 6, 0, 0, 9, 10, 11, 0]);
    let y = run(
        Op::Trilu { upper: true },
        vec![A::In(i64s(&[2, 3, 2], &(1..=12).collect::<Vec<_>>())), A::K(Tensor::scalar(-1i64))],
    );
    assert_eq!(vals::<i64>(&y), [1, 2, 3, 4, 0, 6, 7, 8, 9, 10, 0, 12]);
    let y = run(
        Op::Trilu { upper: true },
        vec![A::In(Tensor::from_slice(&[2, 2], &[true; 4]).unwrap()), A::Skip],
    );
    assert_eq!(vals::<bool>(&y), [true, true, false, true]);
    let e = err(Op::Trilu { upper: true }, vec![A::Ty(DType::F32, sym(&["3"])), A::Skip]);
    assert_eq!(e, "node `trilu` (Trilu): the input must have rank at least 2, got f32[3]");
}

// ----- DepthToSpace, SpaceToDepth -----

#[test]
fn depth_to_space_in_both_orders_and_back() {
    let x = || f32s(&[1, 8, 1, 2], &(0..16).map(|v| v as f32).collect::<Vec<_>>());
    let y = run(Op::DepthToSpace { blocksize: 2, crd: false }, vec![A::In(x())]);
    assert_close(
        &y,
        &[1, 2, 2, 4],
        &[0., 4., 1., 5., 8., 12., 9., 13., 2., 6., 3., 7., 10., 14., 11., 15.],
        0.0,
    );
    let y = run(Op::DepthToSpace { blocksize: 2, crd: true }, vec![A::In(x())]);
    assert_close(
        &y,
        &[1, 2, 2, 4],
        &[0., 2., 1., 3., 4., 6., 5., 7., 8., 10., 9., 11., 12., 14., 13., 15.],
        0.0,
    );
    let s = Tensor::from_slice(&[1, 1, 4, 4], &(0..16i16).collect::<Vec<_>>()).unwrap();
    let y = run(Op::SpaceToDepth { blocksize: 2 }, vec![A::In(s.clone())]);
    assert_eq!(
        (y.dims(), vals::<i16>(&y)),
        (&[1, 4, 2, 2][..], vec![0, 2, 8, 10, 1, 3, 9, 11, 4, 6, 12, 14, 5, 7, 13, 15])
    );
    // DCR DepthToSpace undoes SpaceToDepth.
    assert_eq!(run(Op::DepthToSpace { blocksize: 2, crd: false }, vec![A::In(y)]), s);
}

#[test]
fn depth_to_space_shapes_and_errors() {
    let f = DType::F32;
    assert_eq!(
        ty(
            Op::DepthToSpace { blocksize: 2, crd: true },
            vec![A::Ty(f, sym(&["n", "12", "h", "5"]))]
        ),
        r#"f32[n,3,"depthtospace.d2",10]"#
    );
    assert_eq!(
        ty(Op::SpaceToDepth { blocksize: 3 }, vec![A::Ty(f, sym(&["n", "2", "6", "w"]))]),
        r#"f32[n,18,2,"spacetodepth.d3"]"#
    );
    let e = err(
        Op::DepthToSpace { blocksize: 2, crd: false },
        vec![A::Ty(f, sym(&["1", "6", "2", "2"]))],
    );
    assert_eq!(e, "node `depthtospace` (DepthToSpace): channels of f32[1,6,2,2] are not divisible by blocksize 2 squared");
    let e = err(Op::SpaceToDepth { blocksize: 2 }, vec![A::Ty(f, sym(&["1", "1", "4", "5"]))]);
    assert_eq!(e, "node `spacetodepth` (SpaceToDepth): dimension 3 of f32[1,1,4,5] is not divisible by blocksize 2");
    let e = err(Op::SpaceToDepth { blocksize: 2 }, vec![A::Ty(f, sym(&["4", "4"]))]);
    assert_eq!(
        e,
        "node `spacetodepth` (SpaceToDepth): the input must be 4-D [N,C,H,W], got f32[4,4]"
    );
}

// ----- NonZero -----

#[test]
fn non_zero_lists_coordinates_in_row_major_order() {
    // NaN counts as non-zero, -0.0 does not.
    let x = f32s(&[2, 3], &[0., 1.5, -0.0, -2., 0., f32::NAN]);
    let (t, y) = go(Op::NonZero, vec![A::In(x.clone())]).unwrap();
    assert_eq!(t, r#"i64[2,"nonzero.d1"]"#, "the count is data-dependent");
    let y = y.unwrap();
    assert_eq!((y.dims(), vals::<i64>(&y)), (&[2, 3][..], vec![0, 1, 1, 1, 0, 2]));
    // A constant operand's count is known; a scalar is treated as one element of a 1-D tensor.
    assert_eq!(ty(Op::NonZero, vec![A::K(x)]), "i64[2,3]");
    let y = run(Op::NonZero, vec![A::In(Tensor::scalar(3u8))]);
    assert_eq!((y.dims(), vals::<i64>(&y)), (&[1, 1][..], vec![0]));
    let y = run(Op::NonZero, vec![A::In(Tensor::vector(&[false, false]))]);
    assert_eq!(y.dims(), [1, 0]);
}

// ----- Compress -----

#[test]
fn compress_along_an_axis_and_flattened() {
    let x = || Tensor::from_slice(&[2, 3], &[1i8, 2, 3, 4, 5, 6]).unwrap();
    let c = |v: &[bool]| Tensor::vector(v);
    let y = run(Op::Compress { axis: Some(1) }, vec![A::In(x()), A::In(c(&[true, false, true]))]);
    assert_eq!((y.dims(), vals::<i8>(&y)), (&[2, 2][..], vec![1, 3, 4, 6]));
    // A shorter condition drops the rest.
    let y = run(Op::Compress { axis: Some(-1) }, vec![A::In(x()), A::In(c(&[false, true]))]);
    assert_eq!((y.dims(), vals::<i8>(&y)), (&[2, 1][..], vec![2, 5]));
    let y = run(Op::Compress { axis: Some(0) }, vec![A::In(x()), A::In(c(&[false]))]);
    assert_eq!(y.dims(), [0, 3]);
    let y = run(
        Op::Compress { axis: None },
        vec![A::In(x()), A::In(c(&[false, true, true, false, true]))],
    );
    assert_eq!((y.dims(), vals::<i8>(&y)), (&[3][..], vec![2, 3, 5]));
}

#[test]
fn compress_shapes_and_errors() {
    let f = DType::F32;
    let cond = Tensor::vector(&[true, false, true, true]);
    assert_eq!(
        ty(Op::Compress { axis: Some(1) }, vec![A::Ty(f, sym(&["b", "4"])), A::K(cond.clone())]),
        "f32[b,3]"
    );
    assert_eq!(
        ty(Op::Compress { axis: None }, vec![A::Ty(f, sym(&["b", "4"])), A::K(cond)]),
        "f32[3]"
    );
    assert_eq!(
        ty(
            Op::Compress { axis: Some(0) },
            vec![A::Ty(f, sym(&["b", "4"])), A::Ty(DType::Bool, sym(&["b"]))]
        ),
        r#"f32["compress.d0",4]"#
    );
    let e = err(
        Op::Compress { axis: Some(0) },
        vec![A::Ty(f, sym(&["2"])), A::Ty(DType::I64, sym(&["2"]))],
    );
    assert_eq!(e, "node `compress` (Compress): condition must be a 1-D bool tensor, got i64[2]");
    let e = err(
        Op::Compress { axis: Some(0) },
        vec![A::In(f32s(&[2], &[1., 2.])), A::In(Tensor::vector(&[true, false, true]))],
    );
    assert_eq!(e, "evaluating node `compress` (Compress): condition selects index 2, out of range for axis 0 of size 2");
}

// ----- ReverseSequence -----

#[test]
fn reverse_sequence_reverses_each_prefix() {
    // x is [time 4, batch 3]; batch entries reverse their first 4, 2 and 1 steps.
    let x = i64s(&[4, 3], &(0..12).collect::<Vec<_>>());
    let op = Op::ReverseSequence { batch_axis: 1, time_axis: 0 };
    let y = run(op, vec![A::In(x), A::In(i64s(&[3], &[4, 2, 1]))]);
    assert_eq!(vals::<i64>(&y), [9, 4, 2, 6, 1, 5, 3, 7, 8, 0, 10, 11]);
    // Batch-major, and a length of 0 leaves the entry alone.
    let op = Op::ReverseSequence { batch_axis: 0, time_axis: 1 };
    let y = run(
        op,
        vec![A::In(f32s(&[2, 4], &[0., 1., 2., 3., 4., 5., 6., 7.])), A::In(i64s(&[2], &[3, 0]))],
    );
    assert_close(&y, &[2, 4], &[2., 1., 0., 3., 4., 5., 6., 7.], 0.0);
}

#[test]
fn reverse_sequence_errors() {
    let op = || Op::ReverseSequence { batch_axis: 0, time_axis: 1 };
    let e = err(op(), vec![A::Ty(DType::F32, sym(&["2", "4"])), A::Ty(DType::I64, sym(&["3"]))]);
    assert_eq!(e, "node `reversesequence` (ReverseSequence): sequence_lens i64[3] must have one entry per batch entry of f32[2,4] (axis 0)");
    let e = err(
        Op::ReverseSequence { batch_axis: 1, time_axis: 1 },
        vec![A::Ty(DType::F32, sym(&["2", "4"])), A::Ty(DType::I64, sym(&["4"]))],
    );
    assert_eq!(e, "node `reversesequence` (ReverseSequence): batch_axis 1 and time_axis 1 must be 0 and 1 in some order");
    let e = err(op(), vec![A::In(f32s(&[2, 2], &[0.; 4])), A::In(i64s(&[2], &[1, 3]))]);
    assert_eq!(e, "evaluating node `reversesequence` (ReverseSequence): sequence_lens[1] = 3 is out of range for a time axis of size 2");
}
