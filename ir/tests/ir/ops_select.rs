//! NonMaxSuppression and Unique, whose result sizes depend on the data.
//!
//! Expected values are hand-computed (the intersections over union are worked in the comments);
//! Unique's agree with numpy's `np.unique(..., return_index, return_inverse, return_counts)`.

use kiln_ir::builder::GraphBuilder;
use kiln_ir::{eval, DType, Dim, Op, Shape, Tensor};

use super::f32s;

/// One operand of a test node: a graph input, a constant, a typed input only, or omitted.
enum A {
    In(Tensor),
    K(Tensor),
    Ty(DType, Shape),
    Skip,
}

/// Builds a one-node graph with `n_out` results; returns their types and, when every operand
/// has a value, the interpreter's results. Errors are the graph's or the interpreter's messages.
fn go(op: Op, args: Vec<A>, n_out: usize) -> Result<(Vec<String>, Option<Vec<Tensor>>), String> {
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
    for (i, y) in g.apply(op, &xs, n_out).into_iter().enumerate() {
        g.output(&format!("y{i}"), y);
    }
    let graph = g.build().map_err(|e| e.to_string())?;
    let types = graph.outputs().iter().map(|(_, v)| graph.value_type(*v).to_string()).collect();
    if !runnable {
        return Ok((types, None));
    }
    let out = eval::run(&graph, &inputs).map_err(|e| e.to_string())?;
    Ok((types, Some(out)))
}

#[track_caller]
fn run(op: Op, args: Vec<A>, n_out: usize) -> Vec<Tensor> {
    match go(op, args, n_out) {
        Ok((_, Some(t))) => t,
        Ok((ty, None)) => panic!("nothing to run (types {ty:?})"),
        Err(e) => panic!("{e}"),
    }
}

#[track_caller]
fn types(op: Op, args: Vec<A>, n_out: usize) -> Vec<String> {
    go(op, args, n_out).unwrap_or_else(|e| panic!("{e}")).0
}

#[track_caller]
fn err(op: Op, args: Vec<A>) -> String {
    match go(op, args, 1) {
        Ok((ty, _)) => panic!("expected an error, got results of types {ty:?}"),
        Err(e) => e,
    }
}

fn vals<T: kiln_ir::Element>(t: &Tensor) -> Vec<T> {
    t.as_slice::<T>().unwrap().to_vec()
}

fn sym(dims: &[&str]) -> Shape {
    Shape(
        dims.iter()
            .map(|d| d.parse::<usize>().map(Dim::Fixed).unwrap_or_else(|_| Dim::sym(d)))
            .collect(),
    )
}

// ----- NonMaxSuppression -----

fn nms() -> Op {
    Op::NonMaxSuppression { center_point_box: false }
}

/// Three boxes `[y1, x1, y2, x2]`: the first two overlap with IoU 0.9 / 1.1 = 0.818 (x in
/// [0.1, 1] by y in [0, 1] of two unit squares), the third is apart.
fn three_boxes() -> Tensor {
    f32s(&[1, 3, 4], &[0., 0., 1., 1., 0., 0.1, 1., 1.1, 0., 2., 1., 3.])
}

fn scalar_i64(v: i64) -> A {
    A::In(Tensor::scalar(v))
}

fn scalar_f32(v: f32) -> A {
    A::In(Tensor::scalar(v))
}

/// The selected rows `[batch, class, box]` of one NonMaxSuppression.
#[track_caller]
fn selected(op: Op, args: Vec<A>) -> Vec<[i64; 3]> {
    let y = run(op, args, 1).remove(0);
    assert_eq!(y.dims()[1], 3);
    vals::<i64>(&y).chunks(3).map(|r| [r[0], r[1], r[2]]).collect()
}

#[test]
fn nms_keeps_the_best_box_of_each_overlapping_group() {
    let scores = || A::In(f32s(&[1, 1, 3], &[0.9, 0.8, 0.7]));
    let args =
        |max: i64, iou: f32| vec![A::In(three_boxes()), scores(), scalar_i64(max), scalar_f32(iou)];
    // 0.818 > 0.5: box 1 goes with box 0.
    assert_eq!(selected(nms(), args(10, 0.5)), [[0, 0, 0], [0, 0, 2]]);
    // 0.818 <= 0.9: all three, by falling score.
    assert_eq!(selected(nms(), args(10, 0.9)), [[0, 0, 0], [0, 0, 1], [0, 0, 2]]);
    // At most one a class.
    assert_eq!(selected(nms(), args(1, 0.5)), [[0, 0, 0]]);
    // None when the count is absent, zero or negative.
    for max in [A::Skip, scalar_i64(0), scalar_i64(-3)] {
        let y = run(nms(), vec![A::In(three_boxes()), scores(), max], 1).remove(0);
        assert_eq!(y.dims(), [0, 3]);
    }
    // Boxes scoring at or below the score threshold are never candidates.
    let with_score =
        vec![A::In(three_boxes()), scores(), scalar_i64(10), scalar_f32(0.95), scalar_f32(0.7)];
    assert_eq!(selected(nms(), with_score), [[0, 0, 0], [0, 0, 1]]);
}

#[test]
fn nms_orders_ties_by_index_and_reads_corners_in_any_order() {
    // Equal scores keep the lower index first.
    let scores = A::In(f32s(&[1, 1, 3], &[0.5, 0.5, 0.5]));
    let args = vec![A::In(three_boxes()), scores, scalar_i64(5), scalar_f32(1.0)];
    assert_eq!(selected(nms(), args), [[0, 0, 0], [0, 0, 1], [0, 0, 2]]);
    // The same boxes given by their other corners.
    let flipped = f32s(&[1, 3, 4], &[1., 1., 0., 0., 1., 1.1, 0., 0.1, 1., 3., 0., 2.]);
    let scores = A::In(f32s(&[1, 1, 3], &[0.7, 0.8, 0.9]));
    let args = vec![A::In(flipped), scores, scalar_i64(5), scalar_f32(0.5)];
    assert_eq!(selected(nms(), args), [[0, 0, 2], [0, 0, 1]]);
}

#[test]
fn nms_reads_centre_boxes_and_goes_batch_by_class() {
    // [x_centre, y_centre, width, height]: the same three boxes.
    let centred = [0.5, 0.5, 1., 1., 0.6, 0.5, 1., 1., 2.5, 0.5, 1., 1.];
    let two = f32s(&[2, 3, 4], &[centred, centred].concat());
    // Batch 0: class 0 prefers box 1, class 1 box 2; batch 1: class 0 box 0, class 1 nothing
    // above the score threshold.
    let scores = f32s(&[2, 2, 3], &[0.2, 0.9, 0.1, 0.1, 0.2, 0.8, 0.9, 0.8, 0.7, 0., 0., 0.]);
    let args = vec![A::In(two), A::In(scores), scalar_i64(3), scalar_f32(0.5), scalar_f32(0.05)];
    let op = Op::NonMaxSuppression { center_point_box: true };
    assert_eq!(
        selected(op, args),
        [[0, 0, 1], [0, 0, 2], [0, 1, 2], [0, 1, 1], [1, 0, 0], [1, 0, 2]]
    );
}

#[test]
fn nms_shapes_and_errors() {
    let f = DType::F32;
    let t = types(nms(), vec![A::Ty(f, sym(&["b", "n", "4"])), A::Ty(f, sym(&["b", "c", "n"]))], 1);
    assert_eq!(t, [r#"i64["nonmaxsuppression.d0",3]"#]);
    // Constant operands are selected when the graph is built (IoU threshold 0: any overlap
    // suppresses, so box 1 goes).
    let scores = A::K(f32s(&[1, 1, 3], &[0.9, 0.8, 0.7]));
    let t = types(nms(), vec![A::K(three_boxes()), scores, A::K(Tensor::scalar(9i64))], 1);
    assert_eq!(t, ["i64[2,3]"]);
    let e = err(nms(), vec![A::Ty(f, sym(&["1", "3", "5"])), A::Ty(f, sym(&["1", "1", "3"]))]);
    assert_eq!(
        e,
        "node `nonmaxsuppression` (NonMaxSuppression): boxes must be [B, N, 4] and scores [B, C, N], got f32[1,3,5] and f32[1,1,3]"
    );
    let e = err(nms(), vec![A::Ty(f, sym(&["1", "3", "4"])), A::Ty(f, sym(&["1", "1", "2"]))]);
    assert!(e.contains("boxes must be [B, N, 4]"), "{e}");
    let e =
        err(nms(), vec![A::Ty(DType::I64, sym(&["1", "3", "4"])), A::Ty(f, sym(&["1", "1", "3"]))]);
    assert!(e.contains("boxes and scores must be floats of one type"), "{e}");
    let e = err(
        nms(),
        vec![A::In(three_boxes()), A::In(f32s(&[1, 1, 3], &[1., 1., 1.])), scalar_f32(2.)],
    );
    assert!(e.contains("max_output_boxes_per_class must be an integer, got f32[]"), "{e}");
    let e = err(
        nms(),
        vec![
            A::In(three_boxes()),
            A::In(f32s(&[1, 1, 3], &[1., 1., 1.])),
            A::In(Tensor::vector(&[1i64, 2])),
        ],
    );
    assert!(e.contains("max_output_boxes_per_class must be a scalar"), "{e}");
    let e = err(
        nms(),
        vec![
            A::In(three_boxes()),
            A::In(f32s(&[1, 1, 3], &[1., 1., 1.])),
            scalar_i64(1),
            scalar_f32(1.5),
        ],
    );
    assert_eq!(
        e,
        "evaluating node `nonmaxsuppression` (NonMaxSuppression): iou_threshold 1.5 is outside [0, 1]"
    );
}

// ----- Unique -----

fn unique(axis: Option<i64>, sorted: bool) -> Op {
    Op::Unique { axis, sorted }
}

/// `(y, indices, inverse_indices, counts)` with the three index results as i64 vectors.
#[track_caller]
fn unique_of(op: Op, x: Tensor) -> (Tensor, Vec<i64>, Vec<i64>, Vec<i64>) {
    let r = run(op, vec![A::In(x)], 4);
    (r[0].clone(), vals(&r[1]), vals(&r[2]), vals(&r[3]))
}

#[test]
fn unique_flattened_sorted_and_in_first_order() {
    let x = || f32s(&[2, 3], &[2., 1., 1., 3., 4., 3.]);
    let (y, first, inverse, counts) = unique_of(unique(None, true), x());
    assert_eq!((y.dims(), vals::<f32>(&y)), (&[4][..], vec![1., 2., 3., 4.]));
    assert_eq!(
        (first, inverse, counts),
        (vec![1, 0, 3, 4], vec![1, 0, 0, 2, 3, 2], vec![2, 1, 2, 1])
    );
    let (y, first, inverse, counts) = unique_of(unique(None, false), x());
    assert_eq!(vals::<f32>(&y), [2., 1., 3., 4.]);
    assert_eq!(
        (first, inverse, counts),
        (vec![0, 1, 3, 4], vec![0, 1, 1, 2, 3, 2], vec![1, 2, 2, 1])
    );
}

#[test]
fn unique_slices_along_an_axis() {
    let x = Tensor::from_slice(&[3, 3], &[1i32, 0, 0, 1, 0, 0, 2, 3, 4]).unwrap();
    let (y, first, inverse, counts) = unique_of(unique(Some(0), true), x);
    assert_eq!((y.dims(), vals::<i32>(&y)), (&[2, 3][..], vec![1, 0, 0, 2, 3, 4]));
    assert_eq!((first, inverse, counts), (vec![0, 2], vec![0, 0, 1], vec![2, 1]));
    // Columns [1, 2], [0, 0], [1, 2]: [0, 0] sorts first.
    let x = || Tensor::from_slice(&[2, 3], &[1i32, 0, 1, 2, 0, 2]).unwrap();
    let (y, first, inverse, counts) = unique_of(unique(Some(-1), true), x());
    assert_eq!((y.dims(), vals::<i32>(&y)), (&[2, 2][..], vec![0, 1, 0, 2]));
    assert_eq!((first, inverse, counts), (vec![1, 0], vec![1, 0, 1], vec![1, 2]));
    let (y, first, ..) = unique_of(unique(Some(1), false), x());
    assert_eq!((vals::<i32>(&y), first), (vec![1, 0, 2, 0], vec![0, 1]));
}

#[test]
fn unique_compares_nans_signed_zeros_and_wide_integers_as_numpy() {
    // NaNs are one entry, after the numbers; -0.0 is 0.0 (the first one found is kept).
    let x = f32s(&[5], &[f32::NAN, 0.0, -0.0, f32::NAN, 1.]);
    let (y, first, inverse, counts) = unique_of(unique(None, true), x);
    let y = vals::<f32>(&y);
    assert_eq!((y.len(), y[0].to_bits(), y[1]), (3, 0f32.to_bits(), 1.));
    assert!(y[2].is_nan());
    assert_eq!((first, inverse, counts), (vec![1, 4, 0], vec![2, 0, 0, 2, 1], vec![2, 1, 2]));
    // Integers compare exactly (in f64 these two would be equal).
    let x = Tensor::vector(&[i64::MAX, i64::MAX - 1, i64::MAX]);
    let (y, _, _, counts) = unique_of(unique(None, true), x);
    assert_eq!((vals::<i64>(&y), counts), (vec![i64::MAX - 1, i64::MAX], vec![1, 2]));
}

#[test]
fn unique_shapes_and_errors() {
    let f = DType::F32;
    let t = types(unique(None, true), vec![A::Ty(f, sym(&["n"]))], 4);
    assert_eq!(t, [r#"f32["unique.d0"]"#, r#"i64["unique.d0"]"#, "i64[n]", r#"i64["unique.d0"]"#]);
    let t = types(unique(Some(1), true), vec![A::Ty(f, sym(&["2", "b", "3"]))], 4);
    assert_eq!(
        t,
        [r#"f32[2,"unique.d1",3]"#, r#"i64["unique.d1"]"#, "i64[b]", r#"i64["unique.d1"]"#]
    );
    let t = types(unique(None, true), vec![A::K(f32s(&[2, 2], &[1., 1., 2., 1.]))], 4);
    assert_eq!(t, ["f32[2]", "i64[2]", "i64[4]", "i64[2]"]);
    let e = err(unique(Some(2), true), vec![A::Ty(f, sym(&["2", "3"]))]);
    assert!(e.starts_with("node `unique` (Unique): axis 2"), "{e}");
}
