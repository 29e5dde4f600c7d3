//! Resize.

use super::{Ctx, Infer, Operands};
use crate::op::Resize;

pub(super) fn infer(_r: &Resize, _ops: &Operands, _ctx: &Ctx) -> Infer {
    Err("Resize is not implemented yet".into())
}
