//! GridSample: one `linalg.generic` over the result `[N, C, H1..Hr]`. Each element reads its
//! point from the grid, maps it to pixel coordinates and pads it (border, reflection) as
//! `kiln_ir::eval` does, then sums its taps (1, 2 or 4 an axis, every combination unrolled:
//! at most 64 for a cubic 3-D point) with `tensor.extract` at their padded indices. It computes
//! in f64 with the interpreter's operations in its order, so the two agree to the last bit but
//! for the result's rounding. AffineGrid is decomposed (`passes/decompose/image.rs`).

use kiln_ir::eval::{grid_bounds, GRID_COORD_BOUND, GRID_CUBIC_A};
use kiln_ir::op::{GridPadding, ResizeMode};
use kiln_ir::{DType, NodeId, Op, ValueId};
use melior::dialect::arith::CmpfPredicate;
use melior::ir::Value;

use super::indexing::{over_output, Ix};
use super::mlir::err;
use super::Emitter;
use crate::Result;

pub(super) fn emit(em: &mut Emitter, id: NodeId) -> Result<()> {
    let graph = em.graph;
    let &Op::GridSample { mode, padding, align_corners } = &graph.node(id).op else {
        return Err(em.unsupported(id, "is not a GridSample"));
    };
    let operands = graph.operands(id);
    let x = operands.first().copied().flatten().ok_or_else(|| err("GridSample has no input"))?;
    let grid = operands.get(1).copied().flatten().ok_or_else(|| err("GridSample has no grid"))?;
    let result = ValueId::from(id);
    let (xd, od) = (em.dims(x), em.dims(result));
    let spatial: Vec<usize> = xd.get(2..).map(<[usize]>::to_vec).unwrap_or_default();
    let (dtype, x_dtype, grid_dtype) = (em.ty(result).dtype, em.ty(x).dtype, em.ty(grid).dtype);
    if od.contains(&0) {
        let d = em.dest(result)?;
        em.set(result, d);
        return Ok(());
    }
    // An empty image: every tap reads zero padding (other paddings have no pixel to read, which
    // the interpreter refuses too).
    let empty = spatial.contains(&0);
    if empty && padding != GridPadding::Zeros {
        return Err(em.unsupported(id, "samples an image with no pixels"));
    }
    let plan = Plan {
        x: em.value(x)?,
        grid: em.value(grid)?,
        x_dtype,
        grid_dtype,
        spatial,
        mode,
        padding,
        align_corners,
    };
    over_output(em, result, &[], |ix, _| {
        if empty {
            return ix.store_f64(ix.sb.constant(0.0, "f64")?, dtype);
        }
        let v = plan.sample(ix)?;
        ix.store_f64(v, dtype)
    })
}

struct Plan<'c, 'a> {
    x: Value<'c, 'a>,
    grid: Value<'c, 'a>,
    x_dtype: DType,
    grid_dtype: DType,
    spatial: Vec<usize>,
    mode: ResizeMode,
    padding: GridPadding,
    align_corners: bool,
}

/// One tap along an axis: the index it reads (clamped inside), whether it reads a pixel (false
/// where zero padding applies) and its weight.
struct Tap<'c, 'b> {
    index: Value<'c, 'b>,
    inside: Option<Value<'c, 'b>>,
    weight: Value<'c, 'b>,
}

impl<'c> Plan<'c, '_> {
    /// The result element at the generic's indices, in f64.
    fn sample<'b>(&self, ix: &Ix<'c, 'b>) -> Result<Value<'c, 'b>> {
        let r = self.spatial.len();
        let (n, ch) = (ix.loop_index(0)?, ix.loop_index(1)?);
        let mut at: Vec<Value> = vec![n];
        for d in 0..r {
            at.push(ix.loop_index(2 + d)?);
        }
        let mut taps = Vec::with_capacity(r);
        for (i, &d) in self.spatial.iter().enumerate() {
            // Axis i (outermost first) takes the point's coordinate r - 1 - i.
            let mut coords = at.clone();
            coords.push(ix.c((r - 1 - i) as i128)?);
            let g = ix.extract(self.grid, &coords, self.grid_dtype)?;
            let g = ix.to_f64(g, self.grid_dtype)?;
            let x = self.denormalize(ix, g, d)?;
            taps.push(self.axis_taps(ix, x, d)?);
        }
        let mut base = vec![n, ch];
        base.reserve(r);
        self.combine(ix, &taps, &mut base)
    }

    /// `kiln_ir::eval::grid_denormalize`, in the grid's precision (f32 unless it is f64).
    fn denormalize<'b>(
        &self,
        ix: &Ix<'c, 'b>,
        g: Value<'c, 'b>,
        d: usize,
    ) -> Result<Value<'c, 'b>> {
        let sb = &ix.sb;
        let f = |v: f64| sb.constant(v, "f64");
        let d = d as f64;
        let up = sb.emit("arith.addf", &[g, f(1.0)?], "f64")?;
        let x = if self.align_corners {
            let half = sb.emit("arith.divf", &[up, f(2.0)?], "f64")?;
            sb.emit("arith.mulf", &[half, f(d - 1.0)?], "f64")?
        } else {
            let scaled = sb.emit("arith.mulf", &[up, f(d)?], "f64")?;
            let less = sb.emit("arith.subf", &[scaled, f(1.0)?], "f64")?;
            sb.emit("arith.divf", &[less, f(2.0)?], "f64")?
        };
        if self.grid_dtype == DType::F64 {
            return Ok(x);
        }
        let narrow = sb.emit("arith.truncf", &[x], "f32")?;
        sb.emit("arith.extf", &[narrow], "f64")
    }

    /// `kiln_ir::eval`'s `grid_axis_taps`: the coordinate bounded (NaN to the lower bound),
    /// rounded for nearest, brought inside by the padding; then the mode's taps.
    fn axis_taps<'b>(
        &self,
        ix: &Ix<'c, 'b>,
        x: Value<'c, 'b>,
        d: usize,
    ) -> Result<Vec<Tap<'c, 'b>>> {
        let sb = &ix.sb;
        let f = |v: f64| sb.constant(v, "f64");
        let nan = sb.cmpf(CmpfPredicate::Uno, x, x)?;
        let x = clamp(ix, x, -GRID_COORD_BOUND, GRID_COORD_BOUND)?;
        let mut x = sb.select(nan, f(-GRID_COORD_BOUND)?, x, "f64")?;
        if self.mode == ResizeMode::Nearest {
            x = sb.emit("math.roundeven", &[x], "f64")?;
        }
        let (lo, hi) = grid_bounds(d, self.align_corners);
        match self.padding {
            GridPadding::Zeros => {}
            GridPadding::Border => {
                let outside = outside(ix, x, lo, hi)?;
                let inside = clamp(ix, x, 0.0, d as f64 - 1.0)?;
                x = sb.select(outside, inside, x, "f64")?;
            }
            // Reflection leaves a point between the bounds where it is.
            GridPadding::Reflection => x = reflect(ix, x, lo, hi)?,
        }
        let w = |v: f64| f(v);
        match self.mode {
            ResizeMode::Nearest => Ok(vec![self.tap(ix, trunc(ix, x)?, w(1.0)?, d)?]),
            ResizeMode::Linear => {
                let x0 = sb.emit("math.floor", &[x], "f64")?;
                let t = sb.emit("arith.subf", &[x, x0], "f64")?;
                let x1 = sb.emit("arith.addf", &[x0, f(1.0)?], "f64")?;
                let w0 = sb.emit("arith.subf", &[f(1.0)?, t], "f64")?;
                Ok(vec![self.tap(ix, x0, w0, d)?, self.tap(ix, x1, t, d)?])
            }
            ResizeMode::Cubic => {
                let x0 = sb.emit("math.floor", &[x], "f64")?;
                let t = sb.emit("arith.subf", &[x, x0], "f64")?;
                let weights = cubic_weights(ix, t)?;
                let mut taps = Vec::with_capacity(4);
                for (k, weight) in weights.into_iter().enumerate() {
                    let i = sb.emit("arith.addf", &[x0, f(k as f64 - 1.0)?], "f64")?;
                    taps.push(self.tap(ix, i, weight, d)?);
                }
                Ok(taps)
            }
        }
    }

    /// The tap at (integral) coordinate `i`, padded as `kiln_ir::eval`'s `grid_pixel`.
    fn tap<'b>(
        &self,
        ix: &Ix<'c, 'b>,
        i: Value<'c, 'b>,
        weight: Value<'c, 'b>,
        d: usize,
    ) -> Result<Tap<'c, 'b>> {
        let sb = &ix.sb;
        let last = d as f64 - 1.0;
        let (i, inside) = match self.padding {
            GridPadding::Zeros => {
                let out = outside(ix, i, 0.0, last)?;
                let inside = sb.emit("arith.xori", &[out, sb.int_constant(1, "i1")?], "i1")?;
                (clamp(ix, i, 0.0, last)?, Some(inside))
            }
            GridPadding::Border => (clamp(ix, i, 0.0, last)?, None),
            GridPadding::Reflection => {
                let (lo, hi) = grid_bounds(d, self.align_corners);
                let folded = trunc(ix, reflect(ix, i, lo, hi)?)?;
                (clamp(ix, folded, 0.0, last)?, None)
            }
        };
        let i = sb.emit("arith.fptosi", &[i], "i64")?;
        Ok(Tap { index: ix.i64_to_index(i)?, inside, weight })
    }

    /// `kiln_ir::eval`'s `grid_combine`: Σ over axis `base.len() - 2`'s taps of weight times the
    /// sum over the axes after it, from 0 in tap order.
    fn combine<'b>(
        &self,
        ix: &Ix<'c, 'b>,
        taps: &[Vec<Tap<'c, 'b>>],
        base: &mut Vec<Value<'c, 'b>>,
    ) -> Result<Value<'c, 'b>> {
        let sb = &ix.sb;
        let Some((first, rest)) = taps.split_first() else {
            return Err(err("GridSample: a point with no axes"));
        };
        let mut sum = sb.constant(0.0, "f64")?;
        for tap in first {
            base.push(tap.index);
            let v = if rest.is_empty() {
                let v = ix.extract(self.x, base, self.x_dtype)?;
                ix.to_f64(v, self.x_dtype)?
            } else {
                self.combine(ix, rest, base)?
            };
            base.pop();
            let v = match tap.inside {
                Some(inside) => sb.select(inside, v, sb.constant(0.0, "f64")?, "f64")?,
                None => v,
            };
            let term = sb.emit("arith.mulf", &[tap.weight, v], "f64")?;
            sum = sb.emit("arith.addf", &[sum, term], "f64")?;
        }
        Ok(sum)
    }
}

/// `x < lo || x > hi`.
fn outside<'c, 'b>(ix: &Ix<'c, 'b>, x: Value<'c, 'b>, lo: f64, hi: f64) -> Result<Value<'c, 'b>> {
    let sb = &ix.sb;
    let below = sb.cmpf(CmpfPredicate::Olt, x, sb.constant(lo, "f64")?)?;
    let above = sb.cmpf(CmpfPredicate::Ogt, x, sb.constant(hi, "f64")?)?;
    sb.emit("arith.ori", &[below, above], "i1")
}

/// `x` clamped to `[lo, hi]` (x is never NaN here).
fn clamp<'c, 'b>(ix: &Ix<'c, 'b>, x: Value<'c, 'b>, lo: f64, hi: f64) -> Result<Value<'c, 'b>> {
    let sb = &ix.sb;
    let (l, h) = (sb.constant(lo, "f64")?, sb.constant(hi, "f64")?);
    let below = sb.cmpf(CmpfPredicate::Olt, x, l)?;
    let x = sb.select(below, l, x, "f64")?;
    let above = sb.cmpf(CmpfPredicate::Ogt, x, h)?;
    sb.select(above, h, x, "f64")
}

/// Rounding toward zero, from floor and ceil (which every target lowers).
fn trunc<'c, 'b>(ix: &Ix<'c, 'b>, x: Value<'c, 'b>) -> Result<Value<'c, 'b>> {
    let sb = &ix.sb;
    let neg = sb.cmpf(CmpfPredicate::Olt, x, sb.constant(0.0, "f64")?)?;
    let up = sb.emit("math.ceil", &[x], "f64")?;
    let down = sb.emit("math.floor", &[x], "f64")?;
    sb.select(neg, up, down, "f64")
}

/// `kiln_ir::eval::grid_reflect` without branches: both folds are computed, the one that
/// applies selected.
fn reflect<'c, 'b>(ix: &Ix<'c, 'b>, x: Value<'c, 'b>, lo: f64, hi: f64) -> Result<Value<'c, 'b>> {
    let sb = &ix.sb;
    let f = |v: f64| sb.constant(v, "f64");
    let span = hi - lo;
    if span <= 0.0 {
        return f(lo);
    }
    let (l, h) = (f(lo)?, f(hi)?);
    let below = sb.cmpf(CmpfPredicate::Olt, x, l)?;
    let above = sb.cmpf(CmpfPredicate::Ogt, x, h)?;
    let past_lo = sb.emit("arith.subf", &[l, x], "f64")?;
    let past_hi = sb.emit("arith.subf", &[x, h], "f64")?;
    let past = sb.select(below, past_lo, past_hi, "f64")?;
    let span = f(span)?;
    let ratio = sb.emit("arith.divf", &[past, span], "f64")?;
    let folds = sb.emit("math.floor", &[ratio], "f64")?;
    let whole = sb.emit("arith.mulf", &[folds, span], "f64")?;
    let rest = sb.emit("arith.subf", &[past, whole], "f64")?;
    let half = sb.emit("arith.divf", &[folds, f(2.0)?], "f64")?;
    let half = sb.emit("math.floor", &[half], "f64")?;
    let twice = sb.emit("arith.mulf", &[f(2.0)?, half], "f64")?;
    let parity = sb.emit("arith.subf", &[folds, twice], "f64")?;
    let even = sb.cmpf(CmpfPredicate::Oeq, parity, f(0.0)?)?;
    let from_lo = sb.emit("arith.addf", &[l, rest], "f64")?;
    let from_hi = sb.emit("arith.subf", &[h, rest], "f64")?;
    let below_v = sb.select(even, from_lo, from_hi, "f64")?;
    let above_v = sb.select(even, from_hi, from_lo, "f64")?;
    let v = sb.select(above, above_v, x, "f64")?;
    sb.select(below, below_v, v, "f64")
}

/// `kiln_ir::eval::grid_cubic_weights`.
fn cubic_weights<'c, 'b>(ix: &Ix<'c, 'b>, t: Value<'c, 'b>) -> Result<Vec<Value<'c, 'b>>> {
    let sb = &ix.sb;
    let f = |v: f64| sb.constant(v, "f64");
    let a = GRID_CUBIC_A;
    let mul = |p: Value<'c, 'b>, q: Value<'c, 'b>| sb.emit("arith.mulf", &[p, q], "f64");
    let add = |p: Value<'c, 'b>, q: Value<'c, 'b>| sb.emit("arith.addf", &[p, q], "f64");
    let sub = |p: Value<'c, 'b>, q: Value<'c, 'b>| sb.emit("arith.subf", &[p, q], "f64");
    // ((a s - 5a) s + 8a) s - 4a
    let outer = |s: Value<'c, 'b>| -> Result<Value<'c, 'b>> {
        let v = sub(mul(f(a)?, s)?, f(5.0 * a)?)?;
        let v = add(mul(v, s)?, f(8.0 * a)?)?;
        sub(mul(v, s)?, f(4.0 * a)?)
    };
    // ((a + 2) s - (a + 3)) s s + 1
    let inner = |s: Value<'c, 'b>| -> Result<Value<'c, 'b>> {
        let v = sub(mul(f(a + 2.0)?, s)?, f(a + 3.0)?)?;
        add(mul(mul(v, s)?, s)?, f(1.0)?)
    };
    let one = f(1.0)?;
    Ok(vec![outer(add(t, one)?)?, inner(t)?, inner(sub(one, t)?)?, outer(sub(f(2.0)?, t)?)?])
}
