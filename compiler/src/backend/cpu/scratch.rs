//! The C kernels' scratch, bounded at compile time for the memory budget. Each object file that
//! includes `workspace.h` has four `scratch()` slots per thread, each grown to the largest any
//! kernel asked of it and kept from launch to launch; `support.c` counts a slot's block as its
//! size rounded up to 64 bytes plus a 64-byte header. What a kernel asks of a slot is the size
//! its C code computes from the plan's arguments (sizes, blocking, chunks), mirrored here one
//! entry point at a time as an upper bound: where the C code picks one of several paths at run
//! time, the bound is the largest. `tests/tests/status.rs` checks the bounds against what runs
//! hold (`Executable::kernel_scratch_peak`), and the runtime refuses anything past the budget
//! whatever this says.

use std::collections::BTreeMap;

use kiln_ir::op::RnnCell;

use super::ukernel::{conv, qconv, DepthwiseForm, Shape, Ukernel};

/// The object files with scratch slots of their own (`gather.c`, `reduction.c` and `movement.c`
/// have none).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum File {
    /// The packed GEMM (`kiln_gemm_block`'s panels, whoever calls it) and `kiln_uk_gemm`.
    Gemm,
    Conv,
    Depthwise,
    Pool,
    Recurrent,
    Attention,
    Quantized,
}

/// A slot: its file and number (0 to 3).
pub type Slot = (File, u8);

/// The register tile's columns (`NR` in `tile.h`).
const NR: u64 = 32;

/// What the kernel's C code may ask of each slot on one thread, in bytes as `support.c` counts
/// them. Empty for a kernel that asks nothing.
pub fn slots(u: &Ukernel) -> Vec<(Slot, u64)> {
    let mut out = Vec::new();
    let mut ask = |file: File, slot: u8, floats: u64| out.push(((file, slot), block(floats)));
    // The register tile's rows (`KILN_MR`): the plan's, else AVX-512's (the larger).
    let mr = if u.mr > 0 { u.mr as u64 } else { 8 };
    let (kc, mc, nc, chunks) = (u.kc as u64, u.mc as u64, u.nc as u64, u.chunks.max(1) as u64);
    // kiln_gemm_block's panels: B's when B is packed at run time, A's when A is.
    let b_panel = kc.saturating_mul(round_up(nc, NR));
    let a_panel = kc.saturating_mul(round_up(mc, mr));
    match u.shape {
        Shape::Conv { c, h, w, m, group, kh, kw, stride, dilation, pad, oh, ow, .. } => {
            let [c, h, w, m, group, kh, kw, oh, ow] =
                [c, h, w, m, group, kh, kw, oh, ow].map(|x| x as u64);
            let [sh, sw] = stride.map(|x| x as u64);
            let [dh, dw] = dilation.map(|x| x as u64);
            let [ph, pw] = pad.map(|x| x as u64);
            let khw = kh * kw;
            // pack_window_strip_gather's offsets, for rows shorter than a vector.
            let gather = |width: u64| (ow > 1 && ow < 16).then(|| khw.saturating_mul(width));
            let pointwise =
                khw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0 && oh == h && ow == w;
            match u.depthwise_form() {
                Some(DepthwiseForm::Blocked) => {}
                Some(DepthwiseForm::Regrouped) => {
                    let (hp, wp) = dw_plane(h, w, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow);
                    ask(File::Depthwise, 0, hp.saturating_mul(wp).saturating_mul(16));
                    ask(File::Depthwise, 1, oh.saturating_mul(ow).saturating_mul(16));
                }
                Some(DepthwiseForm::Rows) => {
                    let hp = (oh.saturating_sub(1)) * sh + (kh - 1) * dh + 1;
                    let lanes = round_up(ow, 16);
                    let wp = (lanes - 1) * sw + (kw - 1) * dw + 1 + 16 * sw;
                    ask(File::Depthwise, 0, hp.saturating_mul(wp).saturating_add(160 * sw + 64));
                }
                None if u.transposed || u.blocked.output => {
                    // C^T through scratch unless stored blocked; A is the image's positions.
                    if !u.blocked.output {
                        ask(File::Conv, 3, oh.saturating_mul(ow).saturating_mul(m));
                    }
                    if !u.blocked.input {
                        ask(File::Gemm, 1, a_panel);
                        if !pointwise {
                            if let Some(g) = gather(mr) {
                                ask(File::Gemm, 2, g);
                            }
                        }
                    }
                }
                None if group == 1 && (khw > 1 || sh * sw > 1) => {
                    // conv_direct: the stride-phase planes of a chunk's rows, their offsets,
                    // and in bf16 the planes again as channel pairs.
                    let rows_chunk = if u.split_n { chunk(oh, 1, chunks) } else { oh };
                    let rows = rows_chunk + (kh - 1) * dh / sh;
                    let plane = rows.saturating_mul(ow + (kw - 1) * dw / sw);
                    let phases = sh * sw;
                    let planes = |channels: u64| {
                        channels.saturating_mul(phases).saturating_mul(plane).saturating_add(64)
                    };
                    ask(File::Conv, 0, planes(c));
                    ask(File::Conv, 1, 2 * c * khw);
                    if u.channel_vectors > 0 {
                        // The positions' flat indices (int64; room for a last tile of up to 16
                        // past them), and the sums of a run of them by a block of channels.
                        let count = rows_chunk.saturating_mul(ow);
                        ask(File::Conv, 2, 2 * round_up(count.saturating_add(16), 16));
                        // (The sums of a run of at most NC positions at a time.)
                        let run = round_up(count.min(nc).saturating_add(16), 16);
                        ask(File::Conv, 3, run.saturating_mul(16 * u.channel_vectors as u64));
                    }
                    if u.amx {
                        // (AMX: the pairs padded to whole tile steps.)
                        let (kb, gb) = conv::amx_pair_blocks(c as usize);
                        ask(File::Conv, 2, planes((kb * gb) as u64));
                    } else if u.bf16 {
                        ask(File::Conv, 2, planes(c.div_ceil(2)));
                    }
                }
                None => {
                    // One GEMM a group, B the image (im2col) packed at run time.
                    ask(File::Gemm, 0, b_panel);
                    if !u.blocked.input && !pointwise {
                        if let Some(g) = gather(NR) {
                            ask(File::Gemm, 2, g);
                        }
                    }
                }
            }
        }
        Shape::ConvTranspose { h, w, cout, kh, kw, .. } => {
            // The columns of a chunk of output channels (whole register-tile strips of rows),
            // and B (the input) packed at run time.
            let khw = (kh * kw) as u64;
            let step = mr / gcd(khw, mr);
            let channels = chunk(cout as u64, step, chunks);
            ask(File::Conv, 3, channels.saturating_mul(khw).saturating_mul((h * w) as u64));
            ask(File::Gemm, 0, b_panel);
        }
        Shape::Gemm { m, k, .. } => {
            let (m, k) = (m as u64, k as u64);
            if u.amx {
                // A's rows of a chunk as bf16 pairs, rows to whole tile pairs (32) and pairs to
                // whole steps (16).
                let rows = if u.split_n { m } else { chunk(m, mr, chunks) };
                ask(File::Gemm, 1, round_up(rows, 32).saturating_mul(round_up(k.div_ceil(2), 16)));
            } else if u.bf16 {
                // A's rows of a chunk as bf16 pairs.
                let rows = if u.split_n { m } else { chunk(m, mr, chunks) };
                ask(File::Gemm, 1, rows.saturating_mul(k.div_ceil(2)));
            } else if m >= mr {
                ask(File::Gemm, 1, a_panel);
            }
        }
        Shape::Pool { h: _, w, kh, kw, stride, dilation, pad, oh, ow, kind, .. } => {
            let [w, kh, kw, oh, ow] = [w, kh, kw, oh, ow].map(|x| x as u64);
            let [sh, sw] = stride.map(|x| x as u64);
            let [dh, dw] = dilation.map(|x| x as u64);
            let pw = pad[1] as u64;
            if kind == 3 {
                // kiln_uk_maxpool_u8's padded row, in bytes.
                let len = ((ow.saturating_sub(1)) * sw + (kw - 1) * dw + 1).max(pw + w);
                ask(File::Quantized, 0, (len + 64).div_ceil(4));
            } else {
                // pool2d's row buffers, band and divisors, or maxpool3x3s2's row: the larger.
                let lanes = round_up(ow, 16);
                let wp = (lanes - 1) * sw + (kw - 1) * dw + 1 + 16 * sw;
                let band = 7 * sh + (kh - 1) * dh + 1;
                let row3 = (2 * lanes + 48).max(pw + w + 16);
                ask(File::Pool, 0, (2 * (wp + 64)).max(row3));
                ask(File::Pool, 2, band.saturating_mul(lanes));
                ask(File::Pool, 1, oh + lanes + 16);
            }
        }
        Shape::QConv { c, group, h, w, kh, kw, stride, dilation, pad, oh, ow, amx, .. } => {
            // AMX pads the channel groups to whole tile steps (their planes are read, times
            // zero weights).
            let groups = if amx {
                let (kb, gb) = qconv::amx_blocks(c);
                kb * gb
            } else {
                c.div_ceil(4)
            } as u64;
            let [h, w, kh, kw, oh, ow] = [h, w, kh, kw, oh, ow].map(|x| x as u64);
            let [sh, sw] = stride.map(|x| x as u64);
            let [dh, dw] = dilation.map(|x| x as u64);
            let [ph, pw] = pad.map(|x| x as u64);
            let k4 = groups.saturating_mul(kh * kw);
            if group > 1 {
                let (hp, wp) = dw_plane(h, w, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow);
                ask(File::Quantized, 0, hp.saturating_mul(wp).saturating_mul(16));
                ask(File::Quantized, 1, oh.saturating_mul(ow).saturating_mul(16));
            } else if qconv::gemm_form(&u.shape) {
                // kiln_uk_qgemm reads its rows where they lie.
            } else if kh * kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0 && oh == h && ow == w
            {
                let p = h * w;
                let n = if u.split_n { chunk(p, 32, chunks) } else { p };
                ask(File::Quantized, 0, k4.saturating_mul(n).saturating_add(64));
                ask(File::Quantized, 1, 2 * k4);
            } else {
                let rows_chunk = if u.split_n { chunk(oh, 1, chunks) } else { oh };
                let rows = rows_chunk + (kh - 1) * dh / sh;
                let plane = rows.saturating_mul(ow + (kw - 1) * dw / sw);
                let words = groups.saturating_mul(sh * sw).saturating_mul(plane);
                ask(File::Quantized, 0, words.saturating_add(64));
                ask(File::Quantized, 1, 2 * k4);
            }
        }
        Shape::Attention { kv_seq, head, .. } => {
            // K^T of a head and a block of 4 score rows, each padded to 32 keys.
            let tp = round_up(kv_seq as u64, 32);
            ask(File::Attention, 0, (head as u64).saturating_mul(tp));
            ask(File::Attention, 1, 4 * tp);
        }
        Shape::Recurrent { cell, seq, batch, input: _, hidden, .. } => {
            let gates = match cell {
                RnnCell::Simple => 1,
                RnnCell::Gru { .. } => 3,
                RnnCell::Lstm { .. } => 4,
            };
            let hp = round_up(hidden as u64, 16);
            let ghp = gates * hp;
            let (rows, batch) = ((seq * batch) as u64, batch as u64);
            // Every step's projections and the state, then the projection's GEMM (A the
            // input, read strided).
            let floats = rows.saturating_mul(ghp).saturating_add(3 * batch * hp + batch * ghp);
            ask(File::Recurrent, 0, floats);
            if rows >= mr {
                ask(File::Gemm, 1, a_panel);
            }
        }
        Shape::NBitsGemm { rows, k, .. } => {
            // More than NB_PANEL_ROWS rows: a strip's weights as f32, [K / 32 groups][4][32].
            // (Fewer read them packed, and copy a partial group of rows onto the stack.)
            if rows > 4 {
                ask(File::Quantized, 2, (k as u64).div_ceil(32).saturating_mul(32 * 4));
            }
        }
        // (kiln_uk_dqgemm quantizes its rows into a buffer on its stack.)
        Shape::DynQGemm { .. }
        | Shape::Gather { .. }
        | Shape::Reduce { .. }
        | Shape::Softmax { .. }
        | Shape::Transpose { .. } => {}
    }
    out
}

/// What one thread may hold of the C kernels' scratch when it runs every kernel in `kernels`:
/// each slot at the largest any of them asks of it, all slots together.
pub fn held<'a>(kernels: impl IntoIterator<Item = &'a [(Slot, u64)]>) -> u64 {
    let mut largest: BTreeMap<Slot, u64> = BTreeMap::new();
    for asks in kernels {
        for &(slot, bytes) in asks {
            let l = largest.entry(slot).or_default();
            *l = (*l).max(bytes);
        }
    }
    largest.values().fold(0u64, |t, &b| t.saturating_add(b))
}

/// A slot's block for `floats` floats, as `workspace.h` asks and `support.c` counts it.
fn block(floats: u64) -> u64 {
    round_up(floats.max(1).saturating_mul(4), 64).saturating_add(64)
}

fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to).saturating_mul(to)
}

/// The most items one of `chunks` chunks of `n` (in multiples of `r`) covers: `chunk_range`.
fn chunk(n: u64, r: u64, chunks: u64) -> u64 {
    let r = r.max(1);
    (n.div_ceil(r).div_ceil(chunks.max(1)).saturating_mul(r)).min(n)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a.max(1)
    } else {
        gcd(b, a % b)
    }
}

/// `dw_plane_size` (depthwise.h): the padded plane a depthwise kernel copies each block into.
#[allow(clippy::too_many_arguments)]
fn dw_plane(
    h: u64,
    w: u64,
    kh: u64,
    kw: u64,
    sh: u64,
    sw: u64,
    dh: u64,
    dw: u64,
    ph: u64,
    pw: u64,
    oh: u64,
    ow: u64,
) -> (u64, u64) {
    let hp = (oh.saturating_sub(1) * sh + (kh - 1) * dh + 1).max(ph + h);
    let wp = (ow.saturating_sub(1) * sw + (kw - 1) * dw + 1).max(pw + w);
    (hp, wp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_and_blocks_are_what_the_c_code_computes() {
        // chunk_range(16, 2, 4, q): 4 channels a chunk; of 5 items in 2 chunks of 4-multiples,
        // the first has 4.
        assert_eq!(chunk(16, 2, 4), 4);
        assert_eq!(chunk(5, 4, 2), 4);
        assert_eq!(chunk(3, 8, 1), 3);
        // A slot of 1 float is a 64-byte block and its header; 16 floats too; 17 take 128.
        assert_eq!(block(0), 128);
        assert_eq!(block(16), 128);
        assert_eq!(block(17), 192);
        assert_eq!(gcd(1024, 8), 8);
        assert_eq!(gcd(9, 8), 1);
    }

    #[test]
    fn a_thread_holds_each_slot_at_its_largest() {
        let a = [((File::Gemm, 0), 100), ((File::Gemm, 1), 10)];
        let b = [((File::Gemm, 0), 50), ((File::Gemm, 3), 7), ((File::Attention, 0), 1)];
        assert_eq!(held([&a[..], &b[..]]), 100 + 10 + 7 + 1);
        assert_eq!(held(std::iter::empty::<&[(Slot, u64)]>()), 0);
    }
}
