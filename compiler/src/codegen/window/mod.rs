//! Windows: convolutions (`conv`: Conv, ConvTranspose) and pooling (`pool`: MaxPool,
//! AveragePool, LpPool and their global forms).

mod conv;
mod pool;

use kiln_ir::{NodeId, Op};

use super::Emitter;
use crate::Result;

pub(super) fn emit(em: &mut Emitter, id: NodeId) -> Result<()> {
    match &em.graph.node(id).op {
        Op::Conv(c) => conv::conv(em, id, c),
        Op::ConvTranspose(c) => conv::conv_transpose(em, id, c),
        Op::Pool(p) => pool::emit_pool(em, id, p),
        Op::GlobalPool(k) => pool::emit_global_pool(em, id, *k),
        _ => Err(em.not_supported(id)),
    }
}
