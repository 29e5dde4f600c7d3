//! DFT, STFT and MelWeightMatrix: the interpreter against hand-computed transforms (or ONNX's
//! reference, where said), the shapes inference gives, and the errors bad operands give.

use kiln_ir::{DType, Op, Tensor};

use super::{assert_close, f32s, run_on_constants as run};

fn dft(inverse: bool, onesided: bool) -> Op {
    Op::Dft { inverse, onesided }
}

fn int(v: i64) -> Option<Tensor> {
    Some(Tensor::scalar(v))
}

/// The spectrum of [1, 2, 3, 4]: 10, -2 + 2i, -2, -2 - 2i.
const SPECTRUM: [f64; 8] = [10.0, 0.0, -2.0, 2.0, -2.0, 0.0, -2.0, -2.0];

#[test]
fn dft_forward_and_inverse_of_four_points() {
    let x = f32s(&[4, 1], &[1.0, 2.0, 3.0, 4.0]);
    let y = run(dft(false, false), &[Some(x.clone()), None, int(0)]).unwrap();
    assert_close(&y, &[4, 2], &SPECTRUM, 1e-6);
    // One-sided: bins 0 to n / 2.
    let y = run(dft(false, true), &[Some(x), None, int(0)]).unwrap();
    assert_close(&y, &[3, 2], &SPECTRUM[..6], 1e-6);
    // The inverse gives the signal back, with no imaginary part.
    let spectrum: Vec<f32> = SPECTRUM.iter().map(|&v| v as f32).collect();
    let s = f32s(&[4, 2], &spectrum);
    let y = run(dft(true, false), &[Some(s), None, int(0)]).unwrap();
    assert_close(&y, &[4, 2], &[1.0, 0.0, 2.0, 0.0, 3.0, 0.0, 4.0, 0.0], 1e-6);
}

#[test]
fn inverse_onesided_restores_the_real_signal() {
    // Bins 0..=2 of the spectrum of [1, 2, 3, 4]; the default length is 2 * (3 - 1) = 4. The
    // imaginary parts of bins 0 and n / 2 are ignored (numpy's irfft), so junk there changes
    // nothing.
    let s = f32s(&[3, 2], &[10.0, 5.0, -2.0, 2.0, -2.0, -7.0]);
    let y = run(dft(true, true), &[Some(s.clone()), None, int(0)]).unwrap();
    assert_close(&y, &[4, 1], &[1.0, 2.0, 3.0, 4.0], 1e-6);
    // Of odd length 3 only bins 0 and 1 count: y[t] = (10 + 2 Re(X1 e^{2πit/3})) / 3.
    let y = run(dft(true, true), &[Some(s), int(3), int(0)]).unwrap();
    let c = (2.0 * std::f64::consts::PI / 3.0).cos();
    let sn = (2.0 * std::f64::consts::PI / 3.0).sin();
    let want: Vec<f64> = (0..3)
        .map(|t| {
            let (ct, st) = ([1.0, c, c][t], [0.0, sn, -sn][t]);
            (10.0 + 2.0 * (-2.0 * ct - 2.0 * st)) / 3.0
        })
        .collect();
    assert_close(&y, &[3, 1], &want, 1e-5);
}

#[test]
fn dft_length_pads_or_cuts_the_signal() {
    // [1, 2] padded to 4: X_k = 1 + 2 e^{-iπk/2} = 3, 1 - 2i, -1, 1 + 2i.
    let x = f32s(&[2, 1], &[1.0, 2.0]);
    let y = run(dft(false, false), &[Some(x), int(4), int(0)]).unwrap();
    assert_close(&y, &[4, 2], &[3.0, 0.0, 1.0, -2.0, -1.0, 0.0, 1.0, 2.0], 1e-6);
    // [1, 2, 3, 4] cut to [1, 2]: 3, -1.
    let x = f32s(&[4, 1], &[1.0, 2.0, 3.0, 4.0]);
    let y = run(dft(false, false), &[Some(x), int(2), int(0)]).unwrap();
    assert_close(&y, &[2, 2], &[3.0, 0.0, -1.0, 0.0], 1e-6);
}

#[test]
fn dft_axis_defaults_to_the_one_before_the_parts() {
    // [[1, 2], [3, 4]]: along axis 0 the columns [1, 3] and [2, 4]; along -2 (axis 1, the
    // default when the operand is absent) the rows [1, 2] and [3, 4].
    let x = f32s(&[2, 2, 1], &[1.0, 2.0, 3.0, 4.0]);
    let y = run(dft(false, false), &[Some(x.clone()), None, int(0)]).unwrap();
    assert_close(&y, &[2, 2, 2], &[4.0, 0.0, 6.0, 0.0, -2.0, 0.0, -2.0, 0.0], 1e-6);
    let y = run(dft(false, false), &[Some(x), None, None]).unwrap();
    assert_close(&y, &[2, 2, 2], &[3.0, 0.0, -1.0, 0.0, 7.0, 0.0, -1.0, 0.0], 1e-6);
}

#[test]
fn dft_in_f64_is_exact_to_rounding() {
    // 1024 points of a cosine at bin 5: n / 2 at bins 5 and n - 5, 0 elsewhere.
    let n = 1024;
    let v: Vec<f64> =
        (0..n).map(|t| (std::f64::consts::TAU * 5.0 * t as f64 / n as f64).cos()).collect();
    let x = Tensor::from_f64s(DType::F64, &[n, 1], &v).unwrap();
    let y = run(dft(false, false), &[Some(x), None, int(0)]).unwrap();
    assert_eq!(y.dtype(), DType::F64);
    let mut want = vec![0.0; 2 * n];
    want[10] = 512.0;
    want[2 * (n - 5)] = 512.0;
    assert_close(&y, &[n, 2], &want, 1e-9);
}

#[test]
fn dft_refuses_bad_operands() {
    let x = f32s(&[4, 1], &[1.0, 2.0, 3.0, 4.0]);
    let err = run(dft(false, false), &[Some(x.clone()), None, int(1)]).unwrap_err();
    assert!(err.contains("(DFT): axis 1 is not a signal axis of a rank-2 input"), "{err}");
    let err = run(dft(false, false), &[Some(x.clone()), int(0), int(0)]).unwrap_err();
    assert!(err.contains("dft_length must be from 1 to 2^31, got 0"), "{err}");
    let err = run(dft(false, false), &[Some(x), Some(Tensor::scalar(2.0f32)), None]).unwrap_err();
    assert!(err.contains("dft_length must be an integer scalar, got f32[]"), "{err}");
    let three = f32s(&[2, 3], &[0.0; 6]);
    let err = run(dft(false, false), &[Some(three), None, None]).unwrap_err();
    assert!(err.contains("holds the real part (1) or the real and imaginary parts (2), not 3"));
    let ints = Tensor::from_vec(&[2, 1], vec![1i32, 2]).unwrap();
    let err = run(dft(false, false), &[Some(ints), None, None]).unwrap_err();
    assert!(err.contains("(DFT)"), "{err}");
    // One point, one-sided inverse: a transform of 2 * (1 - 1) = 0 points.
    let one = f32s(&[1, 2], &[1.0, 0.0]);
    let err = run(dft(true, true), &[Some(one), None, int(0)]).unwrap_err();
    assert!(err.contains("the transform has no points"), "{err}");
}

#[test]
fn stft_frames_windows_and_transforms() {
    // [1, 2, 3, 4] in frames of 2 every 2: [1, 2] -> 3, -1 and [3, 4] -> 7, -1.
    let x = f32s(&[1, 4, 1], &[1.0, 2.0, 3.0, 4.0]);
    let y = run(Op::Stft { onesided: true }, &[Some(x.clone()), int(2), None, int(2)]).unwrap();
    assert_close(&y, &[1, 2, 2, 2], &[3.0, 0.0, -1.0, 0.0, 7.0, 0.0, -1.0, 0.0], 1e-6);
    // The window [0.5, 1] weighs each frame first: [0.5, 2] and [1.5, 4].
    let w = f32s(&[2], &[0.5, 1.0]);
    let y = run(Op::Stft { onesided: true }, &[Some(x.clone()), int(2), Some(w), None]).unwrap();
    assert_close(&y, &[1, 2, 2, 2], &[2.5, 0.0, -1.5, 0.0, 5.5, 0.0, -2.5, 0.0], 1e-6);
    // Frames of 3 every 1: 1 + (4 - 3) / 1 = 2 frames, two-sided: 3 bins.
    let y = run(Op::Stft { onesided: false }, &[Some(x), int(1), None, int(3)]).unwrap();
    // [1, 2, 3] and [2, 3, 4]: sums 6 and 9, and both -1.5 ± i√3/2 at bins 1 and 2.
    let h = 3f64.sqrt() / 2.0;
    let want = [6.0, 0.0, -1.5, h, -1.5, -h, 9.0, 0.0, -1.5, h, -1.5, -h];
    assert_close(&y, &[1, 2, 3, 2], &want, 1e-6);
}

#[test]
fn stft_refuses_frames_that_do_not_fit() {
    let x = f32s(&[1, 4, 1], &[1.0, 2.0, 3.0, 4.0]);
    let stft = Op::Stft { onesided: true };
    let err = run(stft.clone(), &[Some(x.clone()), int(1), None, int(5)]).unwrap_err();
    assert!(err.contains("(STFT): frames of 5 points do not fit a signal of 4"), "{err}");
    let err = run(stft.clone(), &[Some(x.clone()), int(0), None, int(2)]).unwrap_err();
    assert!(err.contains("frame_step must be from 1 to 2^31, got 0"), "{err}");
    let w = f32s(&[3], &[1.0; 3]);
    let err = run(stft.clone(), &[Some(x), int(1), Some(w), int(2)]).unwrap_err();
    assert!(err.contains("the window has 3 points but frames have 2"), "{err}");
    let flat = f32s(&[4], &[1.0; 4]);
    let err = run(stft, &[Some(flat), int(1), None, None]).unwrap_err();
    assert!(err.contains("the signal must be [batch, length, 1 or 2], got f32[4]"), "{err}");
}

fn mel(operands: (i64, i64, i64, f32, f32), dtype: Option<DType>) -> Result<Tensor, String> {
    let (bins, length, rate, lo, hi) = operands;
    let ops =
        [int(bins), int(length), int(rate), Some(Tensor::scalar(lo)), Some(Tensor::scalar(hi))];
    run(Op::MelWeightMatrix { dtype }, &ops)
}

#[test]
fn mel_weight_matrix_matches_onnx_reference() {
    // ONNX's reference for 2 bins of a 16-point spectrum at 16 kHz, 0 to 8 kHz: the points fall
    // on spectrogram bins 0, 0, 1 and 4; filter 0 has no rise (1 at bin 0), filter 1 rises to
    // bin 1 and falls by thirds to bin 4.
    let m = mel((2, 16, 16000, 0.0, 8000.0), None).unwrap();
    assert_eq!(m.dtype(), DType::F32);
    let mut want = vec![0.0; 9 * 2];
    want[0] = 1.0;
    want[2 + 1] = 1.0;
    want[2 * 2 + 1] = 2.0 / 3.0;
    want[2 * 3 + 1] = 1.0 / 3.0;
    assert_close(&m, &[9, 2], &want, 1e-6);
    // ONNX's test_melweightmatrix (8 bins, 16 points, 8192 Hz, 0 to 4096 Hz), in f64.
    let m = mel((8, 16, 8192, 0.0, 4096.0), Some(DType::F64)).unwrap();
    assert_eq!((m.dtype(), m.dims()), (DType::F64, &[9usize, 8][..]));
    let ones: Vec<(usize, usize)> = m
        .to_f64s()
        .iter()
        .enumerate()
        .filter(|(_, &v)| v != 0.0)
        .map(|(i, &v)| {
            assert_eq!(v, 1.0);
            (i / 8, i % 8)
        })
        .collect();
    assert_eq!(ones, [(0, 0), (0, 1), (1, 2), (1, 3), (2, 4), (3, 5), (4, 6), (5, 7)]);
}

#[test]
fn mel_weight_matrix_refuses_bad_edges_and_counts() {
    let err = mel((8, 16, 8192, 0.0, 9000.0), None).unwrap_err();
    assert!(err.contains("(MelWeightMatrix): upper_edge_hertz 9000 lies past the 9 bins"), "{err}");
    let err = mel((0, 16, 8192, 0.0, 4096.0), None).unwrap_err();
    assert!(err.contains("num_mel_bins must be positive, got 0"), "{err}");
    let err = mel((8, 16, 8192, 100.0, 50.0), None).unwrap_err();
    assert!(err.contains("0 <= lower_edge_hertz <= upper_edge_hertz"), "{err}");
    let err = mel((8, 16, 8192, 0.0, 4096.0), Some(DType::I32)).unwrap_err();
    assert!(err.contains("output_datatype must be a float type, got i32"), "{err}");
}
