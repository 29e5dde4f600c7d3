//! GridSample and AffineGrid: the interpreter against hand-computed values for every mode,
//! padding and `align_corners`, on 2-D and 3-D images; the ONNX import of both opsets' mode
//! names; and the errors bad ranks, grids, types and modes give, naming the node. RoiAlign:
//! bilinear samples, both pooling modes and box conventions, images picked by index, samples
//! far outside, and bad boxes and indices.

use kiln_ir::builder::GraphBuilder;
use kiln_ir::onnx::proto::data_type;
use kiln_ir::op::{GridPadding, ResizeMode};
use kiln_ir::{eval, DType, IrError, Op, Tensor};

use super::onnx::{load, model, node, value};
use super::onnx_training::string;
use super::{assert_close, f32s};

fn sample(mode: ResizeMode, padding: GridPadding, align_corners: bool) -> Op {
    Op::GridSample { mode, padding, align_corners }
}

/// Runs `op(x, y)` on constants; the error as text.
fn run2(op: Op, x: Tensor, y: Tensor) -> Result<Tensor, String> {
    let g = GraphBuilder::new("t");
    let (a, b) = (g.constant("x", x), g.constant("y", y));
    let out = g.apply(op, &[Some(a), Some(b)], 1)[0];
    g.output("out", out);
    let graph = g.build().map_err(|e| e.to_string())?;
    eval::run(&graph, &[]).map(|mut v| v.remove(0)).map_err(|e| e.to_string())
}

/// The 2 x 2 image [[1, 2], [3, 4]] and five points (x, y): its centre, its top-left corner,
/// its top-right corner, the centre of pixel (1, 0) (unaligned), and a point half an image
/// right of it.
fn image_and_points() -> (Tensor, Tensor) {
    let x = f32s(&[1, 1, 2, 2], &[1., 2., 3., 4.]);
    let grid = f32s(&[1, 1, 5, 2], &[0., 0., -1., -1., 1., -1., -0.5, 0.5, 2., 0.]);
    (x, grid)
}

#[test]
fn linear_sampling_with_each_padding() {
    use GridPadding::*;
    // Unaligned, the corner (-1, -1) is pixel coordinate (-0.5, -0.5): a quarter of pixel
    // (0, 0) with zeros, all of it when the outside reads the edge; x = 2 is column 2.5, past
    // the right edge (1.5), reflected to 0.5.
    for (padding, want) in [
        (Zeros, [2.5, 0.25, 0.5, 3.0, 0.0]),
        (Border, [2.5, 1.0, 2.0, 3.0, 3.0]),
        (Reflection, [2.5, 1.0, 2.0, 3.0, 2.5]),
    ] {
        let (x, grid) = image_and_points();
        let y = run2(sample(ResizeMode::Linear, padding, false), x, grid).unwrap();
        assert_close(&y, &[1, 1, 1, 5], &want, 1e-6);
    }
    // Aligned, -1 and 1 are the outer pixels' centres: (-0.5, 0.5) is (0.25, 0.75).
    let (x, grid) = image_and_points();
    let y = run2(sample(ResizeMode::Linear, Zeros, true), x, grid).unwrap();
    assert_close(&y, &[1, 1, 1, 5], &[2.5, 1.0, 2.0, 2.75, 1.5], 1e-6);
}

#[test]
fn nearest_rounds_half_to_even_then_pads() {
    use GridPadding::*;
    // The centre (0.5, 0.5) rounds to (0, 0); the top-right corner's column 1.5 to 2, outside.
    for (padding, want) in [
        (Zeros, [1.0, 1.0, 0.0, 3.0, 0.0]),
        (Border, [1.0, 1.0, 2.0, 3.0, 2.0]),
        (Reflection, [1.0, 1.0, 2.0, 3.0, 2.0]),
    ] {
        let (x, grid) = image_and_points();
        let y = run2(sample(ResizeMode::Nearest, padding, false), x, grid).unwrap();
        assert_close(&y, &[1, 1, 1, 5], &want, 0.0);
    }
}

#[test]
fn cubic_uses_keys_weights_and_pads_each_tap() {
    use GridPadding::*;
    // One row [1, 2, 3, 4]. x = 0 is column 1.5: weights -3/32, 19/32, 19/32, -3/32 over
    // columns 0..3 give 2.5. x = -1 is column -0.5: taps at -2..1 read zeros, the edge, or the
    // reflection [2, 1, 1, 2].
    let x = f32s(&[1, 1, 1, 4], &[1., 2., 3., 4.]);
    let grid = f32s(&[1, 1, 2, 2], &[0., 0., -1., 0.]);
    for (padding, want) in
        [(Zeros, [2.5, 0.40625]), (Border, [2.5, 0.90625]), (Reflection, [2.5, 0.8125])]
    {
        let y = run2(sample(ResizeMode::Cubic, padding, false), x.clone(), grid.clone()).unwrap();
        assert_close(&y, &[1, 1, 1, 2], &want, 1e-6);
    }
    assert_eq!(eval::grid_cubic_weights(0.0), [0.0, 1.0, 0.0, 0.0]);
}

#[test]
fn volumetric_sampling_and_f64() {
    // x[d, h, w] = 4d + 2h + w; aligned, (x, y, z) = (1, -1, 1) is w 1, h 0, d 1.
    let x = Tensor::from_vec(&[1, 1, 2, 2, 2], (0..8).map(f64::from).collect::<Vec<_>>()).unwrap();
    let grid = Tensor::from_vec(&[1, 1, 1, 2, 3], vec![1.0f64, -1., 1., 0., 0., 0.]).unwrap();
    let y = run2(sample(ResizeMode::Nearest, GridPadding::Zeros, true), x.clone(), grid.clone())
        .unwrap();
    assert_eq!(y.dtype(), DType::F64);
    assert_close(&y, &[1, 1, 1, 1, 2], &[5.0, 0.0], 0.0);
    let y = run2(sample(ResizeMode::Linear, GridPadding::Zeros, true), x, grid).unwrap();
    assert_close(&y, &[1, 1, 1, 1, 2], &[5.0, 3.5], 1e-12);
}

#[test]
fn reflection_folds_far_points_back_and_forth() {
    // The spec's example: -3.5 reflects at -1 to 1.5, then at 1 to 0.5.
    assert_eq!(eval::grid_reflect(-3.5, -1.0, 1.0), 0.5);
    assert_eq!(eval::grid_reflect(5.25, 0.0, 2.0), 1.25);
    assert_eq!(eval::grid_reflect(7.0, 0.0, 0.0), 0.0);
}

#[test]
fn nan_points_read_far_outside() {
    let (x, _) = image_and_points();
    let grid = f32s(&[1, 1, 1, 2], &[f32::NAN, 0.0]);
    let y = run2(sample(ResizeMode::Linear, GridPadding::Zeros, false), x.clone(), grid.clone())
        .unwrap();
    assert_close(&y, &[1, 1, 1, 1], &[0.0], 0.0);
    let y = run2(sample(ResizeMode::Linear, GridPadding::Border, false), x, grid).unwrap();
    assert_close(&y, &[1, 1, 1, 1], &[2.0], 0.0);
}

#[test]
fn affine_grid_places_pixel_centres() {
    // Identity plus a shift of x by 0.5 and y scaled by 2, over a 2 x 3 image.
    let theta = f32s(&[1, 2, 3], &[1., 0., 0.5, 0., 2., 0.]);
    let size = Tensor::vector(&[1i64, 1, 2, 3]);
    let y = run2(Op::AffineGrid { align_corners: true }, theta.clone(), size.clone()).unwrap();
    assert_close(
        &y,
        &[1, 2, 3, 2],
        &[-0.5, -2., 0.5, -2., 1.5, -2., -0.5, 2., 0.5, 2., 1.5, 2.],
        1e-6,
    );
    let y = run2(Op::AffineGrid { align_corners: false }, theta, size).unwrap();
    let t = 2.0 / 3.0;
    assert_close(
        &y,
        &[1, 2, 3, 2],
        &[0.5 - t, -1., 0.5, -1., 0.5 + t, -1., 0.5 - t, 1., 0.5, 1., 0.5 + t, 1.],
        1e-6,
    );
    // 3-D, identity, aligned: (x, y, z) of each of 2 x 1 x 2 voxels; a single row sits at 0.
    let theta = f32s(&[1, 3, 4], &[1., 0., 0., 0., 0., 1., 0., 0., 0., 0., 1., 0.]);
    let y =
        run2(Op::AffineGrid { align_corners: true }, theta, Tensor::vector(&[1i64, 1, 2, 1, 2]))
            .unwrap();
    assert_close(&y, &[1, 2, 1, 2, 3], &[-1., 0., -1., 1., 0., -1., -1., 0., 1., 1., 0., 1.], 1e-6);
}

#[test]
fn affine_identity_grid_samples_the_image_back() {
    let x = Tensor::random(DType::F32, &[2, 3, 4, 5], 3);
    let theta = f32s(&[2, 2, 3], &[1., 0., 0., 0., 1., 0., 1., 0., 0., 0., 1., 0.]);
    for align_corners in [false, true] {
        let g = GraphBuilder::new("t");
        let (xi, th) = (g.constant("x", x.clone()), g.constant("theta", theta.clone()));
        let size = g.constant("size", Tensor::vector(&[2i64, 3, 4, 5]));
        let grid = g.apply(Op::AffineGrid { align_corners }, &[Some(th), Some(size)], 1)[0];
        let y = g.apply(
            sample(ResizeMode::Linear, GridPadding::Zeros, align_corners),
            &[Some(xi), Some(grid)],
            1,
        )[0];
        g.output("y", y);
        let y = eval::run(&g.build().unwrap(), &[]).unwrap().remove(0);
        let want = x.to_f64s();
        assert_close(&y, &[2, 3, 4, 5], &want, 1e-5);
    }
}

#[test]
fn bad_operands_are_errors_naming_the_node() {
    let lin = || sample(ResizeMode::Linear, GridPadding::Zeros, false);
    let grid = |dims: &[usize]| Tensor::zeros(DType::F32, dims);
    let cases: Vec<(Op, Tensor, Tensor, &str)> = vec![
        (lin(), grid(&[1, 1, 2, 2, 2, 2]), grid(&[1, 1, 1, 1, 1, 4]), "1 to 3 spatial axes"),
        (lin(), grid(&[2, 2]), grid(&[2, 1]), "1 to 3 spatial axes"),
        (lin(), grid(&[1, 1, 4, 4]), grid(&[1, 2, 2, 3]), "grid's last axis holds a point's 2"),
        (lin(), grid(&[1, 1, 4, 4]), grid(&[1, 2, 2]), "grid must be [N, H1..H2, 2] (rank 4)"),
        (lin(), grid(&[2, 1, 4, 4]), grid(&[3, 2, 2, 2]), "differ in batch size"),
        (
            lin(),
            Tensor::zeros(DType::I32, &[1, 1, 4, 4]),
            grid(&[1, 2, 2, 2]),
            "x must be a float tensor",
        ),
        (
            lin(),
            grid(&[1, 1, 4, 4]),
            Tensor::zeros(DType::I64, &[1, 2, 2, 2]),
            "grid must be a float",
        ),
        (
            Op::AffineGrid { align_corners: false },
            grid(&[1, 2, 3]),
            Tensor::vector(&[1i64, 1, 4]),
            "size must be [N, C, H, W] or [N, C, D, H, W]",
        ),
        (
            Op::AffineGrid { align_corners: false },
            grid(&[1, 2, 4]),
            Tensor::vector(&[1i64, 1, 4, 4]),
            "theta must be [N, 2, 3] for a 2-D grid",
        ),
        (
            Op::AffineGrid { align_corners: false },
            grid(&[1, 2, 3]),
            Tensor::vector(&[1i64, 1, -4, 4]),
            "size must not be negative",
        ),
    ];
    for (op, x, y, want) in cases {
        let err = run2(op.clone(), x, y).unwrap_err();
        assert!(err.contains(want), "{}: {err}", op.name());
        let node = format!("`{}` ({})", op.name().to_lowercase(), op.name());
        assert!(err.starts_with("node ") && err.contains(&node), "{err}");
    }
    // An empty image has no edge to pad with.
    let err = run2(
        sample(ResizeMode::Linear, GridPadding::Border, false),
        grid(&[1, 1, 0, 4]),
        grid(&[1, 2, 2, 2]),
    )
    .unwrap_err();
    assert!(
        err.contains("cannot sample the empty input f32[1,1,0,4] with border padding"),
        "{err}"
    );
    let y = run2(
        sample(ResizeMode::Cubic, GridPadding::Zeros, false),
        grid(&[1, 1, 0, 4]),
        grid(&[1, 2, 2, 2]),
    )
    .unwrap();
    assert_close(&y, &[1, 1, 2, 2], &[0.0; 4], 0.0);
}

fn grid_sample_model(opset: i64, mode: &str) -> Vec<u8> {
    model(
        opset,
        vec![node("GridSample", "gs", &["x", "grid"], &["y"], vec![string("mode", mode)])],
        vec![
            value("x", data_type::FLOAT, &[1, 1, 2, 2]),
            value("grid", data_type::FLOAT, &[1, 1, 5, 2]),
        ],
        vec![value("y", data_type::FLOAT, &[1, 1, 1, 5])],
        vec![],
    )
}

#[test]
fn onnx_import_takes_both_opsets_mode_names() {
    let (x, grid) = image_and_points();
    for (opset, mode, want) in [
        (16, "bilinear", [2.5, 0.25, 0.5, 3.0, 0.0]),
        (16, "nearest", [1.0, 1.0, 0.0, 3.0, 0.0]),
        (20, "linear", [2.5, 0.25, 0.5, 3.0, 0.0]),
        // ONNX's reference gives these (zero padding around a 2 x 2 image pulls cubic far off).
        (22, "cubic", [3.525390625, 0.109375, 0.453125, 3.0, -0.333984375]),
        (16, "bicubic", [3.525390625, 0.109375, 0.453125, 3.0, -0.333984375]),
    ] {
        let m = load(&grid_sample_model(opset, mode)).unwrap();
        let y = eval::run(&m.graph, &[x.clone(), grid.clone()]).unwrap().remove(0);
        assert_close(&y, &[1, 1, 1, 5], &want, 1e-6);
    }
    let err = load(&grid_sample_model(20, "area")).unwrap_err();
    assert!(matches!(&err, IrError::Attr { node, .. } if node == "gs"), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("gs") && text.contains("area"), "{text}");
}

// ----- RoiAlign -----

fn roi_align(half_pixel: bool, max: bool, pooled: [usize; 2], sampling_ratio: usize) -> Op {
    use kiln_ir::op::{RoiCoordinates, RoiPooling};
    Op::RoiAlign {
        coordinates: if half_pixel {
            RoiCoordinates::HalfPixel
        } else {
            RoiCoordinates::OutputHalfPixel
        },
        mode: if max { RoiPooling::Max } else { RoiPooling::Avg },
        output_height: pooled[0],
        output_width: pooled[1],
        sampling_ratio,
        spatial_scale: 1.0,
    }
}

/// Images of `v = 16 * image + 4 * y + x`, 4 x 4 pixels each.
fn ramps(images: usize) -> Tensor {
    let v: Vec<f32> = (0..16 * images).map(|i| i as f32).collect();
    f32s(&[images, 1, 4, 4], &v)
}

fn boxes(rois: &[[f32; 4]], batch: &[i64]) -> [Tensor; 2] {
    let flat: Vec<f32> = rois.iter().flatten().copied().collect();
    [f32s(&[rois.len(), 4], &flat), Tensor::vector(batch)]
}

#[test]
fn roi_align_samples_bilinearly_and_pools() {
    use super::run_on_constants as run;
    let [rois, batch] = boxes(&[[0.0, 0.0, 3.0, 3.0]], &[0]);
    let args = |x: Tensor| [Some(x), Some(rois.clone()), Some(batch.clone())];
    // One bin of one sample at (1.5, 1.5): 4 * 1.5 + 1.5. Half a pixel earlier: (1, 1), 5.
    let y = run(roi_align(false, false, [1, 1], 1), &args(ramps(1))).unwrap();
    assert_close(&y, &[1, 1, 1, 1], &[7.5], 1e-6);
    let y = run(roi_align(true, false, [1, 1], 1), &args(ramps(1))).unwrap();
    assert_close(&y, &[1, 1, 1, 1], &[5.0], 1e-6);
    // Max: the largest weighted tap, 10 / 4.
    let y = run(roi_align(false, true, [1, 1], 1), &args(ramps(1))).unwrap();
    assert_close(&y, &[1, 1, 1, 1], &[2.5], 1e-6);
    // 2 x 2 bins of 2 x 2 samples over [0, 4]: samples at 0.5, 1.5 | 2.5, 3.5, the last clamped
    // to the last pixel (3); the ramp is linear, so each bin is its samples' mean place.
    let [rois, batch] = boxes(&[[0.0, 0.0, 4.0, 4.0]], &[0]);
    let y = run(roi_align(false, false, [2, 2], 2), &[Some(ramps(1)), Some(rois), Some(batch)])
        .unwrap();
    assert_close(&y, &[1, 1, 2, 2], &[5.0, 6.75, 12.0, 13.75], 1e-6);
}

#[test]
fn roi_align_picks_images_and_reads_zero_far_outside() {
    use super::run_on_constants as run;
    // Box 0 on image 1 (values + 16), box 1 far past the image's right edge.
    let [rois, batch] = boxes(&[[0.0, 0.0, 3.0, 3.0], [10.0, 0.0, 12.0, 3.0]], &[1, 0]);
    let y = run(roi_align(false, false, [1, 1], 1), &[Some(ramps(2)), Some(rois), Some(batch)])
        .unwrap();
    assert_close(&y, &[2, 1, 1, 1], &[23.5, 0.0], 1e-6);
}

#[test]
fn roi_align_refuses_bad_boxes_and_indices() {
    use super::run_on_constants as run;
    let [rois, _] = boxes(&[[0.0, 0.0, 3.0, 3.0]], &[0]);
    let err = run(
        roi_align(false, false, [1, 1], 1),
        &[Some(ramps(1)), Some(rois.clone()), Some(Tensor::vector(&[3i64]))],
    )
    .unwrap_err();
    assert!(err.contains("(RoiAlign): batch index 3 of box 0 is outside the 1 images"), "{err}");
    let three = f32s(&[1, 3], &[0.0; 3]);
    let err = run(
        roi_align(false, false, [1, 1], 1),
        &[Some(ramps(1)), Some(three), Some(Tensor::vector(&[0i64]))],
    )
    .unwrap_err();
    assert!(err.contains("rois must be [R, 4] of the input's type, got f32[1,3]"), "{err}");
    let err = run(
        roi_align(false, false, [0, 1], 1),
        &[Some(ramps(1)), Some(rois), Some(Tensor::vector(&[0i64]))],
    )
    .unwrap_err();
    assert!(err.contains("output_height and output_width must be positive"), "{err}");
    let [rois, batch] = boxes(&[[0.0, 0.0, 3.0, 3.0]], &[0]);
    let err =
        run(roi_align(false, false, [1, 1], 1 << 40), &[Some(ramps(1)), Some(rois), Some(batch)])
            .unwrap_err();
    assert!(err.contains("sampling_ratio must be at most 1024, got 1099511627776"), "{err}");
}
