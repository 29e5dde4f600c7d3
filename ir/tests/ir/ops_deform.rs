//! DeformConv: the interpreter against hand-computed values (offsets of whole and half pixels,
//! taps outside the image, masks, bias, groups and offset groups) and the errors mismatched
//! operands give.

use kiln_ir::op::DeformConv;
use kiln_ir::{DType, Op, Tensor};

use super::{assert_close, f32s, run_on_constants as run};

fn deform(group: usize, offset_group: usize) -> Op {
    Op::DeformConv(DeformConv { group, offset_group, ..DeformConv::default() })
}

/// The 3 x 3 image 0..9.
fn image() -> Tensor {
    f32s(&[1, 1, 3, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
}

#[test]
fn deform_conv_without_offsets_is_a_convolution() {
    let w = f32s(&[1, 1, 2, 2], &[1.0; 4]);
    let offset = f32s(&[1, 8, 2, 2], &[0.0; 32]);
    let y = run(deform(1, 1), &[Some(image()), Some(w), Some(offset)]).unwrap();
    assert_close(&y, &[1, 1, 2, 2], &[8.0, 12.0, 20.0, 24.0], 1e-6);
}

#[test]
fn deform_conv_samples_between_pixels_and_reads_zero_outside() {
    // A 1 x 1 kernel moved half a row down: the mean of each pixel and the one below, the
    // last row's lower tap outside (zero). Mask 2 doubles, bias 1 adds.
    let w = f32s(&[1, 1, 1, 1], &[1.0]);
    let mut offset = vec![0.5f32; 9];
    offset.extend([0.0; 9]);
    let offset = f32s(&[1, 2, 3, 3], &offset);
    let y = run(deform(1, 1), &[Some(image()), Some(w.clone()), Some(offset.clone())]).unwrap();
    let half = [1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 3.0, 3.5, 4.0];
    assert_close(&y, &[1, 1, 3, 3], &half, 1e-6);
    let mask = f32s(&[1, 1, 3, 3], &[2.0; 9]);
    let bias = f32s(&[1], &[1.0]);
    let y =
        run(deform(1, 1), &[Some(image()), Some(w), Some(offset), Some(bias), Some(mask)]).unwrap();
    let want: Vec<f64> = half.iter().map(|v| 2.0 * v + 1.0).collect();
    assert_close(&y, &[1, 1, 3, 3], &want, 1e-6);
}

#[test]
fn deform_conv_groups_and_offset_groups() {
    // Two channels (the image and its negation), two groups of one, two offset groups: channel
    // 0 moved a column right (the last column reads zero), channel 1 not moved.
    let mut x = image().to_f64s();
    x.extend(image().to_f64s().iter().map(|v| -v));
    let x = Tensor::from_f64s(DType::F32, &[1, 2, 3, 3], &x).unwrap();
    let w = f32s(&[2, 1, 1, 1], &[1.0, 10.0]);
    let mut offset = vec![0.0f32; 9];
    offset.extend([1.0; 9]);
    offset.extend([0.0; 18]);
    let offset = f32s(&[1, 4, 3, 3], &offset);
    let y = run(deform(2, 2), &[Some(x), Some(w), Some(offset)]).unwrap();
    let mut want = vec![1.0, 2.0, 0.0, 4.0, 5.0, 0.0, 7.0, 8.0, 0.0];
    want.extend((0..9).map(|v| -10.0 * v as f64));
    assert_close(&y, &[1, 2, 3, 3], &want, 1e-6);
}

#[test]
fn deform_conv_refuses_mismatched_operands() {
    let w = f32s(&[1, 1, 2, 2], &[1.0; 4]);
    let offset = f32s(&[1, 4, 2, 2], &[0.0; 16]);
    let err = run(deform(1, 1), &[Some(image()), Some(w.clone()), Some(offset)]).unwrap_err();
    assert!(err.contains("(DeformConv): offset [1, 4, 2, 2] must be [1, 8, 2, 2]"), "{err}");
    let offset = f32s(&[1, 8, 2, 2], &[0.0; 32]);
    let err = run(deform(1, 2), &[Some(image()), Some(w.clone()), Some(offset.clone())]);
    assert!(err.unwrap_err().contains("1 channels do not split into 2 offset groups"));
    let mask = f32s(&[1, 3, 2, 2], &[1.0; 12]);
    let err = run(deform(1, 1), &[Some(image()), Some(w), Some(offset), None, Some(mask)]);
    assert!(err.unwrap_err().contains("mask [1, 3, 2, 2] must be [1, 4, 2, 2]"));
}

#[test]
fn deform_conv_refuses_hostile_offset_groups() {
    let w = f32s(&[1, 1, 2, 2], &[1.0; 4]);
    let offset = f32s(&[1, 8, 2, 2], &[0.0; 32]);
    let op = deform(1, usize::MAX / 2);
    let err = run(op, &[Some(image()), Some(w), Some(offset)]).unwrap_err();
    assert!(err.contains("(DeformConv)"), "{err}");
}
