//! Control flow: If.

use super::{not_yet, Ctx, Infer, Operands};
use crate::Op;

pub(super) fn infer(op: &Op, _ops: &Operands, _ctx: &Ctx) -> Infer {
    not_yet(op)
}
