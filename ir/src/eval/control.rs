//! Control flow: If.

use super::not_yet;
use crate::{Op, Tensor, TensorType};

pub(super) fn eval(op: &Op, _operands: &[Option<&Tensor>], _out: &[TensorType]) -> Result<Vec<Tensor>, String> {
    not_yet(op)
}
