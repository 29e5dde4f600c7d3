//! A typed reading of a kernel's linalg ops through the MLIR C API: per op its loops (parallel or
//! reduction), its indexing maps as linear expressions, its operands' static shapes and element
//! types, and which op in the kernel produces each operand. Schedules decide from this data, never
//! from printed MLIR, and the data is plain (no MLIR handles), so a decision is a pure function of
//! it. The handles that scripts need to tag ops are kept beside it, in `KernelOps::raw`.

use std::fmt;

use mlir_sys as ffi;

use crate::backend::edit::{self, RawOp};

/// One result of an indexing map: `sum(coefficient * d_i) + constant`, or anything else
/// (floordiv, mod, a symbol...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expr {
    Linear(Vec<(usize, i64)>, i64),
    Opaque,
}

impl Expr {
    /// The loops it reads.
    pub fn dims(&self) -> Vec<usize> {
        match self {
            Expr::Linear(t, _) => t.iter().map(|&(d, _)| d).collect(),
            Expr::Opaque => Vec::new(),
        }
    }

    pub fn coefficient(&self, d: usize) -> Option<i64> {
        match self {
            Expr::Linear(t, _) => t.iter().find(|&&(x, _)| x == d).map(|&(_, c)| c),
            Expr::Opaque => None,
        }
    }

    /// A plain loop (`d3`).
    pub fn as_dim(&self) -> Option<usize> {
        match self {
            Expr::Linear(t, 0) if t.len() == 1 && t[0].1 == 1 => Some(t[0].0),
            _ => None,
        }
    }

    pub fn is_zero(&self) -> bool {
        matches!(self, Expr::Linear(t, 0) if t.is_empty())
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let Expr::Linear(terms, c) = self else { return write!(f, "?") };
        let mut parts: Vec<String> = terms
            .iter()
            .map(|&(d, k)| if k == 1 { format!("d{d}") } else { format!("d{d}*{k}") })
            .collect();
        if *c != 0 || parts.is_empty() {
            parts.push(c.to_string());
        }
        write!(f, "{}", parts.join("+"))
    }
}

/// An operand's element type, as far as schedules care.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    F16,
    BF16,
    F32,
    F64,
    /// A signless integer of this many bits (i1 included).
    Int(u32),
    Index,
    /// Not shaped, or a type schedules do not reason about.
    Other,
}

impl Elem {
    /// The bytes of one element (4 where the type is not one schedules reason about).
    pub fn bytes(self) -> usize {
        match self {
            Elem::F16 | Elem::BF16 => 2,
            Elem::F64 | Elem::Index => 8,
            Elem::Int(b) => (b as usize).div_ceil(8).max(1),
            Elem::F32 | Elem::Other => 4,
        }
    }
}

impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Elem::F16 => write!(f, "f16"),
            Elem::BF16 => write!(f, "bf16"),
            Elem::F32 => write!(f, "f32"),
            Elem::F64 => write!(f, "f64"),
            Elem::Int(b) => write!(f, "i{b}"),
            Elem::Index => write!(f, "index"),
            Elem::Other => write!(f, "?"),
        }
    }
}

/// What kind of op it is, for the schedules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// `linalg.generic`.
    Generic,
    /// `linalg.fill` (a contraction's zero init).
    Fill,
    /// Any other structured linalg op (a named op).
    Named,
    /// `tensor.pad` (fused into workgroups, never tiled itself).
    Pad,
}

/// One op of a kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct LinalgOp {
    pub name: String,
    pub kind: OpKind,
    /// Per loop: parallel (it indexes the result), else a reduction.
    pub parallel: Vec<bool>,
    /// One map per operand (inputs, then outputs); empty for `tensor.pad`.
    pub maps: Vec<Vec<Expr>>,
    /// Static operand shapes (None: dynamic, or not shaped).
    pub shapes: Vec<Option<Vec<usize>>>,
    pub elem: Vec<Elem>,
    pub n_inputs: usize,
    /// The op of the same kernel producing each operand (its index), if any.
    pub producers: Vec<Option<usize>>,
    /// Its body multiplies floats (a contraction, a convolution, a weighted window).
    pub multiplies: bool,
    /// What one iteration of its body costs, in iterations of a body of a few arithmetic ops:
    /// 1, and `TRANSCENDENTAL_COST` more for each transcendental function in it (GELU's erf).
    pub body_cost: usize,
}

/// A transcendental function of the body (`math.erf`, `math.exp`, `math.tanh`, ...): about as
/// much work as this many plain iterations (its polynomial and range reduction; GELU on
/// 128 x 512 floats takes 38 us on the Xeon, a bias add a twentieth of it).
pub const TRANSCENDENTAL_COST: usize = 8;

impl LinalgOp {
    pub fn is_generic(&self) -> bool {
        self.kind == OpKind::Generic
    }

    pub fn loops(&self) -> usize {
        self.parallel.len()
    }

    pub fn output_shape(&self) -> Option<&Vec<usize>> {
        self.shapes.get(self.n_inputs).and_then(|s| s.as_ref())
    }

    /// The extent of every loop, from the static operand shapes.
    pub fn ranges(&self) -> Option<Vec<usize>> {
        if self.kind == OpKind::Fill {
            return self.output_shape().cloned();
        }
        if self.kind == OpKind::Pad {
            return None;
        }
        let mut r = vec![None; self.loops()];
        for (map, shape) in self.maps.iter().zip(&self.shapes) {
            if map.is_empty() {
                continue;
            }
            let shape = shape.as_ref()?;
            for (e, &n) in map.iter().zip(shape) {
                if let Some(d) = e.as_dim() {
                    r[d] = Some(n);
                }
            }
        }
        r.into_iter().collect()
    }

    /// Whether the output map is the identity over the first loops.
    pub fn output_is_identity(&self) -> bool {
        let Some(m) = self.maps.get(self.n_inputs) else { return false };
        m.iter().enumerate().all(|(i, e)| e.as_dim() == Some(i))
    }

    /// Every map reads plain loops or the constant 0 (a projected permutation, broadcasts allowed).
    pub fn maps_are_projections(&self) -> bool {
        self.maps.iter().all(|m| m.iter().all(|e| e.as_dim().is_some() || e.is_zero()))
    }
}

impl fmt::Display for LinalgOp {
    /// `linalg.generic [P,P,R] 64x64x128 f32 (d0,d2) (d2,d1) -> (d0,d1)`.
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}", self.name)?;
        if !self.parallel.is_empty() {
            let it: Vec<&str> = self.parallel.iter().map(|&p| if p { "P" } else { "R" }).collect();
            write!(f, " [{}]", it.join(","))?;
        }
        match self.ranges() {
            Some(r) if !r.is_empty() => {
                write!(f, " {}", r.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("x"))?
            }
            _ => {}
        }
        if let Some(e) = self.elem.get(self.n_inputs) {
            write!(f, " {e}")?;
        }
        if self.kind == OpKind::Generic {
            let map = |m: &Vec<Expr>| {
                format!("({})", m.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(","))
            };
            let ins: Vec<String> =
                self.maps[..self.n_inputs.min(self.maps.len())].iter().map(map).collect();
            let outs: Vec<String> =
                self.maps[self.n_inputs.min(self.maps.len())..].iter().map(map).collect();
            write!(f, " {} -> {}", ins.join(" "), outs.join(" "))?;
        }
        Ok(())
    }
}

/// A kernel's schedulable ops (its function body's top-level linalg ops and pads), in order.
#[derive(Clone, Debug)]
pub struct KernelOps {
    pub ops: Vec<LinalgOp>,
    /// The MLIR op behind each of `ops`.
    pub raw: Vec<RawOp>,
    /// The body has an in-order `scf.for` (scatter updates applied in sequence).
    pub sequential: bool,
}

/// Whether `op` is one the schedules read: a structured linalg op or a `tensor.pad`.
pub fn is_schedulable(op: RawOp) -> bool {
    crate::backend::gpu::loops::is_structured(op) || op.is("tensor.pad")
}

/// The ops of a kernel function's body.
pub fn read_kernel(func: RawOp) -> KernelOps {
    let body = func.children();
    let sequential = body.iter().any(|o| o.is("scf.for"));
    let raw: Vec<RawOp> = body.into_iter().filter(|o| is_schedulable(*o)).collect();
    let mut ops: Vec<LinalgOp> = raw.iter().map(|&o| read_op(o)).collect();
    for (i, &o) in raw.iter().enumerate() {
        ops[i].producers = o
            .operands()
            .into_iter()
            .map(|v| edit::defining_op(v).and_then(|p| raw.iter().position(|&r| r == p)))
            .collect();
    }
    KernelOps { ops, raw, sequential }
}

/// One op, its producers not yet known.
pub fn read_op(op: RawOp) -> LinalgOp {
    let name = op.name();
    let kind = match name.as_str() {
        "linalg.generic" => OpKind::Generic,
        "linalg.fill" => OpKind::Fill,
        "tensor.pad" => OpKind::Pad,
        _ => OpKind::Named,
    };
    let operands = op.operands();
    let types: Vec<ffi::MlirType> = operands.iter().map(|&v| edit::value_type(v)).collect();
    let shapes = types.iter().map(|&t| edit::static_dims(t)).collect();
    let elem = types.iter().map(|&t| element(t)).collect();
    let n_inputs = if kind == OpKind::Pad {
        operands.len()
    } else {
        operands.len().saturating_sub(n_inits(op))
    };
    let maps = if kind == OpKind::Pad { Vec::new() } else { indexing_maps(op) };
    let n_loops =
        maps.iter().flatten().flat_map(Expr::dims).max().map_or(0, |d| d + 1).max(loop_count(op));
    let mut parallel = vec![false; n_loops];
    for map in maps.iter().skip(n_inputs) {
        for e in map {
            if let Some(d) = e.as_dim() {
                parallel[d] = true;
            }
        }
    }
    let mut multiplies = false;
    let mut body_cost = 1;
    for o in op.descendants() {
        multiplies |= o.is("arith.mulf");
        if transcendental(&o.name()) {
            body_cost += TRANSCENDENTAL_COST;
        }
    }
    LinalgOp {
        name,
        kind,
        parallel,
        maps,
        shapes,
        elem,
        n_inputs,
        producers: Vec::new(),
        multiplies,
        body_cost,
    }
}

/// Whether an op of a body is a function computed by a polynomial and a range reduction, not an
/// instruction or two.
fn transcendental(name: &str) -> bool {
    name.strip_prefix("math.").is_some_and(|f| {
        !matches!(
            f,
            "absf"
                | "absi"
                | "fma"
                | "copysign"
                | "floor"
                | "ceil"
                | "round"
                | "roundeven"
                | "trunc"
                | "sqrt"
                | "rsqrt"
                | "ctlz"
                | "cttz"
                | "ctpop"
                | "isnan"
                | "isinf"
                | "isfinite"
        )
    })
}

/// The number of outputs (`outs`) of a structured op. On tensors each gives a result; on buffers
/// (after bufferisation: the copies and fills it adds) there are no results, and the operand
/// segments say, or the last operand is the one output (`linalg.map`).
fn n_inits(op: RawOp) -> usize {
    if op.num_results() > 0 {
        return op.num_results();
    }
    op.attr("operandSegmentSizes")
        .and_then(edit::i32_array_attr)
        .and_then(|s| s.last().map(|&n| n.max(0) as usize))
        .unwrap_or(1)
}

/// The number of loops of a structured op (its maps' dimension count).
fn loop_count(op: RawOp) -> usize {
    // SAFETY: reading a live op's indexing maps attribute (null for non-linalg ops).
    unsafe {
        let maps = ffi::mlirLinalgGetIndexingMapsAttribute(op.0);
        if maps.ptr.is_null()
            || !ffi::mlirAttributeIsAArray(maps)
            || ffi::mlirArrayAttrGetNumElements(maps) == 0
        {
            return 0;
        }
        ffi::mlirAffineMapGetNumDims(ffi::mlirAffineMapAttrGetValue(ffi::mlirArrayAttrGetElement(
            maps, 0,
        ))) as usize
    }
}

fn indexing_maps(op: RawOp) -> Vec<Vec<Expr>> {
    // SAFETY: reading a live op's indexing maps and their affine expressions.
    unsafe {
        let maps = ffi::mlirLinalgGetIndexingMapsAttribute(op.0);
        if maps.ptr.is_null() || !ffi::mlirAttributeIsAArray(maps) {
            return Vec::new();
        }
        (0..ffi::mlirArrayAttrGetNumElements(maps))
            .map(|i| {
                let map = ffi::mlirAffineMapAttrGetValue(ffi::mlirArrayAttrGetElement(maps, i));
                (0..ffi::mlirAffineMapGetNumResults(map))
                    .map(|r| linear(ffi::mlirAffineMapGetResult(map, r)).unwrap_or(Expr::Opaque))
                    .collect()
            })
            .collect()
    }
}

/// An affine expression as `sum(c * d) + k`, when it is one.
fn linear(e: ffi::MlirAffineExpr) -> Option<Expr> {
    // SAFETY: inspecting a live affine expression.
    unsafe {
        if ffi::mlirAffineExprIsADim(e) {
            return Some(Expr::Linear(vec![(ffi::mlirAffineDimExprGetPosition(e) as usize, 1)], 0));
        }
        if ffi::mlirAffineExprIsAConstant(e) {
            return Some(Expr::Linear(Vec::new(), ffi::mlirAffineConstantExprGetValue(e)));
        }
        let (l, r) = (ffi::mlirAffineBinaryOpExprGetLHS(e), ffi::mlirAffineBinaryOpExprGetRHS(e));
        if ffi::mlirAffineExprIsAAdd(e) {
            let (Expr::Linear(mut a, ka), Expr::Linear(b, kb)) = (linear(l)?, linear(r)?) else {
                return None;
            };
            for (d, c) in b {
                match a.iter_mut().find(|(x, _)| *x == d) {
                    Some(t) => t.1 += c,
                    None => a.push((d, c)),
                }
            }
            a.retain(|&(_, c)| c != 0);
            return Some(Expr::Linear(a, ka + kb));
        }
        if ffi::mlirAffineExprIsAMul(e) {
            let (Expr::Linear(a, ka), Expr::Linear(b, kb)) = (linear(l)?, linear(r)?) else {
                return None;
            };
            let (terms, k, c) = match (a.is_empty(), b.is_empty()) {
                (_, true) => (a, ka, kb),
                (true, false) => (b, kb, ka),
                _ => return None,
            };
            let terms: Vec<(usize, i64)> =
                terms.into_iter().map(|(d, x)| (d, x * c)).filter(|&(_, x)| x != 0).collect();
            return Some(Expr::Linear(terms, k * c));
        }
        None
    }
}

fn element(t: ffi::MlirType) -> Elem {
    // SAFETY: querying a live type.
    unsafe {
        if !ffi::mlirTypeIsAShaped(t) {
            return Elem::Other;
        }
        let e = ffi::mlirShapedTypeGetElementType(t);
        if ffi::mlirTypeIsAF32(e) {
            Elem::F32
        } else if ffi::mlirTypeIsAF64(e) {
            Elem::F64
        } else if ffi::mlirTypeIsAF16(e) {
            Elem::F16
        } else if ffi::mlirTypeIsABF16(e) {
            Elem::BF16
        } else if ffi::mlirTypeIsAInteger(e) {
            Elem::Int(ffi::mlirIntegerTypeGetWidth(e))
        } else if ffi::mlirTypeIsAIndex(e) {
            Elem::Index
        } else {
            Elem::Other
        }
    }
}
