//! Resize.

use kiln_ir::NodeId;

use super::Emitter;
use crate::Result;

pub(super) fn emit(em: &mut Emitter, id: NodeId) -> Result<()> {
    Err(em.unsupported(id, "is not supported by the native code generator yet"))
}
