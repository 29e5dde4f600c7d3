//! The iteration space of a linalg op: each loop's extent and whether it is parallel (indexes a
//! result) or a reduction, from the typed linalg analysis. GPU schedules tile loops, so this is
//! what they reason about.

use crate::backend::edit::RawOp;
use crate::backend::linalg;

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
    n.starts_with("linalg.")
        && !matches!(
            n.as_str(),
            "linalg.yield" | "linalg.index" | "linalg.pack" | "linalg.unpack" | "linalg.softmax"
        )
}

/// The loops of a structured op with static shapes; `None` for anything else. Read through the
/// analysis the CPU schedule uses (`backend::linalg`), so both targets see one reading of an op.
pub fn loops(op: RawOp) -> Option<Loops> {
    if !is_structured(op) {
        return None;
    }
    let l = linalg::read_op(op);
    if l.maps.is_empty() {
        return None;
    }
    Some(Loops { ranges: l.ranges()?, parallel: l.parallel })
}
