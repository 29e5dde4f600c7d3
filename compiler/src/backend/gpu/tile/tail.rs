//! A tile kernel's epilogue: the elementwise nodes fused after its root (bias, activation,
//! residual add, scale, cast), evaluated on each output element as the root's value is stored,
//! with the same scalar code codegen's loops use (`codegen::elementwise::eval_chain`).
//!
//! The tail's other operands are read where they lie: a kernel buffer or, for the small
//! constants fusion inlines, a constant buffer of the launch. Each is read through strides over
//! the output's dimensions (0 where it broadcasts).

use std::collections::HashMap;

use kiln_ir::{DType, Graph, NodeId, ValueId};

use super::builder::{KernelBuilder, V};
use super::Args;
use crate::codegen::elementwise::eval_chain;
use crate::codegen::scalar::Scalar;
use crate::fuse::{self, Kernel};
use melior::ir::ValueLike;

/// Where a tail operand's elements are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The fused kernel's i-th buffer.
    Buffer(usize),
    /// The launch's i-th constant (a small constant fusion inlined).
    Constant(usize),
}

#[derive(Clone, Debug)]
pub struct Operand {
    pub value: ValueId,
    pub dtype: DType,
    pub source: Source,
    /// Element stride per output dimension (0: broadcast along it).
    pub strides: Vec<usize>,
}

/// The root of a one-output kernel and what follows it.
#[derive(Clone, Debug)]
pub struct Tail {
    pub root: NodeId,
    /// The elementwise nodes after the root, in order.
    pub nodes: Vec<NodeId>,
    /// The value the kernel writes (the last node's, or the root's).
    pub out: ValueId,
    pub out_dtype: DType,
    pub root_dtype: DType,
    /// The output's dimensions, which are the root result's.
    pub dims: Vec<usize>,
    pub operands: Vec<Operand>,
}

/// Where the kernel reads `v`: its buffer, or (a small constant fusion inlined) the next of the
/// launch's constants, counted by `constants`.
pub fn source_of(
    graph: &Graph,
    kernel: &Kernel,
    v: ValueId,
    constants: &mut usize,
) -> Option<Source> {
    match kernel.inputs.iter().position(|&i| i == v) {
        Some(i) => Some(Source::Buffer(i)),
        None if graph.constant_value(v).is_some() => {
            *constants += 1;
            Some(Source::Constant(*constants - 1))
        }
        None => None,
    }
}

/// Row-major strides of `dims`.
pub fn contiguous_strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// Strides reading `dims` (right-aligned, numpy broadcasting) over output `out` dimensions.
pub fn broadcast_strides(dims: &[usize], out: &[usize]) -> Option<Vec<usize>> {
    if dims.len() > out.len() {
        return None;
    }
    let own = contiguous_strides(dims);
    let offset = out.len() - dims.len();
    let mut s = vec![0; out.len()];
    for (i, &d) in dims.iter().enumerate() {
        if d == out[offset + i] {
            s[offset + i] = if d == 1 { 0 } else { own[i] };
        } else if d != 1 {
            return None;
        }
    }
    Some(s)
}

impl Tail {
    /// The kernel as a root and an elementwise tail writing one output of the root's shape
    /// (the tail may not broadcast the root to a larger result), or `None`.
    pub fn of(graph: &Graph, kernel: &Kernel) -> Option<Tail> {
        let (&root, rest) = kernel.nodes.split_first()?;
        if kernel.outputs.len() != 1 || graph.node(root).outputs.len() != 1 {
            return None;
        }
        let out = ValueId::from(*kernel.nodes.last()?);
        if kernel.outputs[0] != out
            || rest.iter().any(|&n| !fuse::is_elementwise(&graph.node(n).op))
        {
            return None;
        }
        let root_v = ValueId::from(root);
        let dims = graph.value_type(root_v).shape.as_fixed()?;
        if graph.value_type(out).shape.as_fixed()? != dims || dims.iter().product::<usize>() == 0 {
            return None;
        }
        let mut operands: Vec<Operand> = Vec::new();
        let mut constants = 0;
        for &id in rest {
            for v in graph.operands(id).into_iter().flatten() {
                if kernel.nodes.contains(&v.node) || operands.iter().any(|o| o.value == v) {
                    continue;
                }
                let t = graph.value_type(v);
                let strides = broadcast_strides(&t.shape.as_fixed()?, &dims)?;
                let source = source_of(graph, kernel, v, &mut constants)?;
                operands.push(Operand { value: v, dtype: t.dtype, source, strides });
            }
        }
        Some(Tail {
            root,
            nodes: rest.to_vec(),
            out,
            out_dtype: graph.value_type(out).dtype,
            root_dtype: graph.value_type(root_v).dtype,
            dims,
            operands,
        })
    }

    /// The tail's inlined constants, in `Source::Constant` order.
    pub fn constant_values(&self) -> Vec<ValueId> {
        self.operands
            .iter()
            .filter(|o| matches!(o.source, Source::Constant(_)))
            .map(|o| o.value)
            .collect()
    }

    /// A short text for schedules: `+ Add(bias) + Relu`.
    pub fn describe(&self, graph: &Graph) -> String {
        self.nodes.iter().map(|&n| format!(" + {}", graph.node(n).op.name())).collect()
    }

    /// Computes and stores one output element: `root` is the root's value in f32 (the compute
    /// type of every float dtype kernels take), `coords` the element's position as groups of
    /// output dimensions, each `(index within the group, first dim, end dim)`, covering them
    /// in order; `a` the function's arguments. Panics only on a bug here (a malformed op).
    pub fn store(
        &self,
        kb: &KernelBuilder,
        graph: &Graph,
        a: &Args,
        root: V,
        coords: &[(V, usize, usize)],
    ) -> crate::Result<()> {
        let (v, at) = self.value_at(kb, graph, a, root, coords)?;
        kb.store(v, a.output, at);
        Ok(())
    }

    /// Stores `roots.len()` consecutive output elements from `coords` (the last group's index
    /// advancing; they lie in one run of it, and the first is at a multiple of their count) as
    /// one vector store.
    pub fn store_run(
        &self,
        kb: &KernelBuilder,
        graph: &Graph,
        a: &Args,
        roots: &[V],
        coords: &[(V, usize, usize)],
    ) -> crate::Result<()> {
        if roots.len() == 1 {
            return self.store(kb, graph, a, roots[0], coords);
        }
        let (&(last, lo, hi), before) = coords.split_last().expect("a position");
        let mut values = Vec::with_capacity(roots.len());
        let mut first = None;
        for (e, &r) in roots.iter().enumerate() {
            let mut c = before.to_vec();
            c.push((kb.add_k(last, e as i64), lo, hi));
            let (v, at) = self.value_at(kb, graph, a, r, &c)?;
            first.get_or_insert(at);
            values.push(v);
        }
        let vec = kb.from_elements(&values);
        let align = roots.len() * self.out_dtype.size();
        kb.vstore(vec, a.output, first.expect("at least one"), align);
        Ok(())
    }

    /// One output element's stored value and offset (see `store`).
    fn value_at(
        &self,
        kb: &KernelBuilder,
        graph: &Graph,
        a: &Args,
        root: V,
        coords: &[(V, usize, usize)],
    ) -> crate::Result<(V, V)> {
        let mut loaded: Vec<(ValueId, V)> = Vec::new();
        for o in &self.operands {
            let mem = match o.source {
                Source::Buffer(i) => a.buffers[i],
                Source::Constant(i) => a.constants[i],
            };
            let at = offset(kb, &self.dims, &o.strides, coords);
            loaded.push((o.value, kb.load(mem, at)));
        }
        let out_at = offset(kb, &self.dims, &contiguous_strides(&self.dims), coords);
        let stored = kb.scalar(|sb| -> crate::Result<V> {
            // SAFETY: live values of this block's function.
            let val = |v: V| unsafe { melior::ir::Value::from_raw(v) };
            let mut vals: HashMap<ValueId, Scalar> = HashMap::new();
            let r = Scalar { v: val(root), dtype: DType::F32 };
            vals.insert(ValueId::from(self.root), sb.cast(r, self.root_dtype)?);
            for &(v, raw) in &loaded {
                vals.insert(v, sb.load(val(raw), graph.value_type(v).dtype)?);
            }
            eval_chain(sb, graph, &self.nodes, &mut vals)?;
            Ok(sb.store(vals[&self.out])?.to_raw())
        })?;
        Ok((stored, out_at))
    }
}

/// The element offset of a position given as groups of dimensions, through `strides`. A group
/// the strides read as one run (contiguous within it, or broadcast along all of it) costs one
/// multiply; any other is split into its dimensions.
pub fn offset(
    kb: &KernelBuilder,
    dims: &[usize],
    strides: &[usize],
    coords: &[(V, usize, usize)],
) -> V {
    let mut total: Option<V> = None;
    let mut add = |kb: &KernelBuilder, term: V| {
        total = Some(match total {
            Some(t) => kb.add(t, term),
            None => term,
        });
    };
    for &(c, lo, hi) in coords {
        // Dimensions of extent 1 do not move the position.
        let live: Vec<usize> = (lo..hi).filter(|&i| dims[i] > 1).collect();
        if live.iter().all(|&i| strides[i] == 0) {
            continue;
        }
        // One run: strides[i] == s * (extent of the live dims after i) for one s.
        let inner = *live.last().expect("a live dimension");
        let s = strides[inner];
        let mut extent = 1;
        let mut run = true;
        for &i in live.iter().rev() {
            if strides[i] != s * extent {
                run = false;
                break;
            }
            extent *= dims[i];
        }
        if run {
            let t = kb.mul_k(c, s as i64);
            add(kb, t);
            continue;
        }
        // Split the index into the group's dimensions, innermost first.
        let mut rest = c;
        for (k, &i) in live.iter().enumerate().rev() {
            let idx = if k == 0 { rest } else { kb.rem_k(rest, dims[i] as i64) };
            if strides[i] != 0 {
                let t = kb.mul_k(idx, strides[i] as i64);
                add(kb, t);
            }
            if k > 0 {
                rest = kb.div_k(rest, dims[i] as i64);
            }
        }
    }
    total.unwrap_or_else(|| kb.index(0))
}
