//! Writing transform-dialect scripts: a named sequence built step by step, each step naming
//! its result handles. Payload ops are found by the `kiln.*` unit attributes the schedules put
//! on them.

const ANY: &str = "!transform.any_op";

/// A `@__transform_main` sequence under construction.
pub struct Script {
    body: String,
    next: usize,
}

impl Script {
    pub fn new() -> Script {
        Script { body: String::new(), next: 0 }
    }

    fn fresh(&mut self) -> String {
        self.next += 1;
        format!("%h{}", self.next)
    }

    fn line(&mut self, s: &str) {
        self.body.push_str("    ");
        self.body.push_str(s);
        self.body.push('\n');
    }

    /// The ops carrying the unit attribute `tag`, inside `scope` (the root when `None`).
    pub fn tagged(&mut self, tag: &str, scope: Option<&str>) -> String {
        let h = self.fresh();
        self.line(&format!(
            "{h} = transform.structured.match attributes {{{tag}}} in {} : ({ANY}) -> {ANY}",
            scope.unwrap_or("%root")
        ));
        h
    }

    /// Ops by name inside `scope`.
    pub fn ops(&mut self, names: &[&str], scope: &str) -> String {
        let h = self.fresh();
        let list: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
        self.line(&format!(
            "{h} = transform.structured.match ops{{[{}]}} in {scope} : ({ANY}) -> {ANY}",
            list.join(", ")
        ));
        h
    }

    /// Tiles `op` into an `scf.forall` with the given per-loop tile sizes (0: not tiled) and
    /// mapping; returns (tiled op, forall).
    pub fn tile_forall(
        &mut self,
        op: &str,
        sizes: &[usize],
        mapping: &[String],
    ) -> (String, String) {
        let (t, l) = (self.fresh(), self.fresh());
        self.line(&format!(
            "{t}, {l} = transform.structured.tile_using_forall {op} tile_sizes [{}] (mapping = [{}]) : ({ANY}) -> ({ANY}, {ANY})",
            join(sizes),
            mapping.join(", ")
        ));
        (t, l)
    }

    /// Tiles `op` into an `scf.forall` of the given thread counts per loop (0: not tiled).
    pub fn tile_forall_threads(
        &mut self,
        op: &str,
        counts: &[usize],
        mapping: &[String],
    ) -> (String, String) {
        let (t, l) = (self.fresh(), self.fresh());
        self.line(&format!(
            "{t}, {l} = transform.structured.tile_using_forall {op} num_threads [{}] (mapping = [{}]) : ({ANY}) -> ({ANY}, {ANY})",
            join(counts),
            mapping.join(", ")
        ));
        (t, l)
    }

    /// Tiles `op` into nested `scf.for` loops; returns (tiled op, outermost loop).
    pub fn tile_for(&mut self, op: &str, sizes: &[usize]) -> (String, String) {
        let loops = sizes.iter().filter(|&&s| s != 0).count();
        let t = self.fresh();
        let ls: Vec<String> = (0..loops).map(|_| self.fresh()).collect();
        let outs: Vec<String> =
            std::iter::once(ANY.to_string()).chain(ls.iter().map(|_| ANY.to_string())).collect();
        self.line(&format!(
            "{t}, {} = transform.structured.tile_using_for {op} tile_sizes [{}] : ({ANY}) -> ({})",
            ls.join(", "),
            join(sizes),
            outs.join(", ")
        ));
        (t, ls.into_iter().next().unwrap_or_default())
    }

    /// Fuses `producer` into `containing`; returns the new containing op.
    pub fn fuse(&mut self, producer: &str, containing: &str) -> String {
        let (f, l) = (self.fresh(), self.fresh());
        self.line(&format!(
            "{f}, {l} = transform.structured.fuse_into_containing_op {producer} into {containing} : ({ANY}, {ANY}) -> ({ANY}, {ANY})"
        ));
        l
    }

    /// Splits a reduction across threads (partial results per thread, then a combining op);
    /// returns (fill of the partials, partial op, combining op, forall).
    pub fn tile_reduction_threads(
        &mut self,
        op: &str,
        counts: &[usize],
        mapping: &str,
    ) -> (String, String, String, String) {
        let (a, b, c, d) = (self.fresh(), self.fresh(), self.fresh(), self.fresh());
        self.line(&format!(
            "{a}, {b}, {c}, {d} = transform.structured.tile_reduction_using_forall {op} by num_threads = [{}] mapping = [{mapping}] : ({ANY}) -> ({ANY}, {ANY}, {ANY}, {ANY})",
            join(counts)
        ));
        (a, b, c, d)
    }

    /// Splits a reduction into partial results over an inner parallel dimension of `factor`
    /// (element k = outer * factor + inner), inserted at `at` in the partials; returns (fill of
    /// the partials, partial op, combining op).
    pub fn split_reduction(
        &mut self,
        op: &str,
        factor: usize,
        at: usize,
    ) -> (String, String, String) {
        let (init, fill, split, combine) = (self.fresh(), self.fresh(), self.fresh(), self.fresh());
        self.line(&format!(
            "{init}, {fill}, {split}, {combine} = transform.structured.split_reduction {op} {{split_factor = {factor}, insert_split_dimension = {at}, inner_parallel}} : ({ANY}) -> ({ANY}, {ANY}, {ANY}, {ANY})"
        ));
        (fill, split, combine)
    }

    /// The op producing operand `i` of `op`.
    pub fn producer_of(&mut self, op: &str, i: usize) -> String {
        let h = self.fresh();
        self.line(&format!("{h} = transform.get_producer_of_operand {op}[{i}] : ({ANY}) -> {ANY}"));
        h
    }

    /// Pads `op`'s operands to full static tiles, materialising copies of the inputs (which
    /// later become workgroup-memory tiles); returns the padded op.
    pub fn pad_inputs(
        &mut self,
        op: &str,
        n_loops: usize,
        n_operands: usize,
        zero: &str,
    ) -> String {
        let (p, pad, copy) = (self.fresh(), self.fresh(), self.fresh());
        let values: Vec<String> = (0..n_operands).map(|_| zero.to_string()).collect();
        let nofold: Vec<String> = (0..n_operands)
            .map(|i| if i + 1 < n_operands { "1".into() } else { "0".into() })
            .collect();
        let dims: Vec<String> = (0..n_loops).map(|d| d.to_string()).collect();
        self.line(&format!(
            "{p}, {pad}, {copy} = transform.structured.pad {op} {{padding_values = [{}], padding_dimensions = [{}], nofold_flags = [{}], copy_back_op = \"none\"}} : ({ANY}) -> ({ANY}, {ANY}, {ANY})",
            values.join(", "),
            dims.join(", "),
            nofold.join(", ")
        ));
        p
    }

    /// Distributes a copy (or a pad without padding) over `threads` threads; returns the forall.
    pub fn copy_to_threads(&mut self, op: &str, threads: usize, bits: usize) -> String {
        let (l, c) = (self.fresh(), self.fresh());
        self.line(&format!(
            "{l}, {c} = transform.structured.gpu.map_copy_to_threads {op} total_num_threads = {threads} desired_bit_alignment = {bits} : ({ANY}) -> ({ANY}, {ANY})"
        ));
        l
    }

    /// Rewrites ops (pads) into destination-passing style (fill + copy).
    pub fn destination_style(&mut self, op: &str) -> String {
        let h = self.fresh();
        self.line(&format!("{h} = transform.structured.rewrite_in_destination_passing_style {op} : ({ANY}) -> {ANY}"));
        h
    }

    pub fn merge(&mut self, handles: &[String]) -> String {
        let h = self.fresh();
        self.line(&format!("{h} = transform.merge_handles {} : {ANY}", handles.join(", ")));
        h
    }

    /// Puts the unit attribute `tag` on the ops of a handle (to find them in a later script).
    pub fn annotate(&mut self, op: &str, tag: &str) {
        self.line(&format!("transform.annotate {op} \"{tag}\" : {ANY}"));
    }

    pub fn canonicalize(&mut self, scope: &str) {
        self.line(&format!("transform.apply_patterns to {scope} {{ transform.apply_patterns.canonicalization }} : {ANY}"));
        self.line(&format!("transform.apply_cse to {scope} : {ANY}"));
    }

    /// Any other step, verbatim (without results).
    pub fn raw(&mut self, s: &str) {
        self.line(s);
    }

    /// A step with one result handle, verbatim after `%h = `.
    pub fn raw_result(&mut self, s: &str) -> String {
        let h = self.fresh();
        self.line(&format!("{h} = {s}"));
        h
    }

    /// The script module.
    pub fn finish(self) -> String {
        // Bufferizing the whole module consumes the root handle; every other script reads it.
        let root = if self.body.contains("one_shot_bufferize %root") {
            "transform.consumed"
        } else {
            "transform.readonly"
        };
        format!(
            "module attributes {{transform.with_named_sequence}} {{\n  transform.named_sequence @__transform_main(%root: {ANY} {{{root}}}) {{\n{}    transform.yield\n  }}\n}}\n",
            self.body
        )
    }
}

impl Default for Script {
    fn default() -> Script {
        Script::new()
    }
}

fn join(v: &[usize]) -> String {
    v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
}

/// The block mapping for a grid's dimensions (outermost first, at most three): x, which may be
/// as large as 2^31 - 1, takes the dimension with the most blocks; y and z (at most 65535 each)
/// the others, larger first.
pub fn block_mapping(counts: &[usize]) -> Vec<String> {
    let mut order: Vec<usize> = (0..counts.len()).collect();
    // Largest first; ties keep the innermost first.
    order.sort_by(|&a, &b| counts[b].cmp(&counts[a]).then(b.cmp(&a)));
    let mut out = vec![String::new(); counts.len()];
    for (rank, &i) in order.iter().enumerate() {
        out[i] = match rank {
            0..=2 => format!("#gpu.block<{}>", ["x", "y", "z"][rank]),
            _ => format!("#gpu.block<linear_dim_{rank}>"),
        };
    }
    out
}

/// The mapping attributes for `n` forall dimensions (outermost first) onto `kind` (`block` or
/// `thread`): x is the innermost. More than three dimensions, or a y/z count beyond the hardware's
/// 65535, use linear ids.
pub fn mapping(kind: &str, counts: &[usize]) -> Vec<String> {
    let n = counts.len();
    let xyz_fits = n <= 3 && counts.iter().rev().skip(1).all(|&c| c <= 65535);
    (0..n)
        .map(|i| {
            let from_inner = n - 1 - i;
            if xyz_fits {
                format!("#gpu.{kind}<{}>", ["x", "y", "z"][from_inner])
            } else {
                format!("#gpu.{kind}<linear_dim_{from_inner}>")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_put_x_innermost_and_go_linear_past_the_hardware() {
        assert_eq!(mapping("thread", &[4, 8]), ["#gpu.thread<y>", "#gpu.thread<x>"]);
        assert_eq!(
            mapping("block", &[2, 3, 4]),
            ["#gpu.block<z>", "#gpu.block<y>", "#gpu.block<x>"]
        );
        // Four dimensions, or a y count past 65535 (x may be larger): linear ids.
        assert_eq!(
            mapping("thread", &[1, 2, 3, 4]),
            [
                "#gpu.thread<linear_dim_3>",
                "#gpu.thread<linear_dim_2>",
                "#gpu.thread<linear_dim_1>",
                "#gpu.thread<linear_dim_0>"
            ]
        );
        assert_eq!(
            mapping("block", &[70_000, 2]),
            ["#gpu.block<linear_dim_1>", "#gpu.block<linear_dim_0>"]
        );
        assert_eq!(mapping("block", &[2, 70_000]), ["#gpu.block<y>", "#gpu.block<x>"]);
        assert!(mapping("block", &[]).is_empty());
    }

    #[test]
    fn block_mappings_give_x_to_the_most_blocks() {
        // Ties go to the innermost loop.
        assert_eq!(block_mapping(&[2, 8, 8]), ["#gpu.block<z>", "#gpu.block<y>", "#gpu.block<x>"]);
        assert_eq!(
            block_mapping(&[3, 1, 2, 5]),
            ["#gpu.block<y>", "#gpu.block<linear_dim_3>", "#gpu.block<z>", "#gpu.block<x>"]
        );
    }
}
