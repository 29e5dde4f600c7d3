//! The iteration space of a linalg op, read from its indexing maps and static operand shapes:
//! each loop's extent and whether it is parallel (indexes a result) or a reduction. Schedules
//! tile loops, so this is what they reason about.

use crate::target::edit::{self, RawOp};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loops {
    /// The extent of each loop.
    pub ranges: Vec<usize>,
    /// Whether each loop is parallel (it indexes the op's results).
    pub parallel: Vec<bool>,
}

impl Loops {
    pub fn reduction_extent(&self) -> usize {
        self.ranges.iter().zip(&self.parallel).filter(|(_, p)| !**p).map(|(r, _)| *r).product()
    }

    pub fn parallel_extent(&self) -> usize {
        self.ranges.iter().zip(&self.parallel).filter(|(_, p)| **p).map(|(r, _)| *r).product()
    }

    pub fn has_reduction(&self) -> bool {
        self.parallel.iter().any(|p| !p)
    }
}

/// Whether `op` is a linalg structured op (it has indexing maps).
pub fn is_structured(op: RawOp) -> bool {
    let n = op.name();
    n.starts_with("linalg.") && !matches!(n.as_str(), "linalg.yield" | "linalg.index" | "linalg.pack" | "linalg.unpack" | "linalg.softmax")
}

/// The loops of a structured op with static shapes; `None` for anything else.
pub fn loops(op: RawOp) -> Option<Loops> {
    if !is_structured(op) {
        return None;
    }
    // SAFETY: a live linalg structured op (checked by name above); reading its maps and types.
    unsafe {
        let maps = mlir_sys::mlirLinalgGetIndexingMapsAttribute(op.0);
        if maps.ptr.is_null() || !mlir_sys::mlirAttributeIsAArray(maps) {
            return None;
        }
        let n_maps = mlir_sys::mlirArrayAttrGetNumElements(maps) as usize;
        if n_maps == 0 || n_maps > op.num_operands() {
            return None;
        }
        let n_results = op.num_results().max(1);
        let mut ranges: Vec<Option<usize>> = Vec::new();
        let mut parallel: Vec<bool> = Vec::new();
        for i in 0..n_maps {
            let map = mlir_sys::mlirAffineMapAttrGetValue(mlir_sys::mlirArrayAttrGetElement(maps, i as isize));
            let n_dims = mlir_sys::mlirAffineMapGetNumDims(map) as usize;
            if ranges.is_empty() {
                ranges = vec![None; n_dims];
                parallel = vec![false; n_dims];
            }
            // Operands are ins then outs, one map each; scalars have no dims.
            let t = edit::value_type(op.operand(i));
            let dims = edit::static_dims(t).unwrap_or_default();
            let is_output = i >= n_maps - n_results;
            for r in 0..mlir_sys::mlirAffineMapGetNumResults(map) as usize {
                let e = mlir_sys::mlirAffineMapGetResult(map, r as isize);
                if mlir_sys::mlirAffineExprIsADim(e) {
                    let d = mlir_sys::mlirAffineDimExprGetPosition(e) as usize;
                    if d < ranges.len() && r < dims.len() {
                        ranges[d].get_or_insert(dims[r]);
                        if is_output {
                            parallel[d] = true;
                        }
                    }
                }
            }
        }
        let ranges: Option<Vec<usize>> = ranges.into_iter().collect();
        Some(Loops { ranges: ranges?, parallel })
    }
}
