//! ONNX's classic-ML domain (`ai.onnx.ml`), the ops on numeric tensors: Binarizer,
//! ArrayFeatureExtractor and TreeEnsemble (opset 5), expanded at import into ordinary ops
//! (nodes named `<node>/<part>`), so the interpreter and every target run them with no op of
//! their own. LabelEncoder (opset 2 on) becomes kiln's LabelEncoder op, its key and value
//! lists turned into tensors; it maps strings too, which only the interpreter (the host) holds.

use super::import::GraphImporter;
use super::ops::{attr, err};
use super::proto::NodeProto;
use crate::error::AttrError;
use crate::op::{Attrs, Reduce, ReduceKind};
use crate::{BinaryOp, DType, IrError, Op, Result, Tensor, UnaryOp, ValueId};

pub(super) const DOMAIN: &str = "ai.onnx.ml";

/// The ops of the domain the importer converts.
pub(super) const OPS: &[&str] =
    &["Binarizer", "ArrayFeatureExtractor", "TreeEnsemble", "LabelEncoder"];

/// Whether the importer converts `op_type` of the domain's opset `opset`: TreeEnsemble is
/// new in opset 5 (the older TreeEnsembleRegressor/Classifier are other ops); the others
/// have kept their meaning since opset 1.
pub(super) fn supports(op_type: &str, opset: i64) -> bool {
    OPS.contains(&op_type)
        && (op_type != "TreeEnsemble" || opset >= 5)
        && (op_type != "LabelEncoder" || opset >= 2)
}

pub(super) fn convert(
    im: &mut GraphImporter,
    node: &NodeProto,
    op_type: &str,
    a: Attrs,
) -> Result<()> {
    match op_type {
        "Binarizer" => binarizer(im, node, a),
        "ArrayFeatureExtractor" => array_feature_extractor(im, node, a),
        "TreeEnsemble" => tree_ensemble(im, node, a),
        "LabelEncoder" => label_encoder(im, node, a),
        other => Err(IrError::NotSupported(format!("{DOMAIN}.{other} is not supported"))),
    }
}

/// LabelEncoder (opset 2 on): exactly one of `keys_strings`/`keys_int64s`/`keys_floats`/
/// `keys_tensor` and one of the `values_*` alike, as 1-D tensors; the default is
/// `default_tensor`, else the `default_*` of the values' type (ONNX's defaults: "_Unused", -1,
/// -0.0).
fn label_encoder(im: &mut GraphImporter, node: &NodeProto, mut a: Attrs) -> Result<()> {
    let keys = one_list(&mut a, "keys")?;
    let values = one_list(&mut a, "values")?;
    let default_string = a.string("default_string", "_Unused").map_err(attr)?;
    let default_int = a.int("default_int64", -1).map_err(attr)?;
    let default_float = a.float("default_float", -0.0).map_err(attr)?;
    let default = match a.tensor("default_tensor").map_err(attr)? {
        Some(t) => t.reshape(&[1]).map_err(|_| err("default_tensor must hold one value"))?,
        None if values.dtype().is_string() => Tensor::from_strings(&[1], vec![default_string])?,
        None if values.dtype().is_float() => {
            Tensor::from_f64s(values.dtype(), &[1], &[f64::from(default_float)])?
        }
        None => Tensor::from_f64s(values.dtype(), &[1], &[default_int as f64])?,
    };
    a.finish("LabelEncoder").map_err(attr)?;
    let x = operand0(im, node)?;
    let y = im.add1(node, "", Op::LabelEncoder { keys, values, default }, &[x])?;
    im.bind(node, &[y])
}

/// The one list of `<what>_strings`, `<what>_int64s`, `<what>_floats` or `<what>_tensor` given,
/// as a 1-D tensor.
fn one_list(a: &mut Attrs, what: &str) -> Result<Tensor> {
    let mut found = Vec::new();
    if let Some(s) = a.strings(&format!("{what}_strings")).map_err(attr)? {
        found.push(Tensor::from_strings(&[s.len()], s)?);
    }
    if let Some(v) = a.ints(&format!("{what}_int64s")).map_err(attr)? {
        found.push(Tensor::vector(&v));
    }
    if let Some(v) = a.floats(&format!("{what}_floats")).map_err(attr)? {
        found.push(Tensor::vector(&v));
    }
    if let Some(t) = a.tensor(&format!("{what}_tensor")).map_err(attr)? {
        found.push(t.reshape(&[t.len()])?);
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        n => Err(err(format!(
            "exactly one of {what}_strings, {what}_int64s, {what}_floats and {what}_tensor must be given, got {n}"
        ))),
    }
}

fn operand0(im: &GraphImporter, node: &NodeProto) -> Result<ValueId> {
    im.operand(node, 0).ok_or_else(|| err("operand 0 (X) is missing"))
}

/// Binarizer: `Y = X > threshold ? 1 : 0`, in X's type (NaN gives 0).
fn binarizer(im: &mut GraphImporter, node: &NodeProto, mut a: Attrs) -> Result<()> {
    let threshold = a.float("threshold", 0.0).map_err(attr)?;
    a.finish("Binarizer").map_err(attr)?;
    let x = operand0(im, node)?;
    let dtype = im.ty(x).dtype;
    if !matches!(dtype, DType::F32 | DType::F64 | DType::I64 | DType::I32) {
        return Err(err(format!("X {} must be f32, f64, i64 or i32", im.ty(x))));
    }
    let (compare, t) = threshold_for(dtype, f64::from(threshold));
    let t = im.constant(node, "threshold", t)?;
    let (on, off) = (Tensor::full(dtype, &[], 1.0), Tensor::full(dtype, &[], 0.0));
    let (on, off) = (im.constant(node, "one", on)?, im.constant(node, "zero", off)?);
    let above = im.add1(node, "above", Op::Binary(compare), &[x, t])?;
    let y = im.add1(node, "", Op::Where, &[above, on, off])?;
    im.bind(node, &[y])
}

/// The comparison and the constant of X's type that give `x > threshold` as ONNX's reference
/// computes it (in f64). An integer x is above t exactly when it is above floor(t); a t beyond
/// the type's range (or NaN, which nothing is above) becomes a comparison that always or never
/// holds: a plain `as` cast would truncate -0.5 to 0 (0 > -0.5 but not 0 > 0) and NaN to 0.
fn threshold_for(dtype: DType, threshold: f64) -> (BinaryOp, Tensor) {
    let (min, max) = match dtype {
        DType::I64 => (i64::MIN, i64::MAX),
        DType::I32 => (i64::from(i32::MIN), i64::from(i32::MAX)),
        _ => return (BinaryOp::Greater, Tensor::full(dtype, &[], threshold)),
    };
    let constant = |v: i64| match dtype {
        // In range by construction (clamped to i32's bounds).
        DType::I32 => Tensor::scalar(v as i32),
        _ => Tensor::scalar(v),
    };
    let floor = threshold.floor();
    if threshold.is_nan() || floor >= max as f64 {
        (BinaryOp::Greater, constant(max))
    } else if floor < min as f64 {
        (BinaryOp::GreaterOrEqual, constant(min))
    } else {
        (BinaryOp::Greater, constant(floor as i64))
    }
}

/// ArrayFeatureExtractor `(X, Y) -> Z`: X's elements at the indices Y along its last axis
/// (`X[..., Y]` with Y flattened; a 1-D X gives `[1, len(Y)]`, as onnxruntime does).
fn array_feature_extractor(im: &mut GraphImporter, node: &NodeProto, a: Attrs) -> Result<()> {
    a.finish("ArrayFeatureExtractor").map_err(attr)?;
    let x = operand0(im, node)?;
    let y = im.operand(node, 1).ok_or_else(|| err("operand 1 (Y) is missing"))?;
    let (tx, ty) = (im.ty(x).clone(), im.ty(y).clone());
    if tx.rank() == 0 || ty.dtype != DType::I64 {
        return Err(err(format!("X {tx} must have an axis and Y {ty} must be i64")));
    }
    let indices = im.flatten(node, "indices", y)?;
    let reshape = Op::Reshape { allowzero: false };
    let last = tx.rank() as i64 - 1;
    if tx.rank() > 1 {
        let z = im.add1(node, "", Op::Gather { axis: last }, &[x, indices])?;
        return im.bind(node, &[z]);
    }
    let z = im.add1(node, "gathered", Op::Gather { axis: 0 }, &[x, indices])?;
    let row = im.constant(node, "row", Tensor::vector(&[1i64, -1]))?;
    let z = im.add1(node, "", reshape, &[z, row])?;
    im.bind(node, &[z])
}

/// A node's comparison (TreeEnsemble's `nodes_modes`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Leq,
    Lt,
    Gte,
    Gt,
    Eq,
    Neq,
    Member,
}

impl Mode {
    const ALL: [Mode; 7] =
        [Mode::Leq, Mode::Lt, Mode::Gte, Mode::Gt, Mode::Eq, Mode::Neq, Mode::Member];

    fn compare(self) -> Option<BinaryOp> {
        Some(match self {
            Mode::Leq => BinaryOp::LessOrEqual,
            Mode::Lt => BinaryOp::Less,
            Mode::Gte => BinaryOp::GreaterOrEqual,
            Mode::Gt => BinaryOp::Greater,
            Mode::Eq => BinaryOp::Equal,
            Mode::Neq => return None,
            Mode::Member => return None,
        })
    }
}

/// TreeEnsemble's attributes, checked against each other.
struct Ensemble {
    splits: Tensor,
    features: Vec<usize>,
    modes: Vec<Mode>,
    true_ids: Vec<usize>,
    false_ids: Vec<usize>,
    true_leafs: Vec<bool>,
    false_leafs: Vec<bool>,
    missing_true: Vec<bool>,
    /// Each Member node's set (in node order), from `membership_values`.
    sets: Vec<Vec<f64>>,
    targets: Vec<usize>,
    weights: Vec<f64>,
    roots: Vec<usize>,
    n_targets: usize,
    aggregate: ReduceKind,
}

/// One root-to-leaf path of a tree: the conditions on it (node, the way taken) and its leaf.
struct Path {
    literals: Vec<(usize, bool)>,
    leaf: usize,
}

/// The most root-to-leaf paths an ensemble may have (each becomes a column of the expansion).
const MAX_PATHS: usize = 1 << 16;

/// The most entries one constant table of the expansion (the paths' literals, the member sets,
/// the paths' targets) and all the paths' literals together may have: hostile attributes
/// (a huge n_targets, a chain of 65k nodes, one huge member set among many nodes) give a typed
/// error instead of gigabytes.
const MAX_TABLE: usize = crate::fold::FOLD_LIMIT;

/// `rows * cols` entries for `what`, within `MAX_TABLE`.
fn table_size(rows: usize, cols: usize, what: &str) -> Result<usize> {
    rows.checked_mul(cols).filter(|&n| n <= MAX_TABLE).ok_or_else(|| {
        IrError::NotSupported(format!(
            "{what} would be a table of {rows} x {cols} entries, more than {MAX_TABLE}"
        ))
    })
}

impl Ensemble {
    fn read(mut a: Attrs, dtype: DType) -> Result<Ensemble> {
        let tensor =
            |a: &mut Attrs, name: &str| -> Result<Option<Tensor>> { a.tensor(name).map_err(attr) };
        let required = |t: Option<Tensor>, name: &str| {
            t.ok_or_else(|| attr(AttrError::Missing { name: name.into() }))
        };
        // Required lists of sizes (Attrs::sizes takes a missing one as empty).
        let sizes = |a: &mut Attrs, name: &str| -> Result<Vec<usize>> {
            if !a.contains(name) {
                return Err(attr(AttrError::Missing { name: name.into() }));
            }
            a.sizes(name).map_err(attr)
        };
        let flags = |v: Vec<usize>| v.into_iter().map(|f| f != 0).collect::<Vec<bool>>();
        let splits = required(tensor(&mut a, "nodes_splits")?, "nodes_splits")?;
        let modes_t = required(tensor(&mut a, "nodes_modes")?, "nodes_modes")?;
        let weights_t = required(tensor(&mut a, "leaf_weights")?, "leaf_weights")?;
        let membership = tensor(&mut a, "membership_values")?;
        let features = sizes(&mut a, "nodes_featureids")?;
        let true_ids = sizes(&mut a, "nodes_truenodeids")?;
        let false_ids = sizes(&mut a, "nodes_falsenodeids")?;
        let true_leafs = flags(sizes(&mut a, "nodes_trueleafs")?);
        let false_leafs = flags(sizes(&mut a, "nodes_falseleafs")?);
        let targets = sizes(&mut a, "leaf_targetids")?;
        let roots = sizes(&mut a, "tree_roots")?;
        let missing_true = match a.ints("nodes_missing_value_tracks_true").map_err(attr)? {
            Some(v) => v.iter().map(|&f| f != 0).collect(),
            None => vec![false; features.len()],
        };
        a.remove("nodes_hitrates");
        let n_targets = a.size("n_targets", 0).map_err(attr)?;
        let aggregate = match a.int("aggregate_function", 1).map_err(attr)? {
            0 => ReduceKind::Mean,
            1 => ReduceKind::Sum,
            2 => ReduceKind::Min,
            3 => ReduceKind::Max,
            other => {
                return Err(attr(AttrError::OutOfRange {
                    name: "aggregate_function".into(),
                    value: other.to_string(),
                    why: "must be 0 (average), 1 (sum), 2 (min) or 3 (max)",
                }))
            }
        };
        // ONNX's reference leaves the scores untransformed whatever post_transform says;
        // onnxruntime applies it. Only NONE means the same to both.
        match a.int("post_transform", 0).map_err(attr)? {
            0 => {}
            other => {
                return Err(IrError::NotSupported(format!(
                    "post_transform {other} is not supported (only 0, none)"
                )))
            }
        }
        a.finish("TreeEnsemble").map_err(attr)?;
        if splits.dtype() != dtype || weights_t.dtype() != dtype {
            return Err(err(format!(
                "nodes_splits ({}) and leaf_weights ({}) must have X's type {}",
                splits.dtype().name(),
                weights_t.dtype().name(),
                dtype.name()
            )));
        }
        let n = features.len();
        let modes = modes_t
            .to_i64s()
            .iter()
            .map(|&m| {
                usize::try_from(m).ok().and_then(|m| Mode::ALL.get(m).copied()).ok_or_else(|| {
                    attr(AttrError::OutOfRange {
                        name: "nodes_modes".into(),
                        value: m.to_string(),
                        why: "must hold modes 0 (<=) to 6 (member)",
                    })
                })
            })
            .collect::<Result<Vec<Mode>>>()?;
        let lengths = [
            ("nodes_splits", splits.len()),
            ("nodes_modes", modes.len()),
            ("nodes_truenodeids", true_ids.len()),
            ("nodes_falsenodeids", false_ids.len()),
            ("nodes_trueleafs", true_leafs.len()),
            ("nodes_falseleafs", false_leafs.len()),
            ("nodes_missing_value_tracks_true", missing_true.len()),
        ];
        if let Some((name, len)) = lengths.iter().find(|(_, len)| *len != n) {
            return Err(err(format!("{name} has {len} entries, nodes_featureids {n}")));
        }
        let weights = weights_t.to_f64s();
        if targets.len() != weights.len() {
            return Err(err(format!(
                "leaf_targetids has {} entries, leaf_weights {}",
                targets.len(),
                weights.len()
            )));
        }
        if let Some(t) = targets.iter().find(|&&t| t >= n_targets) {
            return Err(err(format!("leaf target {t} is not below n_targets {n_targets}")));
        }
        let sets = member_sets(&modes, membership)?;
        let ensemble = Ensemble {
            splits,
            features,
            modes,
            true_ids,
            false_ids,
            true_leafs,
            false_leafs,
            missing_true,
            sets,
            targets,
            weights,
            roots,
            n_targets,
            aggregate,
        };
        ensemble.check_ids()?;
        Ok(ensemble)
    }

    /// Every child id names a node or a leaf that exists, and every root a node.
    fn check_ids(&self) -> Result<()> {
        let (nodes, leaves) = (self.features.len(), self.weights.len());
        for i in 0..nodes {
            for (id, leaf) in
                [(self.true_ids[i], self.true_leafs[i]), (self.false_ids[i], self.false_leafs[i])]
            {
                let (limit, what) = if leaf { (leaves, "leaf") } else { (nodes, "node") };
                if id >= limit {
                    return Err(err(format!("node {i} branches to {what} {id}, of {limit}")));
                }
            }
        }
        if self.roots.is_empty() {
            return Err(err("tree_roots is empty"));
        }
        if let Some(r) = self.roots.iter().find(|&&r| r >= nodes) {
            return Err(err(format!("tree root {r} is not one of the {nodes} nodes")));
        }
        Ok(())
    }

    /// The node a branch of node `at` goes to (`None`: a leaf).
    fn child(&self, at: usize, taken: bool) -> Option<usize> {
        let (id, leaf) = if taken {
            (self.true_ids[at], self.true_leafs[at])
        } else {
            (self.false_ids[at], self.false_leafs[at])
        };
        (!leaf).then_some(id)
    }

    /// Refuses ids that form a cycle: a white/grey/black depth-first search over the nodes
    /// reachable from the roots, O(nodes) whatever the trees' shape.
    fn check_acyclic(&self) -> Result<()> {
        #[derive(Clone, Copy, PartialEq)]
        enum Colour {
            White,
            Grey,
            Black,
        }
        let mut colour = vec![Colour::White; self.features.len()];
        for &root in &self.roots {
            if colour[root] != Colour::White {
                continue;
            }
            // (node, branches of it visited so far)
            let mut stack = vec![(root, 0u8)];
            colour[root] = Colour::Grey;
            while let Some(top) = stack.last_mut() {
                let (at, visited) = *top;
                if visited == 2 {
                    colour[at] = Colour::Black;
                    stack.pop();
                    continue;
                }
                top.1 += 1;
                let Some(next) = self.child(at, visited == 1) else { continue };
                match colour[next] {
                    Colour::Grey => {
                        return Err(err(format!(
                            "the tree of root {root} has a cycle through node {next}"
                        )))
                    }
                    Colour::Black => {}
                    Colour::White => {
                        colour[next] = Colour::Grey;
                        stack.push((next, 0));
                    }
                }
            }
        }
        Ok(())
    }

    /// Every root-to-leaf path of every tree, tree by tree, false branch first. The ids must
    /// form no cycle (`check_acyclic`); the paths and their literals together are capped.
    fn paths(&self) -> Result<Vec<Path>> {
        self.check_acyclic()?;
        let mut paths = Vec::new();
        let mut literals = 0usize;
        for &root in &self.roots {
            // A tree that is one leaf: a root whose branches are the same leaf.
            if self.true_leafs[root]
                && self.false_leafs[root]
                && self.true_ids[root] == self.false_ids[root]
            {
                paths.push(Path { literals: Vec::new(), leaf: self.true_ids[root] });
                continue;
            }
            // (node, branches of it taken so far): the frames below the top are the path.
            let mut stack = vec![(root, 0u8)];
            while let Some(top) = stack.last_mut() {
                let (at, taken) = *top;
                if taken == 2 {
                    stack.pop();
                    continue;
                }
                top.1 += 1;
                let way = taken == 1;
                match self.child(at, way) {
                    Some(next) => stack.push((next, 0)),
                    None => {
                        let leaf = if way { self.true_ids[at] } else { self.false_ids[at] };
                        literals += stack.len();
                        if paths.len() == MAX_PATHS || literals > MAX_TABLE {
                            return Err(IrError::NotSupported(format!(
                                "the ensemble has more than {MAX_PATHS} root-to-leaf paths or \
                                 {MAX_TABLE} conditions on them"
                            )));
                        }
                        let literals = stack.iter().map(|&(n, t)| (n, t == 2)).collect();
                        paths.push(Path { literals, leaf });
                    }
                }
            }
        }
        Ok(paths)
    }
}

/// The sets of the Member nodes, in node order: `membership_values` holds them one after
/// another, each ended by a NaN. That is the order the spec states; ONNX's reference evaluator
/// instead hands them out in the order its depth-first build of each tree meets the member
/// nodes, which differs when a tree's member nodes are not numbered in that order (such an
/// ensemble gives other results there; exporters number nodes depth-first, where both agree).
fn member_sets(modes: &[Mode], membership: Option<Tensor>) -> Result<Vec<Vec<f64>>> {
    let members = modes.iter().filter(|&&m| m == Mode::Member).count();
    let values = membership.map(|t| t.to_f64s()).unwrap_or_default();
    let mut sets: Vec<Vec<f64>> = Vec::new();
    let mut current = Vec::new();
    for v in values {
        if v.is_nan() {
            sets.push(std::mem::take(&mut current));
        } else {
            current.push(v);
        }
    }
    if sets.len() != members || !current.is_empty() {
        return Err(err(format!(
            "membership_values must hold {members} NaN-ended sets, one per member node; it holds {}",
            sets.len()
        )));
    }
    Ok(sets)
}

/// TreeEnsemble `(X [N, F]) -> Y [N, n_targets]`. Every node's condition is computed for every
/// sample at once (X's features gathered per node, compared by each mode present); a sample
/// reaches a leaf when all the conditions on its path go its way, counted by a MatMul of the
/// 0/1 conditions with each path's literals; the leaves reached are aggregated per target.
fn tree_ensemble(im: &mut GraphImporter, node: &NodeProto, a: Attrs) -> Result<()> {
    let x = operand0(im, node)?;
    let tx = im.ty(x).clone();
    if tx.rank() != 2 || !matches!(tx.dtype, DType::F32 | DType::F64 | DType::F16) {
        return Err(err(format!("X {tx} must be a float matrix [N, features]")));
    }
    let e = Ensemble::read(a, tx.dtype)?;
    if let (Some(f), Some(limit)) = (e.features.iter().max(), tx.shape.dims()[1].fixed()) {
        if *f >= limit {
            return Err(err(format!("feature {f} is not one of X {tx}'s {limit}")));
        }
    }
    let holds = conditions(im, node, x, &e)?;
    let paths = e.paths()?;
    let reached = reached_paths(im, node, holds, &e, &paths)?;
    let y = aggregate(im, node, reached, &e, &paths, tx.dtype)?;
    im.bind(node, &[y])
}

/// The condition of every node for every sample: bool `[N, nodes]`.
fn conditions(
    im: &mut GraphImporter,
    node: &NodeProto,
    x: ValueId,
    e: &Ensemble,
) -> Result<ValueId> {
    let n = e.features.len();
    let dtype = im.ty(x).dtype;
    let features: Vec<i64> = e.features.iter().map(|&f| f as i64).collect();
    let features = im.constant(node, "features", Tensor::vector(&features))?;
    let xf = im.add1(node, "x_features", Op::Gather { axis: 1 }, &[x, features])?;
    let splits = im.constant(node, "splits", e.splits.reshape(&[n])?)?;
    let mask = |mode: Mode| -> Tensor {
        let m: Vec<bool> = e.modes.iter().map(|&m| m == mode).collect();
        Tensor::vector(&m)
    };
    let mut holds: Option<ValueId> = None;
    for mode in Mode::ALL {
        if !e.modes.contains(&mode) {
            continue;
        }
        let part = |s: &str| format!("mode{}_{s}", mode as u8);
        let cmp = match mode.compare() {
            Some(op) => im.add1(node, &part("cmp"), Op::Binary(op), &[xf, splits])?,
            None if mode == Mode::Neq => {
                let eq = im.add1(node, &part("eq"), Op::Binary(BinaryOp::Equal), &[xf, splits])?;
                im.add1(node, &part("cmp"), Op::Unary(UnaryOp::Not), &[eq])?
            }
            None => membership(im, node, xf, e, dtype)?,
        };
        let m = im.constant(node, &part("mask"), mask(mode))?;
        let this = im.add1(node, &part("holds"), Op::Binary(BinaryOp::And), &[cmp, m])?;
        holds = Some(match holds {
            None => this,
            Some(h) => im.add1(node, &part("any"), Op::Binary(BinaryOp::Or), &[h, this])?,
        });
    }
    let holds = holds.ok_or_else(|| err("the ensemble has no nodes"))?;
    if !e.missing_true.iter().any(|&m| m) {
        return Ok(holds);
    }
    // A NaN feature goes the true way at the nodes that say so.
    let nan = im.add1(node, "nan", Op::Unary(UnaryOp::IsNaN), &[xf])?;
    let tracks = im.constant(node, "missing_tracks_true", Tensor::vector(&e.missing_true))?;
    let nan_true = im.add1(node, "nan_true", Op::Binary(BinaryOp::And), &[nan, tracks])?;
    im.add1(node, "conditions", Op::Binary(BinaryOp::Or), &[holds, nan_true])
}

/// Whether each sample's feature is in each node's set (false at the other nodes): bool
/// `[N, nodes]`. Only the member nodes' features are compared, `[N, members, 1] ==
/// [members, widest]` (sets padded with NaN, equal to nothing) reduced over the set; a zero
/// column appended for the other nodes, a Gather puts each member's column at its node.
fn membership(
    im: &mut GraphImporter,
    node: &NodeProto,
    xf: ValueId,
    e: &Ensemble,
    dtype: DType,
) -> Result<ValueId> {
    let member_nodes: Vec<i64> =
        (0..e.modes.len()).filter(|&i| e.modes[i] == Mode::Member).map(|i| i as i64).collect();
    let members = member_nodes.len();
    let widest = e.sets.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let mut table = vec![f64::NAN; table_size(members, widest, "the member sets")?];
    for (row, set) in e.sets.iter().enumerate() {
        table[row * widest..row * widest + set.len()].copy_from_slice(set);
    }
    let table = Tensor::from_f64s(dtype, &[members, widest], &table)?;
    let table = im.constant(node, "member_sets", table)?;
    let member_nodes_c = im.constant(node, "member_nodes", Tensor::vector(&member_nodes))?;
    let xm = im.add1(node, "member_features", Op::Gather { axis: 1 }, &[xf, member_nodes_c])?;
    let axis = im.constant(node, "set_axis", Tensor::vector(&[2i64]))?;
    let xs = im.add1(node, "member_x", Op::Unsqueeze, &[xm, axis])?;
    let eq = im.add1(node, "member_eq", Op::Binary(BinaryOp::Equal), &[xs, table])?;
    let eq = im.add1(node, "member_eq_f", Op::Cast { to: DType::F32, saturate: true }, &[eq])?;
    let max =
        Op::Reduce(Reduce { kind: ReduceKind::Max, keepdims: false, noop_with_empty_axes: false });
    let any = im.add1(node, "member_any", max, &[eq, axis])?;
    // [N, members] -> [N, members + 1], the last column 0 (the nodes of other modes).
    let pads = im.constant(node, "member_pads", Tensor::vector(&[0i64, 0, 0, 1]))?;
    let pad = Op::Pad { mode: crate::op::PadMode::Constant };
    let padded = im.add1(node, "member_padded", pad, &[any, pads])?;
    let mut column = vec![members as i64; e.modes.len()];
    for (k, &at) in member_nodes.iter().enumerate() {
        column[at as usize] = k as i64;
    }
    let column = im.constant(node, "member_columns", Tensor::vector(&column))?;
    let per_node = im.add1(node, "member_per_node", Op::Gather { axis: 1 }, &[padded, column])?;
    let zero = im.constant(node, "member_zero", Tensor::scalar(0f32))?;
    im.add1(node, "member", Op::Binary(BinaryOp::Greater), &[per_node, zero])
}

/// Which path each sample takes: bool `[N, paths]`. With c the 0/1 conditions of the nodes on
/// some path `[N, used]`, a path's literals in a matrix A (+1 where it needs a node true, -1
/// where false) and b its count of false literals, `c @ A + b` counts the literals that hold:
/// all of them on the path taken (the counts are small integers, exact in f32).
fn reached_paths(
    im: &mut GraphImporter,
    node: &NodeProto,
    holds: ValueId,
    e: &Ensemble,
    paths: &[Path],
) -> Result<ValueId> {
    // The rows of A: only nodes some path reaches (unreachable ones cost nothing).
    let mut row_of: Vec<Option<usize>> = vec![None; e.features.len()];
    let mut used: Vec<i64> = Vec::new();
    for &(at, _) in paths.iter().flat_map(|p| &p.literals) {
        if row_of[at].is_none() {
            row_of[at] = Some(used.len());
            used.push(at as i64);
        }
    }
    if used.is_empty() {
        // Every tree is one leaf: one row of no literals keeps the MatMul's shapes non-empty.
        row_of[0] = Some(0);
        used.push(0);
    }
    let (n, p) = (used.len(), paths.len());
    let mut literals = vec![0f32; table_size(n, p, "the paths' conditions")?];
    let mut need = vec![0f32; p];
    let mut falses = vec![0f32; p];
    for (j, path) in paths.iter().enumerate() {
        for &(at, taken) in &path.literals {
            let row = row_of[at].expect("every node on a path has a row");
            literals[row * p + j] = if taken { 1.0 } else { -1.0 };
            falses[j] += f32::from(u8::from(!taken));
        }
        need[j] = path.literals.len() as f32;
    }
    let every_node =
        used.len() == e.features.len() && used.iter().enumerate().all(|(i, &at)| at == i as i64);
    let holds = if every_node {
        holds
    } else {
        let used = im.constant(node, "path_nodes", Tensor::vector(&used))?;
        im.add1(node, "path_conditions", Op::Gather { axis: 1 }, &[holds, used])?
    };
    let cast = Op::Cast { to: DType::F32, saturate: true };
    let c = im.add1(node, "conditions_f", cast, &[holds])?;
    let a = im.constant(node, "path_literals", Tensor::from_vec(&[n, p], literals)?)?;
    let b = im.constant(node, "path_falses", Tensor::vector(&falses))?;
    let need = im.constant(node, "path_lengths", Tensor::vector(&need))?;
    let count = im.add1(node, "path_literals_held", Op::MatMul, &[c, a])?;
    let count = im.add1(node, "path_held", Op::Binary(BinaryOp::Add), &[count, b])?;
    im.add1(node, "reached", Op::Binary(BinaryOp::Equal), &[count, need])
}

/// `Y [N, n_targets]`: per target, the sum (average: divided by the tree count), min or max of
/// the weights of the leaves reached that give it; ONNX's reference starts a min at the type's
/// largest value and a max at its lowest, so a target no leaf reached gives those.
fn aggregate(
    im: &mut GraphImporter,
    node: &NodeProto,
    reached: ValueId,
    e: &Ensemble,
    paths: &[Path],
    dtype: DType,
) -> Result<ValueId> {
    let (p, t) = (paths.len(), e.n_targets);
    let trees = e.roots.len() as f64;
    let mut gives = vec![false; table_size(p, t, "the paths' targets")?];
    let mut weights = vec![0f64; p];
    for (j, &Path { leaf, .. }) in paths.iter().enumerate() {
        gives[j * t + e.targets[leaf]] = true;
        weights[j] = match e.aggregate {
            ReduceKind::Mean => e.weights[leaf] / trees,
            _ => e.weights[leaf],
        };
    }
    let (largest, lowest) = match dtype {
        DType::F64 => (f64::MAX, f64::MIN),
        DType::F16 => (65504.0, -65504.0),
        _ => (f64::from(f32::MAX), f64::from(f32::MIN)),
    };
    let (kind, neutral) = match e.aggregate {
        ReduceKind::Min => (ReduceKind::Min, largest),
        ReduceKind::Max => (ReduceKind::Max, lowest),
        _ => (ReduceKind::Sum, 0.0),
    };
    let axis = im.constant(node, "target_axis", Tensor::vector(&[2i64]))?;
    let reached = im.add1(node, "reached_3d", Op::Unsqueeze, &[reached, axis])?;
    let gives = im.constant(node, "path_targets", Tensor::from_vec(&[p, t], gives)?)?;
    let counts = im.add1(node, "contributes", Op::Binary(BinaryOp::And), &[reached, gives])?;
    let weights =
        im.constant(node, "path_weights", Tensor::from_f64s(dtype, &[p, 1], &weights)?)?;
    let neutral = im.constant(node, "neutral", Tensor::full(dtype, &[], neutral))?;
    let values = im.add1(node, "contributions", Op::Where, &[counts, weights, neutral])?;
    let over_paths = im.constant(node, "path_axis", Tensor::vector(&[1i64]))?;
    let reduce = Op::Reduce(Reduce { kind, keepdims: false, noop_with_empty_axes: false });
    im.add1(node, "", reduce, &[values, over_paths])
}
