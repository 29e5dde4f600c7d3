//! Mixed precision (autocast) as a graph transform: every contraction (Conv, ConvTranspose,
//! MatMul, Gemm) reads its multiplied operands rounded to a narrower float (bf16) and still
//! sums and produces f32, as PyTorch's CPU autocast to bf16 runs these ops; everything else
//! (the parameters, the optimizer's state and update, losses, softmax and normalisation, the
//! biases a contraction adds) stays f32. Applied to a whole training step (forward and
//! backward), so the backward contractions (ConvTranspose of the gradient by the weight, the
//! weight gradient's Conv, the MatMuls of Gemm's rule) round their operands too: the master
//! weights are f32, and only the products see bf16.
//!
//! The rounding is a pair of ordinary casts, `Cast(Cast(x, bf16), f32)`, so the graph stays f32
//! between nodes, every target and the interpreter run it as they run any graph, and the result
//! is exactly "bf16 operands, f32 sums" (a product of two bf16 values is exact in f32). A value
//! read by several contractions (a weight read by its forward Conv and by the ConvTranspose of
//! its input's gradient) is rounded once.

use std::collections::HashMap;
use std::fmt;

use crate::{DType, Graph, IrError, Op, Result, ValueId};

/// What [`autocast`] did: each contraction and the operands it now reads rounded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Autocast {
    /// The type the operands are rounded to.
    pub dtype: DType,
    /// Each contraction cast, in topological order.
    pub cast: Vec<CastNode>,
    /// Contractions left as they were (an operand that is not f32), with the reason.
    pub kept: Vec<(String, String)>,
    /// How many values were rounded (each once, however many contractions read it).
    pub rounded: usize,
}

/// One contraction that reads rounded operands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CastNode {
    /// The node's name.
    pub node: String,
    /// Its op (`Conv`, `ConvTranspose`, `MatMul`, `Gemm`).
    pub op: &'static str,
    /// The values its multiplied operands read before the transform, by name, in operand order.
    pub operands: Vec<String>,
}

impl fmt::Display for Autocast {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} contractions read {} operands ({} values rounded once each), summing in f32:",
            self.cast.len(),
            self.dtype,
            self.rounded
        )?;
        for c in &self.cast {
            writeln!(f, "  {} `{}`: {}", c.op, c.node, c.operands.join(", "))?;
        }
        for (node, why) in &self.kept {
            writeln!(f, "  kept `{node}`: {why}")?;
        }
        Ok(())
    }
}

/// The operands a contraction multiplies (not Conv's bias or Gemm's C, which it adds in f32).
fn multiplied(op: &Op) -> Option<[usize; 2]> {
    matches!(op, Op::Conv(_) | Op::ConvTranspose(_) | Op::MatMul | Op::Gemm(_)).then_some([0, 1])
}

/// Makes every f32 contraction of `graph` read its multiplied operands rounded to `dtype` (bf16
/// or f16) and sum in f32; returns what was cast. The graph's types and outputs do not change.
pub fn autocast(graph: &mut Graph, dtype: DType) -> Result<Autocast> {
    if !matches!(dtype, DType::BF16 | DType::F16) {
        return Err(IrError::Graph(format!(
            "autocast rounds contraction operands to bf16 or f16, not {dtype}"
        )));
    }
    let mut rounded: HashMap<ValueId, ValueId> = HashMap::new();
    let mut out = Autocast { dtype, cast: Vec::new(), kept: Vec::new(), rounded: 0 };
    for id in graph.topo_order()? {
        let node = graph.node(id);
        let Some(which) = multiplied(&node.op) else { continue };
        let (name, op) = (node.name.clone(), node.op.name());
        let operands = graph.operands(id);
        let values: Vec<ValueId> = which.iter().filter_map(|&i| operands[i]).collect();
        if let Some(v) = values.iter().find(|&&v| graph.value_type(v).dtype != DType::F32) {
            let why = format!("`{}` is {}", graph.value_name(*v), graph.value_type(*v).dtype);
            out.kept.push((name, why));
            continue;
        }
        let mut names = Vec::with_capacity(2);
        for i in which {
            let Some(v) = operands[i] else { continue };
            names.push(graph.value_name(v));
            let r = match rounded.get(&v) {
                Some(&r) => r,
                None => {
                    let base = graph.value_name(v);
                    let cast = Op::Cast { to: dtype, saturate: true };
                    let narrow = graph.unique_name(&format!("{base}.{dtype}"));
                    let n = graph.add_node(&narrow, cast, &[Some(v)])?;
                    let wide = graph.unique_name(&format!("{base}.rounded"));
                    let back = Op::Cast { to: DType::F32, saturate: true };
                    let r = ValueId::from(graph.add_node(&wide, back, &[Some(n.into())])?);
                    rounded.insert(v, r);
                    r
                }
            };
            graph.set_operand(id, i, r)?;
        }
        out.cast.push(CastNode { node: name, op, operands: names });
    }
    out.rounded = rounded.len();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::{ConvOptions, GraphBuilder};
    use crate::{eval, Tensor};

    /// x -> Conv(w, b) -> MatMul(m): each multiplied operand rounded once, the bias kept f32,
    /// and the result that of the same graph on operands rounded beforehand.
    #[test]
    fn contractions_read_rounded_operands() {
        let g = GraphBuilder::new("g");
        let x = g.input("x", DType::F32, [1, 2, 4, 4]);
        let w = g.input("w", DType::F32, [3, 2, 3, 3]);
        let b = g.input("b", DType::F32, [3]);
        let m = g.input("m", DType::F32, [4, 5]);
        let c = x.conv(w, Some(b), ConvOptions::default().pad(1));
        let y = c.matmul(m);
        g.output("y", y);
        let graph = g.build().unwrap();
        let mut cast = graph.clone();
        let report = autocast(&mut cast, DType::BF16).unwrap();
        assert_eq!(report.cast.len(), 2);
        assert_eq!(report.rounded, 4, "x, w, the Conv's result, m");
        assert_eq!(report.cast[0].operands, ["x", "w"]);
        cast.verify().unwrap();
        let inputs: Vec<Tensor> = [&[1, 2, 4, 4][..], &[3, 2, 3, 3], &[3], &[4, 5]]
            .iter()
            .enumerate()
            .map(|(i, d)| Tensor::random(DType::F32, d, 10 + i as u64))
            .collect();
        let round = |t: &Tensor| {
            let v: Vec<f64> =
                t.to_f64s().iter().map(|&x| half::bf16::from_f64(x).to_f64()).collect();
            Tensor::from_f64s(DType::F32, t.dims(), &v).unwrap()
        };
        let got = eval::run(&cast, &inputs).unwrap();
        // The same by hand: x and w rounded, the Conv in f32 (bias f32), its result rounded, m
        // rounded, the MatMul in f32.
        let conv = GraphBuilder::new("conv");
        let (hx, hw) =
            (conv.input("x", DType::F32, [1, 2, 4, 4]), conv.input("w", DType::F32, [3, 2, 3, 3]));
        let hb = conv.input("b", DType::F32, [3]);
        conv.output("c", hx.conv(hw, Some(hb), ConvOptions::default().pad(1)));
        let conv = conv.build().unwrap();
        let mm = GraphBuilder::new("mm");
        let (ha, hm) = (mm.input("a", DType::F32, [1, 3, 4, 4]), mm.input("m", DType::F32, [4, 5]));
        mm.output("y", ha.matmul(hm));
        let mm = mm.build().unwrap();
        let c = eval::run(&conv, &[round(&inputs[0]), round(&inputs[1]), inputs[2].clone()])
            .unwrap()
            .remove(0);
        let want = eval::run(&mm, &[round(&c), round(&inputs[3])]).unwrap();
        assert_eq!(got[0].to_f64s(), want[0].to_f64s());
        // f32 alone differs: the rounding happened.
        let plain = eval::run(&graph, &inputs).unwrap();
        assert_ne!(plain[0].to_f64s(), got[0].to_f64s());
    }

    /// The edit autocast makes, refused where it would break the graph: a value computed from
    /// the node itself (a cycle), one of another type, a node that is not in the graph.
    #[test]
    fn set_operand_refuses_cycles_other_types_and_strangers() {
        let g = GraphBuilder::new("g");
        let a = g.input("a", DType::F32, [2, 2]);
        let r = a.relu().named("r");
        let y = r.exp().named("y");
        g.output("y", y);
        let i = g.input("i", DType::I64, [2, 2]);
        g.output("i", i);
        let mut graph = g.build().unwrap();
        let node = |name: &str| graph.node_by_name(name).unwrap();
        let (r, y, i) = (node("r"), node("y"), node("i"));
        let e = graph.set_operand(r, 0, ValueId::from(y)).unwrap_err().to_string();
        assert!(e.contains("a cycle"), "{e}");
        let e = graph.set_operand(r, 0, ValueId::from(i)).unwrap_err().to_string();
        assert!(e.contains("is f32[2,2], not i64[2,2]"), "{e}");
        let stranger = crate::NodeId::new(1000);
        assert!(graph.set_operand(stranger, 0, ValueId::from(r)).is_err());
        graph.verify().unwrap();
    }

    #[test]
    fn other_types_are_kept_or_refused() {
        let g = GraphBuilder::new("g");
        let a = g.input("a", DType::F64, [2, 3]);
        let b = g.input("b", DType::F64, [3, 2]);
        g.output("y", a.matmul(b));
        let mut graph = g.build().unwrap();
        let report = autocast(&mut graph, DType::BF16).unwrap();
        assert!(report.cast.is_empty());
        assert_eq!(report.kept, [("matmul".to_string(), "`a` is f64".to_string())]);
        let e = autocast(&mut graph, DType::F32).unwrap_err().to_string();
        assert!(e.contains("bf16 or f16, not f32"), "{e}");
    }
}
