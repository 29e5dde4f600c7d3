//! A CPU `Schedule` carried out: the kernel's ops are tagged, phase A is a transform script made
//! from the schedule, then (when vectorising) unit dimensions are folded, each register-sized op
//! vectorised, and canonicalisation turns tiles into SSA vectors (phases B and C, see
//! `schedule.rs`).

use melior::ir::Module;

use super::schedule::{vector_sizes, Schedule, Split};
use crate::backend::edit::RawOp;
use crate::backend::linalg::{self, LinalgOp};
use crate::backend::MlirContext;

const ANY: &str = "!transform.any_op";

fn script_header() -> String {
    String::from(
        "module attributes {transform.with_named_sequence} {\n  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {\n",
    )
}

fn script_footer(s: &mut String) {
    s.push_str("    transform.yield\n  }\n}\n");
}

/// Phase A's transform script for `sch`, tagging the kernel's ops (`raw`, beside `ops`) for it.
pub fn phase_a(ctx: &melior::Context, ops: &[LinalgOp], raw: &[RawOp], sch: &Schedule) -> String {
    let a = sch.anchor;
    raw[a].set_unit_attr(ctx, "kiln.anchor");
    let producers: Vec<usize> = (0..ops.len()).filter(|&i| i != a).collect();
    let mut s = script_header();
    s.push_str(&format!("    %a = transform.structured.match attributes {{kiln.anchor}} in %root : ({ANY}) -> {ANY}\n"));
    // Handle of each op after distribution.
    let mut handle: Vec<String> = vec![String::new(); ops.len()];
    handle[a] = "%a".into();
    for (n, &i) in producers.iter().rev().enumerate() {
        raw[i].set_unit_attr(ctx, &format!("kiln.op{n}"));
        s.push_str(&format!("    %p{n} = transform.structured.match attributes {{kiln.op{n}}} in %root : ({ANY}) -> {ANY}\n"));
        handle[i] = format!("%p{n}");
    }
    if let Some(Split { dim: d, tile, .. }) = sch.split {
        let sizes: Vec<String> =
            (0..=d).map(|i| if i == d { tile.to_string() } else { "0".into() }).collect();
        s.push_str(&format!(
            "    %t, %l0 = transform.structured.tile_using_forall %a tile_sizes [{}] : ({ANY}) -> ({ANY}, {ANY})\n",
            sizes.join(", ")
        ));
        handle[a] = "%t".into();
        // Fuse producers, nearest first, each into the loop the previous fusion returned.
        let feeds_pad = feeds_a_pad(ops);
        // The loop handle the next fusion goes into: `%l{loop_at}` (a skipped op returns none).
        let mut loop_at = 0;
        for (n, &i) in producers.iter().rev().enumerate() {
            if feeds_pad[i] {
                continue;
            }
            s.push_str(&format!(
                "    %f{n}, %l{} = transform.structured.fuse_into_containing_op %p{n} into %l{loop_at} : ({ANY}, {ANY}) -> ({ANY}, {ANY})\n",
                n + 1
            ));
            loop_at = n + 1;
            handle[i] = format!("%f{n}");
        }
    }
    if let Some(reg) = &sch.register {
        let mut sizes: Vec<String> = reg.sizes.iter().map(|t| t.to_string()).collect();
        let n = reg.sizes.len();
        sizes.resize(ops[a].loops(), "0".into());
        s.push_str(&format!(
            "    %rt, %rl:{n} = transform.structured.tile_using_for {} tile_sizes [{}] : ({ANY}) -> ({ANY}{})\n",
            handle[a],
            sizes.join(", "),
            format!(", {ANY}").repeat(n)
        ));
        let mut cur = format!("%rl#{}", n - 1);
        for (j, &i) in reg.chain.iter().enumerate() {
            s.push_str(&format!(
                "    %g{j}, %c{j} = transform.structured.fuse_into_containing_op {} into {cur} : ({ANY}, {ANY}) -> ({ANY}, {ANY})\n",
                handle[i]
            ));
            cur = format!("%c{j}");
            handle[i] = format!("%g{j}");
        }
        handle[a] = "%rt".into();
        if let (Some((c, red)), true) = (&reg.contraction, reg.dot) {
            let sizes: Vec<String> = red.iter().map(|t| t.to_string()).collect();
            s.push_str(&format!(
                "    %kf, %ks, %kc, %kl = transform.structured.tile_reduction_using_for {} by tile_sizes = [{}] : ({ANY}) -> ({ANY}, {ANY}, {ANY}, {ANY})\n",
                handle[*c],
                sizes.join(", ")
            ));
            s.push_str(&format!(
                "    %kg = transform.structured.generalize %kc : ({ANY}) -> {ANY}\n"
            ));
        } else if let Some((c, red)) = &reg.contraction {
            let q = red.iter().filter(|&&t| t != 0).count();
            let sizes: Vec<String> = red.iter().map(|t| t.to_string()).collect();
            s.push_str(&format!(
                "    %ck, %ckl:{q} = transform.structured.tile_using_for {} tile_sizes [{}] : ({ANY}) -> ({ANY}{})\n",
                handle[*c],
                sizes.join(", "),
                format!(", {ANY}").repeat(q)
            ));
        }
        if reg.peel {
            s.push_str(&format!(
                "    %vl = transform.cast {cur} : {ANY} to !transform.op<\"scf.for\">\n"
            ));
            s.push_str(&format!("    %vm, %vr = transform.loop.peel %vl : (!transform.op<\"scf.for\">) -> ({ANY}, {ANY})\n"));
        }
    }
    for (j, &(i, chunk)) in sch.rows.iter().enumerate() {
        let op = &ops[i];
        let sizes: Vec<String> = op
            .parallel
            .iter()
            .map(|&p| if p { "1".to_string() } else { chunk.to_string() })
            .collect();
        let n = op.parallel.iter().filter(|&&p| p).count() + usize::from(chunk > 0);
        s.push_str(&format!(
            "    %row{j}, %rowl{j}:{n} = transform.structured.tile_using_for {} tile_sizes [{}] : ({ANY}) -> ({ANY}{})\n",
            handle[i],
            sizes.join(", "),
            format!(", {ANY}").repeat(n)
        ));
    }
    for (j, (i, perm)) in sch.reorder.iter().enumerate() {
        let perm: Vec<String> = perm.iter().map(|x| x.to_string()).collect();
        s.push_str(&format!(
            "    %ri{j} = transform.structured.interchange {} iterator_interchange = [{}] : ({ANY}) -> {ANY}\n",
            handle[*i],
            perm.join(", ")
        ));
    }
    script_footer(&mut s);
    s
}

/// Which ops a `tensor.pad` of the kernel reads, directly or through other ops: they stay out of
/// the workgroup loop (computed whole before it; the pad itself is fused). Fusing them into the
/// loop after the pad leaves MLIR's IR broken (printing it, or canonicalising the pad, crashes:
/// a bf16 or f16 Conv, whose input is widened to f32 by a generic before it is padded).
fn feeds_a_pad(ops: &[LinalgOp]) -> Vec<bool> {
    let mut marked = vec![false; ops.len()];
    let mut stack: Vec<usize> = ops
        .iter()
        .filter(|o| o.kind == linalg::OpKind::Pad)
        .flat_map(|o| o.producers.iter().flatten().copied())
        .collect();
    while let Some(i) = stack.pop() {
        if i < ops.len() && !marked[i] {
            marked[i] = true;
            stack.extend(ops[i].producers.iter().flatten().copied());
        }
    }
    marked
}

/// Carries out a schedule on the kernel's module.
pub fn apply(
    mlir: &MlirContext,
    module: &mut Module,
    ops: &[LinalgOp],
    raw: &[RawOp],
    sch: &Schedule,
) -> Result<(), String> {
    let script = phase_a(&mlir.ctx, ops, raw, sch);
    mlir.apply_transform(&module.as_operation(), &script)?;
    if !sch.vectorize {
        return Ok(());
    }
    mlir.run_pipeline(module, "builtin.module(canonicalize,cse)")?;
    // Phase B: fold unit dimensions, then vectorise the register-sized ops one by one.
    let mut s = script_header();
    s.push_str(&format!("    %func = transform.structured.match ops{{[\"func.func\"]}} in %root : ({ANY}) -> {ANY}\n"));
    s.push_str("    transform.apply_patterns to %func {\n      transform.apply_patterns.linalg.fold_unit_extent_dims_via_slices\n    } : !transform.any_op\n");
    script_footer(&mut s);
    mlir.apply_transform(&module.as_operation(), &s)?;
    let func = RawOp(super::kernel_func(module).ok_or("no function")?.to_raw());
    let candidates: Vec<RawOp> = func
        .descendants()
        .into_iter()
        .filter(|o| o.is("linalg.generic") || o.is("linalg.fill"))
        .collect();
    for (i, o) in candidates.into_iter().enumerate() {
        let Some(sizes) = vector_sizes(&linalg::read_op(o)) else { continue };
        let tag = format!("kiln.v{i}");
        o.set_unit_attr(&mlir.ctx, &tag);
        let mut s = script_header();
        s.push_str(&format!("    %v = transform.structured.match attributes {{{tag}}} in %root : ({ANY}) -> {ANY}\n"));
        let sz: Vec<String> = sizes.iter().map(|x| x.to_string()).collect();
        s.push_str(&format!(
            "    transform.structured.vectorize %v vector_sizes [{}] : {ANY}\n",
            sz.join(", ")
        ));
        script_footer(&mut s);
        // An op that does not vectorise stays a loop nest.
        let _ = mlir.apply_transform(&module.as_operation(), &s);
    }
    // Phase C: tile tensors become SSA vectors; accumulators leave the reduction loops.
    mlir.run_pipeline(module, "builtin.module(canonicalize,cse,func.func(lower-vector-mask),canonicalize,cse,loop-invariant-code-motion,loop-invariant-subset-hoisting,canonicalize,cse)")?;
    Ok(())
}
