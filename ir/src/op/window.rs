//! Sliding-window geometry shared by convolution and pooling: padding rules and output sizes.

use crate::error::{AttrError, OpError};

/// How ONNX derives padding when `auto_pad` is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AutoPad {
    /// Use the explicit `pads`.
    #[default]
    NotSet,
    /// Output size `ceil(in / stride)`, the odd padding at the end.
    SameUpper,
    /// Output size `ceil(in / stride)`, the odd padding at the start.
    SameLower,
    /// No padding.
    Valid,
}

impl AutoPad {
    pub fn name(self) -> &'static str {
        match self {
            AutoPad::NotSet => "NOTSET",
            AutoPad::SameUpper => "SAME_UPPER",
            AutoPad::SameLower => "SAME_LOWER",
            AutoPad::Valid => "VALID",
        }
    }

    pub fn from_name(s: &str) -> Option<AutoPad> {
        [AutoPad::NotSet, AutoPad::SameUpper, AutoPad::SameLower, AutoPad::Valid]
            .into_iter()
            .find(|p| p.name() == s)
    }
}

/// The sliding-window geometry shared by convolution and pooling. Every list has one entry per
/// spatial dimension (`pads` two: all begins, then all ends), filled in by whoever builds the op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    pub strides: Vec<usize>,
    pub dilations: Vec<usize>,
    pub pads: Vec<usize>,
    pub auto_pad: AutoPad,
}

impl Window {
    /// Stride 1, dilation 1, no padding, for `spatial` dimensions.
    pub fn unit(spatial: usize) -> Window {
        Window {
            strides: vec![1; spatial],
            dilations: vec![1; spatial],
            pads: vec![0; 2 * spatial],
            auto_pad: AutoPad::NotSet,
        }
    }

    pub fn spatial_rank(&self) -> usize {
        self.strides.len()
    }
}

/// One spatial axis of a window resolved against a concrete input size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpatialAxis {
    pub input: usize,
    pub kernel: usize,
    pub stride: usize,
    pub dilation: usize,
    pub pad_begin: usize,
    pub pad_end: usize,
    pub output: usize,
}

impl Window {
    pub fn stride(&self, i: usize) -> usize {
        self.strides.get(i).copied().unwrap_or(1)
    }

    pub fn dilation(&self, i: usize) -> usize {
        self.dilations.get(i).copied().unwrap_or(1)
    }

    /// Checks the attribute lists against the number of spatial dimensions.
    pub fn check(&self, spatial: usize) -> Result<(), AttrError> {
        let check = |name: &'static str, v: &[usize], want: usize| {
            if !v.is_empty() && v.len() != want {
                return Err(AttrError::Length { name, len: v.len(), want });
            }
            Ok(())
        };
        check("strides", &self.strides, spatial)?;
        check("dilations", &self.dilations, spatial)?;
        check("pads", &self.pads, 2 * spatial)?;
        for (name, v) in [("strides", &self.strides), ("dilations", &self.dilations)] {
            if v.contains(&0) {
                let value = format!("{v:?}");
                return Err(AttrError::OutOfRange {
                    name: name.into(),
                    value,
                    why: "must be positive",
                });
            }
        }
        Ok(())
    }

    /// Resolves spatial axis `i` for an input of size `input` and a kernel of size `kernel`,
    /// following ONNX (auto_pad, and ceil_mode for pooling: a last window that would start in the
    /// end padding is dropped, as PyTorch and onnxruntime do).
    pub fn resolve(
        &self,
        i: usize,
        input: usize,
        kernel: usize,
        ceil_mode: bool,
    ) -> Result<SpatialAxis, OpError> {
        let (stride, dilation) = (self.stride(i), self.dilation(i));
        let extent = dilation * (kernel.max(1) - 1) + 1;
        let (pad_begin, pad_end) = match self.auto_pad {
            AutoPad::NotSet => {
                let half = self.pads.len() / 2;
                (
                    self.pads.get(i).copied().unwrap_or(0),
                    self.pads.get(half + i).copied().unwrap_or(0),
                )
            }
            AutoPad::Valid => (0, 0),
            AutoPad::SameUpper | AutoPad::SameLower => {
                let out = input.div_ceil(stride);
                let total = ((out.max(1) - 1) * stride + extent).saturating_sub(input);
                let small = total / 2;
                if self.auto_pad == AutoPad::SameUpper {
                    (small, total - small)
                } else {
                    (total - small, small)
                }
            }
        };
        let padded = input + pad_begin + pad_end;
        if padded < extent {
            return Err(OpError::WindowTooWide { extent, padded, axis: i });
        }
        let span = padded - extent;
        let mut output = if ceil_mode { span.div_ceil(stride) + 1 } else { span / stride + 1 };
        if ceil_mode && (output - 1) * stride >= input + pad_begin {
            output -= 1;
        }
        Ok(SpatialAxis { input, kernel, stride, dilation, pad_begin, pad_end, output })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(strides: &[usize], dilations: &[usize], pads: &[usize], auto_pad: AutoPad) -> Window {
        Window {
            strides: strides.to_vec(),
            dilations: dilations.to_vec(),
            pads: pads.to_vec(),
            auto_pad,
        }
    }

    #[test]
    fn lists_must_fit_the_spatial_rank_and_steps_be_positive() {
        assert_eq!(Window::unit(2).check(2), Ok(()));
        assert_eq!(window(&[], &[], &[], AutoPad::NotSet).check(3), Ok(()), "empty: defaults");
        assert_eq!(
            window(&[1], &[], &[], AutoPad::NotSet).check(2),
            Err(AttrError::Length { name: "strides", len: 1, want: 2 })
        );
        assert_eq!(
            window(&[1, 1], &[1, 1], &[0, 0], AutoPad::NotSet).check(2),
            Err(AttrError::Length { name: "pads", len: 2, want: 4 })
        );
        let e = window(&[1, 1], &[2, 0], &[], AutoPad::NotSet).check(2).unwrap_err();
        assert_eq!(e.to_string(), "attribute `dilations` must be positive, got [2, 0]");
    }

    #[test]
    fn axes_resolve_as_onnx_pads_them() {
        // Explicit pads: begins, then ends. 7 + 1 + 2 = 10 wide, a 3-window at stride 2: 4.
        let w = window(&[2], &[1], &[1, 2], AutoPad::NotSet);
        let a = w.resolve(0, 7, 3, false).unwrap();
        assert_eq!((a.pad_begin, a.pad_end, a.output), (1, 2, 4));
        // SAME: ceil(7 / 2) = 4 outputs; 1 of padding in all, at the end (upper) or start.
        let upper = window(&[2], &[1], &[], AutoPad::SameUpper).resolve(0, 7, 2, false).unwrap();
        assert_eq!((upper.pad_begin, upper.pad_end, upper.output), (0, 1, 4));
        let lower = window(&[2], &[1], &[], AutoPad::SameLower).resolve(0, 7, 2, false).unwrap();
        assert_eq!((lower.pad_begin, lower.pad_end, lower.output), (1, 0, 4));
        // Dilation 2 makes a 3-window 5 wide.
        let d = window(&[1], &[2], &[], AutoPad::Valid).resolve(0, 7, 3, false).unwrap();
        assert_eq!(d.output, 3);
        // ceil_mode adds the partial last window, unless it would start in the end padding.
        let w = window(&[2], &[1], &[0, 0], AutoPad::NotSet);
        assert_eq!(w.resolve(0, 6, 3, false).unwrap().output, 2);
        assert_eq!(w.resolve(0, 6, 3, true).unwrap().output, 3);
        let w = window(&[2], &[1], &[0, 1], AutoPad::NotSet);
        assert_eq!(w.resolve(0, 5, 2, true).unwrap().output, 3, "starts at 4, inside the input");
        assert_eq!(
            window(&[1], &[3], &[0, 1], AutoPad::NotSet).resolve(0, 4, 3, false),
            Err(OpError::WindowTooWide { extent: 7, padded: 5, axis: 0 })
        );
    }
}
