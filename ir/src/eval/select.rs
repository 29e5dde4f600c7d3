//! The selecting ops whose result sizes depend on the data: NonMaxSuppression and Unique.
//!
//! Both are computed whole by one function that inference also calls when every operand is a
//! constant, so a folded result's shape and the interpreter's agree by construction.

use std::cmp::Ordering;

use super::typed;
use crate::error::{invalid, OpError};
use crate::{Element, Tensor};

// ----- NonMaxSuppression -----

/// What NonMaxSuppression's optional operands say, read from their values.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NmsLimits {
    /// The most boxes kept per batch and class (a negative count keeps none, as onnxruntime).
    pub max_per_class: usize,
    pub iou_threshold: f64,
    /// Boxes scoring at or below it are never kept.
    pub score_threshold: Option<f64>,
}

impl NmsLimits {
    /// The limits from the optional operands (2, 3 and 4), each one element when present.
    pub(crate) fn read(
        max_per_class: Option<&Tensor>,
        iou_threshold: Option<&Tensor>,
        score_threshold: Option<&Tensor>,
    ) -> Result<NmsLimits, OpError> {
        let one = |t: &Tensor, what: &str| match t.to_f64s().as_slice() {
            [v] => Ok(*v),
            _ => Err(invalid!("{what} must hold one value, got {}", t.ty())),
        };
        let max_per_class = match max_per_class {
            Some(t) => match t.to_i64s().as_slice() {
                [v] => usize::try_from(*v).unwrap_or(0),
                _ => return Err(invalid!("max_output_boxes_per_class must hold one value")),
            },
            None => 0,
        };
        let iou_threshold = iou_threshold.map(|t| one(t, "iou_threshold")).transpose()?;
        let iou_threshold = iou_threshold.unwrap_or(0.0);
        // onnxruntime refuses a threshold outside [0, 1] (NaN included).
        if !(0.0..=1.0).contains(&iou_threshold) {
            return Err(invalid!("iou_threshold {iou_threshold} is outside [0, 1]"));
        }
        let score_threshold = score_threshold.map(|t| one(t, "score_threshold")).transpose()?;
        Ok(NmsLimits { max_per_class, iou_threshold, score_threshold })
    }
}

/// A box as its extent on each axis, whatever corners or centre it was given by.
#[derive(Clone, Copy, Debug)]
struct Extent {
    y_min: f64,
    x_min: f64,
    y_max: f64,
    x_max: f64,
}

impl Extent {
    fn new(b: &[f64], center_point_box: bool) -> Extent {
        if center_point_box {
            let (xc, yc, w, h) = (b[0], b[1], b[2], b[3]);
            Extent {
                y_min: yc - h / 2.0,
                x_min: xc - w / 2.0,
                y_max: yc + h / 2.0,
                x_max: xc + w / 2.0,
            }
        } else {
            Extent {
                y_min: b[0].min(b[2]),
                x_min: b[1].min(b[3]),
                y_max: b[0].max(b[2]),
                x_max: b[1].max(b[3]),
            }
        }
    }

    fn area(&self) -> f64 {
        (self.y_max - self.y_min) * (self.x_max - self.x_min)
    }

    /// Whether `self` and `other` overlap by more than `threshold` (intersection over union);
    /// boxes of no area never do (onnxruntime's rule).
    fn overlaps(&self, other: &Extent, threshold: f64) -> bool {
        let y_min = self.y_min.max(other.y_min);
        let x_min = self.x_min.max(other.x_min);
        let y_max = self.y_max.min(other.y_max);
        let x_max = self.x_max.min(other.x_max);
        if y_max <= y_min || x_max <= x_min {
            return false;
        }
        let (a, b) = (self.area(), other.area());
        let intersection = (y_max - y_min) * (x_max - x_min);
        let union = a + b - intersection;
        if a <= 0.0 || b <= 0.0 || union <= 0.0 {
            return false;
        }
        intersection / union > threshold
    }
}

/// The kept boxes as `[batch, class, box]` rows, batch by batch, class by class, each class's in
/// the order they were kept. `boxes` is `[B, N, 4]` and `scores` `[B, C, N]` (inference checked).
pub(crate) fn non_max_suppression(
    boxes: &Tensor,
    scores: &Tensor,
    limits: NmsLimits,
    center_point_box: bool,
) -> Result<Vec<[i64; 3]>, OpError> {
    let (&[batches, n, four], &[score_batches, classes, score_n]) = (boxes.dims(), scores.dims())
    else {
        return Err(invalid!("boxes {} and scores {} must be 3-D", boxes.ty(), scores.ty()));
    };
    if four != 4 || score_batches != batches || score_n != n {
        return Err(invalid!(
            "boxes {} and scores {} disagree (boxes [B, N, 4], scores [B, C, N])",
            boxes.ty(),
            scores.ty()
        ));
    }
    let coords = boxes.to_f64s();
    let all_scores = scores.to_f64s();
    let mut rows = Vec::new();
    for b in 0..batches {
        let extents: Vec<Extent> = coords[b * n * 4..(b + 1) * n * 4]
            .chunks_exact(4)
            .map(|c| Extent::new(c, center_point_box))
            .collect();
        for c in 0..classes {
            let class_scores = &all_scores[(b * classes + c) * n..(b * classes + c + 1) * n];
            let kept = keep_boxes(&extents, class_scores, limits);
            rows.extend(kept.into_iter().map(|i| [b as i64, c as i64, i as i64]));
        }
    }
    Ok(rows)
}

/// One batch and class: the indices of the kept boxes, in the order they were kept.
fn keep_boxes(extents: &[Extent], scores: &[f64], limits: NmsLimits) -> Vec<usize> {
    if limits.max_per_class == 0 {
        return Vec::new();
    }
    let mut candidates: Vec<usize> = (0..scores.len())
        .filter(|&i| limits.score_threshold.is_none_or(|t| scores[i] > t))
        .collect();
    // Highest score first; a stable sort keeps the lower index first among equal scores.
    candidates.sort_by(|&i, &j| scores[j].total_cmp(&scores[i]));
    let mut kept: Vec<usize> = Vec::new();
    for i in candidates {
        if kept.len() == limits.max_per_class {
            break;
        }
        if !kept.iter().any(|&k| extents[k].overlaps(&extents[i], limits.iou_threshold)) {
            kept.push(i);
        }
    }
    kept
}

/// The rows as NonMaxSuppression's result, i64 `[n, 3]`.
pub(crate) fn nms_tensor(rows: &[[i64; 3]]) -> Tensor {
    Tensor::from_vec(&[rows.len(), 3], rows.concat()).expect("three indices a row")
}

// ----- Unique -----

/// An element as Unique compares it: integers (and bools) exactly, floats by value with every
/// NaN equal to every other and after all numbers, -0.0 equal to 0.0 (numpy's `unique`).
#[derive(Clone, Copy, Debug)]
enum Key {
    Int(i128),
    Float(f64),
}

impl Key {
    fn of<T: Element>(v: T) -> Key {
        v.to_i128().map_or_else(|| Key::Float(v.to_f64()), Key::Int)
    }

    fn cmp(&self, other: &Key) -> Ordering {
        match (self, other) {
            (Key::Int(a), Key::Int(b)) => a.cmp(b),
            (Key::Float(a), Key::Float(b)) => match (a.is_nan(), b.is_nan()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => a.partial_cmp(b).expect("neither is NaN"),
            },
            // One tensor has one dtype, so its keys are all of one kind.
            (Key::Int(_), Key::Float(_)) => Ordering::Less,
            (Key::Float(_), Key::Int(_)) => Ordering::Greater,
        }
    }
}

fn keys<T: Element>(x: &Tensor) -> Vec<Key> {
    x.as_slice::<T>().expect("dispatched on the dtype").iter().map(|&v| Key::of(v)).collect()
}

/// What Unique finds: the distinct entries (each named by its first position), and where each
/// input position's entry went.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Distinct {
    /// Each distinct entry's first position along the axis (or in the flattened input).
    pub first: Vec<usize>,
    /// How many positions hold each distinct entry.
    pub counts: Vec<usize>,
    /// For every position, the index of its entry in `first`.
    pub inverse: Vec<usize>,
    /// The positions along the axis (the element count without one), the elements between
    /// consecutive positions, and the outer slices: the layout `y` is picked with.
    pub along: usize,
    pub inner: usize,
    pub outer: usize,
}

/// The distinct entries of `x`: its elements (flattened) without an axis, else its slices along
/// axis `a` (in range: inference checked), ascending when `sorted`, else by first occurrence.
pub(crate) fn unique(x: &Tensor, a: Option<usize>, sorted: bool) -> Distinct {
    let dims = x.dims();
    let (outer, along, inner) = match a {
        Some(a) => (dims[..a].iter().product(), dims[a], dims[a + 1..].iter().product()),
        None => (1, x.len(), 1),
    };
    let keys = typed!(x.dtype(), keys(x));
    // Position p's entry, lexicographically: the outer slices in turn, each its inner elements.
    let entry = |p: usize| {
        (0..outer).flat_map(move |o| (0..inner).map(move |i| (o * along + p) * inner + i))
    };
    let compare = |p: usize, q: usize| {
        entry(p)
            .zip(entry(q))
            .map(|(i, j)| keys[i].cmp(&keys[j]))
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
    };
    // A stable sort keeps each group's first position first.
    let mut order: Vec<usize> = (0..along).collect();
    order.sort_by(|&p, &q| compare(p, q));
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for p in order {
        match groups.last_mut() {
            Some(g) if compare(g[0], p).is_eq() => g.push(p),
            _ => groups.push(vec![p]),
        }
    }
    if !sorted {
        groups.sort_by_key(|g| g[0]);
    }
    let mut inverse = vec![0; along];
    for (k, g) in groups.iter().enumerate() {
        for &p in g {
            inverse[p] = k;
        }
    }
    Distinct {
        first: groups.iter().map(|g| g[0]).collect(),
        counts: groups.iter().map(Vec::len).collect(),
        inverse,
        along,
        inner,
        outer,
    }
}

impl Distinct {
    /// The flat offsets in `x` of `y`'s elements.
    pub(crate) fn offsets(&self) -> Vec<usize> {
        let mut offs = Vec::with_capacity(self.outer * self.first.len() * self.inner);
        for o in 0..self.outer {
            for &p in &self.first {
                let start = (o * self.along + p) * self.inner;
                offs.extend(start..start + self.inner);
            }
        }
        offs
    }
}
