//! Native code for the indexing family and Resize against the interpreter: small graphs per op,
//! several dtypes, the edge cases the interpreter defines (negative indices, duplicate scatter
//! updates in order, negative pads, extrapolation, integer rounding), and outputs large enough
//! to be split into workgroups.

use kiln_ir::builder::GraphBuilder;
use kiln_ir::op::{
    CoordinateTransform, NearestMode, PadMode, Resize, ResizeMode, ScatterReduction,
};
use kiln_ir::{DType, Graph, Op, Tensor};

use crate::compile::check_against_eval;

/// Deterministic integers in `lo..hi`.
fn ints(n: usize, lo: i64, hi: i64, seed: u64) -> Vec<i64> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            lo + ((s >> 33) % (hi - lo) as u64) as i64
        })
        .collect()
}

fn i64s(dims: &[usize], v: Vec<i64>) -> Tensor {
    Tensor::from_vec(dims, v).unwrap()
}

fn i32s(dims: &[usize], v: Vec<i64>) -> Tensor {
    Tensor::from_vec(dims, v.into_iter().map(|x| x as i32).collect::<Vec<i32>>()).unwrap()
}

/// One op on graph inputs `x` (data) and the given extra operands (inputs or constants).
enum Operand {
    Input(Tensor),
    Const(Tensor),
    Absent,
}

/// Builds `op(x, operands...)` with `x` and every `Input` as graph inputs, checks it natively.
fn check_op(op: Op, x: Tensor, operands: Vec<Operand>, threads: usize, tol: f64) -> Graph {
    let g = GraphBuilder::new("t");
    let xi = g.input("x", x.dtype(), x.dims());
    let mut inputs = vec![x];
    let mut ops = vec![Some(xi)];
    for (i, o) in operands.into_iter().enumerate() {
        ops.push(match o {
            Operand::Input(t) => {
                let v = g.input(&format!("in{i}"), t.dtype(), t.dims());
                inputs.push(t);
                Some(v)
            }
            Operand::Const(t) => Some(g.constant(&format!("c{i}"), t)),
            Operand::Absent => None,
        });
    }
    let y = g.apply(op, &ops, 1)[0];
    g.output("y", y);
    let graph = g.build().unwrap();
    check_against_eval(&graph, &inputs, threads, tol);
    graph
}

use Operand::{Absent, Const, Input};

#[test]
fn gather_elements_negative_indices_and_dtypes() {
    for (dtype, axis) in
        [(DType::F32, 1), (DType::F16, 0), (DType::U8, -1), (DType::Bool, 2), (DType::I64, 1)]
    {
        let x = Tensor::random(dtype, &[3, 4, 5], 1);
        let a = if axis < 0 { 2 } else { axis as usize };
        let n = [3, 4, 5][a] as i64;
        // Indices smaller than the data off the axis, as onnxruntime allows.
        let idx_dims = [3, 2, 5];
        let idx = ints(30, -n, n, 7);
        let idx = if dtype == DType::U8 { i32s(&idx_dims, idx) } else { i64s(&idx_dims, idx) };
        check_op(Op::GatherElements { axis }, x, vec![Input(idx)], 1, 0.0);
    }
}

#[test]
fn gather_nd_with_batch_dims() {
    // batch_dims 0, tuples of 2 into [4, 5, 3]: slices of 3.
    let x = Tensor::random(DType::F32, &[4, 5, 3], 2);
    let mut idx = Vec::new();
    for (i, j) in ints(6, -4, 4, 1).into_iter().zip(ints(6, -5, 5, 2)) {
        idx.push(i);
        idx.push(j);
    }
    check_op(Op::GatherNd { batch_dims: 0 }, x, vec![Input(i64s(&[2, 3, 2], idx))], 1, 0.0);
    // batch_dims 1, full tuples: one element each.
    let x = Tensor::random(DType::I32, &[2, 3, 4], 3);
    let idx = vec![0, 1, 2, 3, -1, -1, 1, 0];
    check_op(Op::GatherNd { batch_dims: 1 }, x, vec![Input(i32s(&[2, 2, 2], idx))], 1, 0.0);
    // batch_dims 2 of an f64 tensor.
    let x = Tensor::random(DType::F64, &[2, 3, 4, 2], 4);
    let idx = ints(6, -4, 4, 5);
    check_op(Op::GatherNd { batch_dims: 2 }, x, vec![Const(i64s(&[2, 3, 1], idx))], 1, 0.0);
}

#[test]
fn scatter_elements_applies_duplicates_in_order() {
    use ScatterReduction as R;
    for (dtype, reduction) in [
        (DType::F32, R::None),
        (DType::F32, R::Add),
        (DType::F16, R::Mul),
        (DType::I32, R::Max),
        (DType::U8, R::Min),
        (DType::I64, R::Add),
        (DType::Bool, R::Add),
        (DType::Bool, R::Min),
        (DType::F64, R::Max),
    ] {
        for axis in [0i64, -1] {
            let x = Tensor::random(dtype, &[4, 6], 11);
            let n = if axis == 0 { 4 } else { 6 };
            // Many updates on few positions: duplicates everywhere.
            let idx = i64s(&[3, 5], ints(15, -n, n, 3));
            let upd = Tensor::random(dtype, &[3, 5], 12);
            check_op(
                Op::ScatterElements { axis, reduction },
                x,
                vec![Input(idx), Input(upd)],
                1,
                0.0,
            );
        }
    }
}

#[test]
fn scatter_elements_with_nan_max() {
    let x = Tensor::from_vec(&[4], vec![1.0f32, f32::NAN, -0.0, 2.0]).unwrap();
    let idx = i64s(&[5], vec![0, 1, 2, 3, 0]);
    let upd = Tensor::from_vec(&[5], vec![f32::NAN, 5.0f32, 0.0, 1.0, 7.0]).unwrap();
    for reduction in [ScatterReduction::Max, ScatterReduction::Min] {
        check_op(
            Op::ScatterElements { axis: 0, reduction },
            x.clone(),
            vec![Input(idx.clone()), Input(upd.clone())],
            1,
            0.0,
        );
    }
}

#[test]
fn scatter_nd_slices_and_reductions() {
    use ScatterReduction as R;
    for reduction in [R::None, R::Add, R::Mul, R::Max, R::Min] {
        // Tuples of 1 into [4, 3, 2]: slices [3, 2], with a duplicate.
        let x = Tensor::random(DType::F32, &[4, 3, 2], 1);
        let idx = i64s(&[3, 1], vec![1, -1, 1]);
        let upd = Tensor::random(DType::F32, &[3, 3, 2], 2);
        check_op(Op::ScatterNd { reduction }, x, vec![Input(idx), Input(upd)], 1, 0.0);
        // Full tuples into an i16 tensor.
        let x = Tensor::random(DType::I16, &[3, 4], 3);
        let idx = i32s(&[2, 2, 2], vec![0, 0, 2, 3, 0, 0, -1, -4]);
        let upd = Tensor::random(DType::I16, &[2, 2], 4);
        check_op(Op::ScatterNd { reduction }, x, vec![Input(idx), Input(upd)], 1, 0.0);
    }
}

#[test]
fn scatter_large_runs_as_one_workgroup() {
    // Large enough to be distributed if it were not sequential.
    let x = Tensor::random(DType::F32, &[256, 128], 1);
    let idx = i64s(&[64, 128], ints(64 * 128, -256, 256, 9));
    let upd = Tensor::random(DType::F32, &[64, 128], 2);
    check_op(
        Op::ScatterElements { axis: 0, reduction: ScatterReduction::Add },
        x,
        vec![Input(idx), Input(upd)],
        4,
        1e-6,
    );
}

#[test]
fn tile_dtypes_and_workgroups() {
    for dtype in [DType::F32, DType::U8, DType::Bool, DType::BF16] {
        let x = Tensor::random(dtype, &[2, 3, 4], 5);
        check_op(Op::Tile, x, vec![Const(i64s(&[3], vec![2, 1, 3]))], 1, 0.0);
    }
    let x = Tensor::random(DType::F32, &[3, 50, 7], 6);
    check_op(Op::Tile, x, vec![Const(i64s(&[3], vec![4, 3, 5]))], 4, 0.0);
    // Zero repeats: an empty result.
    let x = Tensor::random(DType::F32, &[2, 3], 6);
    check_op(Op::Tile, x, vec![Const(i64s(&[2], vec![0, 2]))], 1, 0.0);
}

#[test]
fn tile_with_an_elementwise_consumer() {
    let g = GraphBuilder::new("t");
    let x = g.input("x", DType::F32, [4, 60]);
    let reps = g.constant("reps", i64s(&[2], vec![30, 3]));
    let y = g.apply(Op::Tile, &[Some(x), Some(reps)], 1)[0].relu();
    g.output("y", y);
    let graph = g.build().unwrap();
    check_against_eval(&graph, &[Tensor::random(DType::F32, &[4, 60], 3)], 2, 0.0);
}

#[test]
fn pad_modes_negative_pads_and_axes() {
    let modes = [PadMode::Constant, PadMode::Reflect, PadMode::Edge, PadMode::Wrap];
    for mode in modes {
        for (pads, axes) in [
            (vec![1i64, 2, 2, 0], None),
            (vec![0, 7, 0, 5], None),
            (vec![-1, 1, 2, -2], None),
            (vec![2, 3], Some(vec![-1i64])),
            (vec![0, 0, 0, 0], None),
        ] {
            let x = Tensor::random(DType::F32, &[3, 4], 2);
            let n = pads.len();
            let axes = axes.map(|a: Vec<i64>| Const(i64s(&[a.len()], a))).unwrap_or(Absent);
            let value = Input(Tensor::scalar(2.5f32));
            check_op(Op::Pad { mode }, x, vec![Const(i64s(&[n], pads)), value, axes], 1, 0.0);
        }
    }
    // Other dtypes, without a pad value (zero) and with one.
    for dtype in [DType::I64, DType::F16, DType::Bool, DType::U16] {
        let x = Tensor::random(dtype, &[2, 3, 2], 3);
        check_op(
            Op::Pad { mode: PadMode::Constant },
            x.clone(),
            vec![Const(i64s(&[6], vec![0, 1, 1, 1, 0, 2]))],
            1,
            0.0,
        );
        check_op(
            Op::Pad { mode: PadMode::Reflect },
            x,
            vec![Const(i64s(&[6], vec![1, 2, 1, 1, 4, 1]))],
            1,
            0.0,
        );
    }
    let x = Tensor::random(DType::I32, &[2, 3], 3);
    check_op(
        Op::Pad { mode: PadMode::Constant },
        x,
        vec![Const(i64s(&[4], vec![1, 1, 1, 1])), Input(Tensor::vector(&[-7i32]))],
        1,
        0.0,
    );
}

#[test]
fn pad_large_image_in_workgroups() {
    for mode in [PadMode::Constant, PadMode::Reflect, PadMode::Edge, PadMode::Wrap] {
        let x = Tensor::random(DType::F32, &[1, 3, 96, 80], 4);
        check_op(
            Op::Pad { mode },
            x,
            vec![Const(i64s(&[8], vec![0, 0, 3, 2, 0, 0, 4, 5]))],
            4,
            0.0,
        );
    }
}

#[test]
fn one_hot_axes_and_index_types() {
    // Float indices truncate; negatives count from the end; out of range ones stay off.
    let idx = Tensor::from_vec(&[2, 3], vec![0.0f32, 2.7, -1.0, 5.0, -6.0, 3.9]).unwrap();
    let values = Tensor::vector(&[0.5f32, 3.0]);
    for axis in [-1i64, 0, 1] {
        check_op(
            Op::OneHot { axis },
            idx.clone(),
            vec![Const(Tensor::scalar(5i64)), Input(values.clone())],
            1,
            0.0,
        );
    }
    let idx = i32s(&[4], vec![1, -2, 3, 9]);
    check_op(
        Op::OneHot { axis: 0 },
        idx,
        vec![Const(Tensor::vector(&[4i64])), Input(Tensor::vector(&[7i64, -3]))],
        1,
        0.0,
    );
}

#[test]
fn trilu_with_constant_and_runtime_k() {
    for upper in [true, false] {
        for k in [-2i64, 0, 1, 5] {
            let x = Tensor::random(DType::F32, &[2, 3, 5], 1);
            check_op(Op::Trilu { upper }, x.clone(), vec![Const(Tensor::scalar(k))], 1, 0.0);
            check_op(Op::Trilu { upper }, x, vec![Input(Tensor::scalar(k))], 1, 0.0);
        }
        let x = Tensor::random(DType::Bool, &[4, 4], 2);
        check_op(Op::Trilu { upper }, x, vec![], 1, 0.0);
        let x = Tensor::random(DType::I64, &[2, 200, 100], 3);
        check_op(Op::Trilu { upper }, x, vec![Input(Tensor::vector(&[-3i64]))], 4, 0.0);
    }
}

#[test]
fn depth_to_space_and_back() {
    for crd in [false, true] {
        for dtype in [DType::F32, DType::F64, DType::I8] {
            let x = Tensor::random(dtype, &[2, 8, 3, 2], 1);
            check_op(Op::DepthToSpace { blocksize: 2, crd }, x, vec![], 1, 0.0);
        }
        let x = Tensor::random(DType::F32, &[1, 18, 40, 40], 2);
        check_op(Op::DepthToSpace { blocksize: 3, crd }, x, vec![], 4, 0.0);
    }
    for dtype in [DType::F32, DType::U32] {
        let x = Tensor::random(dtype, &[2, 3, 4, 6], 3);
        check_op(Op::SpaceToDepth { blocksize: 2 }, x, vec![], 1, 0.0);
    }
}

#[test]
fn eye_like_diagonals_and_dtypes() {
    for (dtype, k) in [
        (None, 0i64),
        (Some(DType::I32), -1),
        (Some(DType::Bool), 2),
        (Some(DType::F16), 7),
        (None, i64::MIN),
    ] {
        let x = Tensor::random(DType::F32, &[4, 6], 1);
        check_op(Op::EyeLike { dtype, k }, x, vec![], 1, 0.0);
    }
}

#[test]
fn reverse_sequence_both_layouts() {
    let x = Tensor::random(DType::F32, &[4, 3, 2], 1);
    check_op(
        Op::ReverseSequence { batch_axis: 1, time_axis: 0 },
        x,
        vec![Input(i64s(&[3], vec![4, 0, 2]))],
        1,
        0.0,
    );
    let x = Tensor::random(DType::I16, &[3, 5], 2);
    check_op(
        Op::ReverseSequence { batch_axis: 0, time_axis: 1 },
        x,
        vec![Input(i32s(&[3], vec![1, 5, 3]))],
        1,
        0.0,
    );
}

/// Range and ConstantOfShape are folded unless their result is larger than the folding limit.
#[test]
fn range_and_constant_of_shape_past_the_folding_limit() {
    let n = kiln_ir::fold::FOLD_LIMIT + 3;
    let g = GraphBuilder::new("t");
    let x = g.input("x", DType::F32, [1]);
    let start = g.constant("start", Tensor::scalar(0.5f32));
    let limit = g.constant("limit", Tensor::scalar(0.5f32 + 0.25 * n as f32));
    let delta = g.constant("delta", Tensor::scalar(0.25f32));
    let r = g.apply(Op::Range, &[Some(start), Some(limit), Some(delta)], 1)[0];
    let shape = g.constant("shape", i64s(&[1], vec![n as i64]));
    let c = g.apply(Op::ConstantOfShape { value: Tensor::vector(&[7u8]) }, &[Some(shape)], 1)[0];
    // An elementwise consumer fuses into the Range kernel.
    g.output("r", r.add(x));
    g.output("c", c);
    let graph = g.build().unwrap();
    check_against_eval(&graph, &[Tensor::vector(&[1.0f32])], 2, 0.0);
}

fn resize(mode: ResizeMode, ct: CoordinateTransform) -> Resize {
    Resize { mode, coordinate_transform: ct, ..Resize::default() }
}

/// Resize of `x` by scales (f32) or sizes (i64), on all axes or on `axes`.
fn check_resize(
    r: Resize,
    x: Tensor,
    roi: Option<Vec<f32>>,
    scales: Option<Vec<f32>>,
    sizes: Option<Vec<i64>>,
    threads: usize,
    tol: f64,
) {
    let roi = roi.map_or(Absent, |v| Const(Tensor::vector(&v)));
    let scales = scales.map_or(Absent, |v| Const(Tensor::vector(&v)));
    let sizes = sizes.map_or(Absent, |v| Const(Tensor::vector(&v)));
    check_op(Op::Resize(r), x, vec![roi, scales, sizes], threads, tol);
}

#[test]
fn resize_modes_and_transforms() {
    use CoordinateTransform as C;
    let transforms =
        [C::HalfPixel, C::HalfPixelSymmetric, C::PytorchHalfPixel, C::AlignCorners, C::Asymmetric];
    for mode in [ResizeMode::Nearest, ResizeMode::Linear, ResizeMode::Cubic] {
        for ct in transforms {
            let x = Tensor::random(DType::F32, &[1, 2, 4, 5], 1);
            check_resize(
                resize(mode, ct),
                x.clone(),
                None,
                Some(vec![1.0, 1.0, 1.7, 0.6]),
                None,
                1,
                1e-6,
            );
            check_resize(resize(mode, ct), x, None, None, Some(vec![1, 2, 3, 9]), 1, 1e-6);
        }
    }
    for nearest_mode in [
        NearestMode::RoundPreferFloor,
        NearestMode::RoundPreferCeil,
        NearestMode::Floor,
        NearestMode::Ceil,
    ] {
        let r = Resize { nearest_mode, ..resize(ResizeMode::Nearest, C::Asymmetric) };
        check_resize(
            r,
            Tensor::random(DType::F32, &[1, 1, 3, 4], 2),
            None,
            Some(vec![1.0, 1.0, 2.5, 1.5]),
            None,
            1,
            0.0,
        );
    }
}

#[test]
fn resize_antialias_exclude_outside_and_axes() {
    for mode in [ResizeMode::Linear, ResizeMode::Cubic] {
        let r = Resize { antialias: true, ..resize(mode, CoordinateTransform::HalfPixel) };
        check_resize(
            r,
            Tensor::random(DType::F32, &[1, 1, 16, 12], 3),
            None,
            Some(vec![1.0, 1.0, 0.3, 0.6]),
            None,
            1,
            1e-6,
        );
    }
    let r = Resize {
        exclude_outside: true,
        cubic_coeff_a: -0.5,
        ..resize(ResizeMode::Cubic, CoordinateTransform::HalfPixel)
    };
    check_resize(
        r,
        Tensor::random(DType::F32, &[1, 1, 4, 4], 4),
        None,
        Some(vec![1.0, 1.0, 0.8, 1.6]),
        None,
        1,
        1e-6,
    );
    let r = Resize {
        axes: vec![3, 2],
        ..resize(ResizeMode::Linear, CoordinateTransform::AlignCorners)
    };
    check_resize(
        r,
        Tensor::random(DType::F32, &[2, 1, 4, 4], 5),
        None,
        None,
        Some(vec![7, 3]),
        1,
        1e-6,
    );
}

#[test]
fn resize_tf_crop_and_resize_extrapolates() {
    let r = Resize {
        extrapolation_value: 10.0,
        ..resize(ResizeMode::Linear, CoordinateTransform::TfCropAndResize)
    };
    let roi = vec![0.0, 0.0, 0.4, -0.2, 1.0, 1.0, 1.2, 0.7];
    check_resize(
        r,
        Tensor::random(DType::F32, &[1, 1, 5, 5], 6),
        Some(roi),
        None,
        Some(vec![1, 1, 4, 6]),
        1,
        1e-6,
    );
}

#[test]
fn resize_integer_and_half_outputs() {
    // Integers round half to even and saturate; u8 and i32 and f16 and f64.
    for dtype in [DType::U8, DType::I8, DType::I32, DType::U64, DType::F16, DType::F64] {
        let x = Tensor::random(dtype, &[1, 1, 4, 4], 7);
        // Values near the ends of the 8-bit ranges, so that cubic overshoot saturates.
        let spread = match dtype {
            DType::U8 => 28.0,
            DType::I8 => 28.0,
            _ => 1.0,
        };
        let x = Tensor::from_f64s(
            dtype,
            x.dims(),
            &x.to_f64s().iter().map(|v| v * spread).collect::<Vec<_>>(),
        )
        .unwrap();
        for mode in [ResizeMode::Nearest, ResizeMode::Linear, ResizeMode::Cubic] {
            let tol = if dtype == DType::F16 { 1e-3 } else { 0.0 };
            check_resize(
                resize(mode, CoordinateTransform::HalfPixel),
                x.clone(),
                None,
                Some(vec![1.0, 1.0, 2.0, 1.5]),
                None,
                1,
                tol,
            );
        }
    }
}

#[test]
fn resize_large_upsample_in_workgroups() {
    let x = Tensor::random(DType::F32, &[1, 3, 40, 50], 8);
    check_resize(
        resize(ResizeMode::Linear, CoordinateTransform::HalfPixel),
        x.clone(),
        None,
        Some(vec![1.0, 1.0, 2.0, 2.0]),
        None,
        4,
        1e-6,
    );
    check_resize(
        resize(ResizeMode::Nearest, CoordinateTransform::Asymmetric),
        x,
        None,
        Some(vec![1.0, 1.0, 3.0, 3.0]),
        None,
        4,
        0.0,
    );
}

// ----- GridSample -----

/// A grid of `dims` (last axis the coordinates) spread over [-1.6, 1.6], so some points fall
/// outside the image, with the edges (-1, 1), the centre and a pixel-centre tie placed exactly
/// at the start.
fn grid_points(dims: &[usize], dtype: DType, seed: u64) -> Tensor {
    let mut v: Vec<f64> =
        Tensor::random(DType::F64, dims, seed).to_f64s().into_iter().map(|g| g * 1.6).collect();
    for (i, g) in [-1.0, 1.0, 0.0, -0.5, 1.0, -1.0].into_iter().enumerate() {
        if let Some(slot) = v.get_mut(i) {
            *slot = g;
        }
    }
    Tensor::from_f64s(dtype, dims, &v).unwrap()
}

#[test]
fn grid_sample_every_mode_padding_and_alignment() {
    use kiln_ir::op::GridPadding;
    for mode in [ResizeMode::Nearest, ResizeMode::Linear, ResizeMode::Cubic] {
        for padding in [GridPadding::Zeros, GridPadding::Border, GridPadding::Reflection] {
            for align_corners in [false, true] {
                let op = Op::GridSample { mode, padding, align_corners };
                let x = Tensor::random(DType::F32, &[2, 3, 5, 4], 1);
                let grid = grid_points(&[2, 3, 6, 2], DType::F32, 2);
                check_op(op.clone(), x, vec![Input(grid)], 1, 1e-6);
                // Volumetric, with a 1-pixel axis (reflection folds it to its only pixel).
                let x = Tensor::random(DType::F32, &[1, 2, 3, 1, 4], 3);
                let grid = grid_points(&[1, 2, 3, 2, 3], DType::F32, 4);
                check_op(op, x, vec![Input(grid)], 1, 1e-6);
            }
        }
    }
}

#[test]
fn grid_sample_types_workgroups_and_nan_points() {
    use kiln_ir::op::GridPadding;
    let op = |mode, padding| Op::GridSample { mode, padding, align_corners: false };
    // f64 image and grid (coordinates in f64), f16 image with an f32 grid.
    let x = Tensor::random(DType::F64, &[1, 2, 4, 4], 5);
    let grid = grid_points(&[1, 3, 3, 2], DType::F64, 6);
    check_op(op(ResizeMode::Cubic, GridPadding::Reflection), x, vec![Input(grid)], 1, 1e-12);
    let x = Tensor::random(DType::F16, &[1, 2, 4, 4], 7);
    let grid = grid_points(&[1, 3, 3, 2], DType::F32, 8);
    check_op(op(ResizeMode::Linear, GridPadding::Border), x, vec![Input(grid)], 1, 1e-3);
    // Large enough to be split into workgroups across threads.
    let x = Tensor::random(DType::F32, &[2, 8, 16, 16], 9);
    let grid = grid_points(&[2, 24, 24, 2], DType::F32, 10);
    check_op(op(ResizeMode::Linear, GridPadding::Zeros), x, vec![Input(grid)], 2, 1e-6);
    // An image with no pixels reads zero padding everywhere.
    let x = Tensor::zeros(DType::F32, &[1, 2, 0, 3]);
    let grid = grid_points(&[1, 2, 2, 2], DType::F32, 12);
    check_op(op(ResizeMode::Cubic, GridPadding::Zeros), x, vec![Input(grid)], 1, 0.0);
    // NaN coordinates read as far outside, on both.
    let x = Tensor::random(DType::F32, &[1, 1, 3, 3], 11);
    let grid =
        Tensor::from_vec(&[1, 1, 3, 2], vec![f32::NAN, 0.0, 0.5, f32::NAN, 0.2, 0.3]).unwrap();
    for padding in [GridPadding::Zeros, GridPadding::Border, GridPadding::Reflection] {
        check_op(op(ResizeMode::Cubic, padding), x.clone(), vec![Input(grid.clone())], 1, 1e-6);
    }
}
