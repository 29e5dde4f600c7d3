//! Codegen: each kernel becomes one MLIR `func.func` on tensors (linalg, arith, math, tensor),
//! op families in their own files, named as kiln-ir's `infer/` and `eval/` name them
//! (`Op::family`); each family's `emit` takes a node of it.
//!
//! The function takes one memref per kernel input and output (static shapes), the run's status
//! word where the kernel checks indices (`status.rs`), then the range of workgroups to run:
//! `(%in..., %out..., [%status: memref<4xi32>,] %wg_begin: index, %wg_end: index)`. Inputs enter as
//! `bufferization.to_tensor`; the op producing each output writes into the output buffer (its
//! destination is the output memref as a tensor), and `materialize_in_destination` ends it, so
//! bufferization works in place. The target pipeline tiles the result into workgroups.

mod contraction;
pub(crate) mod elementwise;
mod generate;
mod grid;
mod indexing;
pub mod mlir;
mod movement;
mod normalize;
mod reduce;
mod resize;
pub mod scalar;
pub mod status;
mod storage;
mod window;

use std::collections::HashMap;

use melior::dialect::func;
use melior::ir::attribute::{StringAttribute, TypeAttribute};
use melior::ir::r#type::FunctionType;
use melior::ir::{Block, BlockLike, Location, Module, Region, RegionLike, Type, Value};
use melior::Context;

use kiln_ir::op::OpFamily;
use kiln_ir::{DType, Graph, NodeId, TensorType, ValueId};

use crate::fuse::{self, Kernel};
use crate::{CompileError, Result};
use mlir::{op, parse_attr, push};

/// Emits one kernel's ops into its function body.
pub struct Emitter<'c, 'a> {
    pub ctx: &'c Context,
    pub loc: Location<'c>,
    pub block: &'a Block<'c>,
    pub graph: &'a Graph,
    kernel: &'a Kernel,
    /// Tensor values by kiln value.
    values: HashMap<ValueId, Value<'c, 'a>>,
    /// The output memrefs by kiln value.
    outputs: HashMap<ValueId, Value<'c, 'a>>,
    /// The run's status word, when the kernel takes it (`status::takes_status`).
    pub status: Option<status::Status<'c, 'a>>,
}

impl<'c, 'a> Emitter<'c, 'a> {
    pub fn ty(&self, v: ValueId) -> &'a TensorType {
        self.graph.value_type(v)
    }

    pub fn dims(&self, v: ValueId) -> Vec<usize> {
        self.ty(v).shape.as_fixed().expect("codegen sees static shapes")
    }

    /// `tensor<...>` type of a kiln type.
    pub fn tensor_type(&self, dims: &[usize], d: DType) -> Result<Type<'c>> {
        Ok(mlir::tensor_type(self.ctx, dims, d))
    }

    /// The tensor for operand `v` (a small constant is materialised here on first use).
    pub fn value(&mut self, v: ValueId) -> Result<Value<'c, 'a>> {
        if let Some(x) = self.values.get(&v) {
            return Ok(*x);
        }
        if let Some(t) = self.graph.constant_value(v) {
            let ty = self.tensor_type(t.dims(), t.dtype())?;
            let c = push(
                self.block,
                op(
                    self.ctx,
                    self.loc,
                    "arith.constant",
                    &[],
                    &[ty],
                    &[("value", parse_attr(self.ctx, &mlir::dense_literal(t))?)],
                )?,
            );
            self.values.insert(v, c);
            return Ok(c);
        }
        Err(CompileError::Internal(format!(
            "kernel {}: value %{} is not available",
            self.kernel.name,
            self.graph.value_name(v)
        )))
    }

    /// The destination tensor for result `v`: the output buffer when `v` leaves the kernel (so the
    /// op writes it in place), else a fresh `tensor.empty`.
    pub fn dest(&mut self, v: ValueId) -> Result<Value<'c, 'a>> {
        let dims = self.dims(v);
        let dtype = self.ty(v).dtype;
        self.dest_of(v, &dims, dtype)
    }

    fn dest_of(&mut self, v: ValueId, dims: &[usize], dtype: DType) -> Result<Value<'c, 'a>> {
        let ty = self.tensor_type(dims, dtype)?;
        if let Some(&m) = self.outputs.get(&v) {
            let unit = melior::ir::Attribute::unit(self.ctx);
            return Ok(push(
                self.block,
                op(
                    self.ctx,
                    self.loc,
                    "bufferization.to_tensor",
                    &[m],
                    &[ty],
                    &[("restrict", unit), ("writable", unit)],
                )?,
            ));
        }
        self.empty(dims, dtype)
    }

    /// `tensor.empty` of a shape.
    pub fn empty(&self, dims: &[usize], dtype: DType) -> Result<Value<'c, 'a>> {
        let ty = self.tensor_type(dims, dtype)?;
        Ok(push(self.block, op(self.ctx, self.loc, "tensor.empty", &[], &[ty], &[])?))
    }

    /// A scalar constant (storage type of `dtype`) in the function body.
    pub fn scalar_constant(&self, value: f64, dtype: DType) -> Result<Value<'c, 'a>> {
        if !dtype.is_float() {
            return self.int_constant(value as i128, dtype);
        }
        let ty = mlir::dtype_type(self.ctx, dtype);
        let a = melior::ir::attribute::FloatAttribute::new(self.ctx, ty, value).into();
        Ok(push(self.block, op(self.ctx, self.loc, "arith.constant", &[], &[ty], &[("value", a)])?))
    }

    /// An integer constant (storage type of `dtype`), exact: its bits are the low bits of the
    /// value at the type's width.
    pub fn int_constant(&self, value: i128, dtype: DType) -> Result<Value<'c, 'a>> {
        let ty = mlir::dtype_type(self.ctx, dtype);
        let bits = dtype.size() as u32 * 8;
        let v =
            if bits >= 64 { value as i64 } else { ((value as u64) & ((1u64 << bits) - 1)) as i64 };
        let a = melior::ir::attribute::IntegerAttribute::new(ty, v).into();
        Ok(push(self.block, op(self.ctx, self.loc, "arith.constant", &[], &[ty], &[("value", a)])?))
    }

    /// Records the tensor computing `v`.
    pub fn set(&mut self, v: ValueId, t: Value<'c, 'a>) {
        self.values.insert(v, t);
    }

    /// Refuses a compile-time table (a Pad's or Resize's index map, a pooling's window counts)
    /// of more than [`TABLE_LIMIT`] entries before it is built: such tables are made in the
    /// compiler's memory and stored in the artifact, and a hostile size aborted the compile.
    pub fn check_table(&self, id: NodeId, what: &str, entries: Option<usize>) -> Result<()> {
        match entries {
            Some(n) if n <= TABLE_LIMIT => Ok(()),
            n => Err(self.unsupported(
                id,
                &format!(
                    "needs {what} of {} entries, more than the {TABLE_LIMIT} that kiln's compile-time tables take",
                    n.map_or("over 2^64".to_string(), |n| n.to_string())
                ),
            )),
        }
    }

    /// The error for a node whose op the native code generator does not emit.
    pub fn not_supported(&self, id: NodeId) -> CompileError {
        self.unsupported(id, "is not supported by the native code generator yet")
    }

    /// An error naming this kernel and a node.
    pub fn unsupported(&self, id: NodeId, what: &str) -> CompileError {
        let n = self.graph.node(id);
        CompileError::Unsupported {
            kernel: self.kernel.name.clone(),
            label: self.kernel.label.clone(),
            node: n.name.clone(),
            op: n.op.name(),
            what: what.to_string(),
        }
    }
}

/// The most entries a compile-time table of one op may have (64 Mi, 512 MiB of i64 or f64: an
/// average pooling's counts over an 8192 x 8192 image on the linalg path): past any real
/// model's axis or window grid.
pub const TABLE_LIMIT: usize = 1 << 26;

/// The MLIR type of a kernel argument for value `v`.
pub(crate) fn memref_type<'c>(ctx: &'c Context, graph: &Graph, v: ValueId) -> Result<Type<'c>> {
    let t = graph.value_type(v);
    let dims = t.shape.as_fixed().ok_or_else(|| {
        CompileError::Internal(format!("value %{} has the dynamic type {t}", graph.value_name(v)))
    })?;
    Ok(mlir::memref_type(ctx, &dims, t.dtype))
}

/// Builds the module holding `kernel`'s function, named `<kernel.name>_body`. `function` is the
/// index of its (first) function in the artifact, which a failed index check records.
pub fn build_kernel<'c>(
    ctx: &'c Context,
    graph: &Graph,
    kernel: &Kernel,
    function: u32,
) -> Result<Module<'c>> {
    let loc = Location::unknown(ctx);
    let module = Module::new(loc);
    let mut arg_types: Vec<Type<'c>> = Vec::new();
    for &v in kernel.inputs.iter().chain(&kernel.outputs) {
        arg_types.push(memref_type(ctx, graph, v)?);
    }
    let takes_status = status::takes_status(graph, kernel);
    if takes_status {
        arg_types.push(status::word_type(ctx));
    }
    let index = Type::index(ctx);
    arg_types.push(index);
    arg_types.push(index);
    let block = Block::new(&arg_types.iter().map(|t| (*t, loc)).collect::<Vec<_>>());
    {
        let mut em = Emitter {
            ctx,
            loc,
            block: &block,
            graph,
            kernel,
            values: HashMap::new(),
            outputs: HashMap::new(),
            status: None,
        };
        let n_buffers = kernel.inputs.len() + kernel.outputs.len();
        if takes_status {
            let word = block.argument(n_buffers).expect("declared").into();
            em.status = Some(status::Status { word, kernel: function });
        }
        let unit = melior::ir::Attribute::unit(ctx);
        for (i, &v) in kernel.inputs.iter().enumerate() {
            let ty = em.tensor_type(&em.dims(v), em.ty(v).dtype)?;
            let arg: Value = block.argument(i).expect("declared").into();
            let t = push(
                &block,
                op(ctx, loc, "bufferization.to_tensor", &[arg], &[ty], &[("restrict", unit)])?,
            );
            em.values.insert(v, t);
        }
        let n_in = kernel.inputs.len();
        for (j, &v) in kernel.outputs.iter().enumerate() {
            em.outputs.insert(v, block.argument(n_in + j).expect("declared").into());
        }
        emit_nodes(&mut em, &kernel.nodes)?;
        for (j, &v) in kernel.outputs.iter().enumerate() {
            // A copy kernel's output is its (only) input.
            let t =
                if kernel.nodes.is_empty() { em.value(kernel.inputs[0])? } else { em.value(v)? };
            let dest: Value = block.argument(n_in + j).expect("declared").into();
            block.append_operation(op(
                ctx,
                loc,
                "bufferization.materialize_in_destination",
                &[t, dest],
                &[],
                &[("restrict", unit), ("writable", unit)],
            )?);
        }
        block.append_operation(func::r#return(&[], loc));
    }
    let region = Region::new();
    region.append_block(block);
    let f = func::func(
        ctx,
        StringAttribute::new(ctx, &format!("{}_body", kernel.name)),
        TypeAttribute::new(FunctionType::new(ctx, &arg_types, &[]).into()),
        region,
        &[],
        loc,
    );
    module.body().append_operation(f);
    Ok(module)
}

/// Emits the nodes in order, each maximal run of elementwise nodes as one loop nest.
fn emit_nodes(em: &mut Emitter, nodes: &[NodeId]) -> Result<()> {
    let mut i = 0;
    while i < nodes.len() {
        let node = em.graph.node(nodes[i]);
        if fuse::is_elementwise(&node.op) {
            let mut j = i + 1;
            while j < nodes.len() && fuse::is_elementwise(&em.graph.node(nodes[j]).op) {
                j += 1;
            }
            elementwise::emit_chain(em, &nodes[i..j])?;
            i = j;
            continue;
        }
        emit_node(em, nodes[i])?;
        i += 1;
    }
    Ok(())
}

fn emit_node(em: &mut Emitter, id: NodeId) -> Result<()> {
    match em.graph.node(id).op.family() {
        OpFamily::Contraction => contraction::emit(em, id),
        OpFamily::Window => window::emit(em, id),
        OpFamily::Normalize => normalize::emit(em, id),
        OpFamily::Reduce => reduce::emit(em, id),
        OpFamily::Movement => movement::emit(em, id),
        OpFamily::Indexing => indexing::emit(em, id),
        OpFamily::Generate => generate::emit(em, id),
        OpFamily::Resize => match em.graph.node(id).op {
            kiln_ir::Op::GridSample { .. } => grid::emit(em, id),
            // AffineGrid is decomposed; resize::emit refuses it, naming the node.
            _ => resize::emit(em, id),
        },
        // Elementwise nodes are emitted as chains (`emit_nodes`).
        OpFamily::Source
        | OpFamily::Elementwise
        | OpFamily::Sequence
        | OpFamily::Loss
        | OpFamily::Signal
        | OpFamily::Control
        | OpFamily::Quantize
        | OpFamily::Collection
        | OpFamily::Strings => Err(em.not_supported(id)),
    }
}
