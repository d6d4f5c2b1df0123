//! Token selection on the device (kernels/sample.cu): the sampling penalties
//! and the k highest logits, so a decode step returns k candidates, not the
//! vocabulary; and the draw among them, so it can return a token.

use m40_device::{DeviceBuffer, DeviceView, Stream};

use crate::error::Result;
use crate::launch::{cfg, check_len, shape, to_i32};
use crate::Kernels;

/// The most candidates one selection returns (`SAMPLE_MAX_K`).
pub const SELECT_MAX_K: usize = 1024;
/// Ints before the penalty pairs in a selection's arguments (`SAMPLE_ARGS`).
pub const SELECT_ARGS: usize = 8;
/// Threads of the selection block (`SAMPLE_THREADS`).
const SAMPLE_THREADS: u32 = 1024;
/// The most blocks a selection launches (`SAMPLE_MAX_BLOCKS`).
const SAMPLE_MAX_BLOCKS: usize = 256;
/// Logits a block of a greedy selection takes (one load per thread and
/// round: 4 rounds in flight at once).
const SAMPLE_BLOCK_LOGITS: usize = 4 * SAMPLE_THREADS as usize;
/// Length of a selection's scratch (`SAMPLE_SCRATCH`): zeroed once, left
/// zero by every selection.
pub const SELECT_SCRATCH: usize = 2 * SAMPLE_MAX_BLOCKS + 32;

/// llama.cpp's penalties, as the CPU sampler applies them: a logit l of a
/// token seen c times in the window becomes (l > 0 ? l / repeat : l *
/// repeat) - (c * frequency + presence).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Penalties {
    pub repeat: f32,
    pub frequency: f32,
    pub presence: f32,
}

impl Penalties {
    /// No penalty.
    pub const NONE: Penalties = Penalties {
        repeat: 1.0,
        frequency: 0.0,
        presence: 0.0,
    };
}

/// Where [`select_args`] keeps the flag that the row's token mask applies
/// ([`select_masked`]).
const MASKED_ARG: usize = 5;

/// A selection's arguments as [`Kernels::select_top_k`] reads them from
/// device memory: n_pen, k, the bits of the three penalties, the masked
/// flag (clear: see [`select_masked`]), padding to [`SELECT_ARGS`], then
/// the (id, count) pairs `pen` (ids distinct).
pub fn select_args(k: usize, p: Penalties, pen: &[(u32, u32)]) -> Vec<i32> {
    let mut v = Vec::with_capacity(SELECT_ARGS + 2 * pen.len());
    v.extend([
        pen.len().min(i32::MAX as usize) as i32,
        k.min(i32::MAX as usize) as i32,
        p.repeat.to_bits() as i32,
        p.frequency.to_bits() as i32,
        p.presence.to_bits() as i32,
    ]);
    v.resize(SELECT_ARGS, 0);
    v.extend(pen.iter().flat_map(|&(id, c)| {
        [
            id.min(i32::MAX as u32) as i32,
            c.min(i32::MAX as u32) as i32,
        ]
    }));
    v
}

/// Arguments of [`select_args`] whose row takes its token mask (the
/// `masks` of [`Kernels::select_top_k_rows`]): every token the mask does
/// not allow is -inf before the penalties and the selection.
pub fn select_masked(mut args: Vec<i32>) -> Vec<i32> {
    args[MASKED_ARG] = 1;
    args
}

/// Where [`Kernels::select_top_k`] writes: `out` (2 k ints) and its
/// `scratch` ([`SELECT_SCRATCH`] ints).
/// The rows of [`Kernels::select_top_k_rows`]: how many, of how many
/// logits, their arguments how far apart, and the most candidates a row
/// asks for.
#[derive(Clone, Copy, Debug)]
pub struct SelectRows {
    pub rows: usize,
    pub n_vocab: usize,
    pub args_stride: usize,
    pub k_max: usize,
}

/// The rows' token masks ([`select_masked`]): `words` u32 a row (at least
/// n_vocab / 32 rounded up), bit i % 32 of word i / 32 allows token i.
pub struct SelectMasks<'a, 'b> {
    pub masks: &'a DeviceView<'b, u32>,
    pub words: usize,
}

pub struct SelectOut<'a> {
    pub out: &'a mut DeviceBuffer<i32>,
    pub scratch: &'a mut DeviceBuffer<i32>,
}

impl Kernels {
    /// Penalize `logits[..n_vocab]` in place, then write the k highest
    /// logits, sorted (logit descending, id ascending on ties; IEEE total
    /// order): their ids to `out[..k]` and the bits of their logits to
    /// `out[k..2k]` (one buffer, one copy). k = 1 is argmax. k, the
    /// penalties and their pairs are read on the device from `args` (see
    /// [`select_args`]), so a captured graph selects with each replay's
    /// own; the kernel clamps k to 1 ..= `k_max` and the pairs to what
    /// `args` holds. `scratch` ([`SELECT_SCRATCH`] ints, zeroed before its
    /// first selection and left zero by each) lets a greedy selection
    /// without penalties run on many blocks; one scratch per stream.
    pub fn select_top_k(
        &self,
        stream: &Stream,
        logits: &mut DeviceBuffer<f32>,
        n_vocab: usize,
        args: &DeviceView<'_, i32>,
        k_max: usize,
        SelectOut { out, scratch }: SelectOut<'_>,
    ) -> Result<()> {
        let rows = SelectRows {
            rows: 1,
            n_vocab,
            args_stride: args.len(),
            k_max,
        };
        self.select_top_k_rows(stream, logits, args, rows, None, SelectOut { out, scratch })
    }

    /// [`Kernels::select_top_k`] over `rows` rows of `logits` (row r at r
    /// `n_vocab`: [`SelectRows`]) at once, each with its own arguments (row r's at r
    /// `args_stride` of `args`, laid out by [`select_args`]) into its own
    /// part of `out` (at r 2 `k_max`: its k ids, then their logits' bits)
    /// with its own part of `scratch` (at r [`SELECT_SCRATCH`]: zero
    /// before, left zero). A row whose arguments say masked
    /// ([`select_masked`]) takes its mask from `masks` (at r `words`);
    /// without `masks` no row is masked.
    pub fn select_top_k_rows(
        &self,
        stream: &Stream,
        logits: &mut DeviceBuffer<f32>,
        args: &DeviceView<'_, i32>,
        SelectRows {
            rows,
            n_vocab,
            args_stride,
            k_max,
        }: SelectRows,
        masks: Option<SelectMasks<'_, '_>>,
        SelectOut { out, scratch }: SelectOut<'_>,
    ) -> Result<()> {
        const K: &str = "select_top_k_rows_f32";
        if k_max == 0 || k_max > SELECT_MAX_K || k_max > n_vocab {
            return Err(shape(
                K,
                format!(
                    "k = {k_max}: must be 1 ..= {SELECT_MAX_K} and at most the {n_vocab} tokens"
                ),
            ));
        }
        if rows == 0 {
            return Ok(());
        }
        if args_stride < SELECT_ARGS || rows > 65535 {
            return Err(shape(
                K,
                format!("{rows} rows with arguments {args_stride} apart"),
            ));
        }
        check_len(K, "logits", logits.len(), rows * n_vocab)?;
        check_len(K, "args", args.len(), rows * args_stride)?;
        check_len(K, "out", out.len(), rows * 2 * k_max)?;
        check_len(K, "scratch", scratch.len(), rows * SELECT_SCRATCH)?;
        let mask_words = match &masks {
            Some(m) => {
                if m.words < n_vocab.div_ceil(32) {
                    return Err(shape(
                        K,
                        format!("masks of {} words for {n_vocab} tokens", m.words),
                    ));
                }
                check_len(K, "masks", m.masks.len(), rows * m.words)?;
                to_i32(K, "mask words", m.words)?
            }
            None => 0,
        };
        let kernel = self.kernel("sample", K)?;
        // A block per SAMPLE_BLOCK_LOGITS logits of a row, the rows' blocks
        // at most one wave (more would only queue).
        let blocks = n_vocab
            .div_ceil(SAMPLE_BLOCK_LOGITS)
            .min((self.resident_blocks(&kernel, SAMPLE_THREADS, 0)? / rows).max(1))
            .clamp(1, SAMPLE_MAX_BLOCKS);
        let nv = to_i32(K, "n_vocab", n_vocab)?;
        let stride = to_i32(K, "args_stride", args_stride)?;
        let pen_cap = to_i32(K, "penalties", (args_stride - SELECT_ARGS) / 2)?;
        let k_cap = k_max as i32;
        // SAFETY: select_top_k_rows_f32(float* logits, int n_vocab, const
        // int* args, int args_stride, int pen_cap, int k_cap, const u32*
        // masks, int mask_words, int* out, int* scratch): blocks (b, r), r <
        // rows, read masks[r * mask_words..][..n_vocab / 32 rounded up] only
        // where mask_words > 0 (then checked above; else a null pointer,
        // never read), read row r's logits[r *
        // n_vocab..][..n_vocab] (block (0, r) alone writes them: penalties)
        // and args[r * args_stride..][..SELECT_ARGS + 2 pen_cap] (n_pen
        // clamped to pen_cap, within the stride), write out[r * 2 k_cap..]
        // [..2k] with k clamped to k_cap (<= SAMPLE_MAX_K, the shared
        // arrays) and scratch[r * SELECT_SCRATCH..][..SELECT_SCRATCH] (pairs
        // of the row's blocks, at most SAMPLE_MAX_BLOCKS, and its counter);
        // lengths checked above.
        unsafe {
            let l = stream
                .launch(&kernel)
                .buf_mut(logits)
                .scalar(&nv)
                .view(args)
                .scalar(&stride)
                .scalar(&pen_cap)
                .scalar(&k_cap);
            let l = match &masks {
                Some(m) => l.view(m.masks),
                None => l.null(),
            };
            l.scalar(&mask_words)
                .buf_mut(out)
                .buf_mut(scratch)
                .run(cfg((blocks as u32, rows as u32, 1), SAMPLE_THREADS))?
        };
        Ok(())
    }
}

/// Ints of a draw's arguments (`DRAW_ARGS`): see [`draw_args`].
pub const DRAW_ARGS: usize = 4;

/// A draw's arguments as [`Kernels::sample_draw`] reads them from device
/// memory: the candidates a row's selection returned (k), then the bits of
/// the temperature (<= 0: the first candidate), top-p and min-p.
pub fn draw_args(k: usize, temperature: f32, top_p: f32, min_p: f32) -> [i32; DRAW_ARGS] {
    [
        k.min(i32::MAX as usize) as i32,
        temperature.to_bits() as i32,
        top_p.to_bits() as i32,
        min_p.to_bits() as i32,
    ]
}

/// The rows of [`Kernels::sample_draw`]: how many, the most candidates a
/// row's selection holds (`select_top_k_rows`'s `k_max`), and how far apart
/// the rows' arguments are.
#[derive(Clone, Copy, Debug)]
pub struct DrawRows {
    pub rows: usize,
    pub k_max: usize,
    pub args_stride: usize,
}

impl Kernels {
    /// Each row's token drawn on the device from its selection (`sel`:
    /// [`Kernels::select_top_k_rows`]'s `out`, row r at r 2 `k_max`: its k
    /// ids best first, then their logits' bits) as the host's sampler draws
    /// among selected candidates: temperature <= 0 the first; else the
    /// masked (-inf) ones dropped while any other is left, top-p, min-p,
    /// the temperature and a seeded draw, in the host's FP64 arithmetic
    /// (kernels/sample.cu `sample_draw_f32`). Row r's arguments are at r
    /// `args_stride` of `args` ([`draw_args`]), its SplitMix64 state in
    /// `rng[r]` (advanced once a draw, written back); its token goes to
    /// `tokens[r]`. Nothing is read on the host: capturable.
    pub fn sample_draw(
        &self,
        stream: &Stream,
        sel: &DeviceView<'_, i32>,
        args: &DeviceView<'_, i32>,
        DrawRows {
            rows,
            k_max,
            args_stride,
        }: DrawRows,
        rng: &mut DeviceBuffer<u64>,
        tokens: &mut DeviceBuffer<i32>,
    ) -> Result<()> {
        const K: &str = "sample_draw_f32";
        if k_max == 0 || k_max > SELECT_MAX_K || args_stride < DRAW_ARGS {
            return Err(shape(
                K,
                format!("k = {k_max} (1 ..= {SELECT_MAX_K}), arguments {args_stride} apart"),
            ));
        }
        if rows == 0 {
            return Ok(());
        }
        check_len(K, "sel", sel.len(), rows * 2 * k_max)?;
        check_len(K, "args", args.len(), rows * args_stride)?;
        check_len(K, "rng", rng.len(), rows)?;
        check_len(K, "tokens", tokens.len(), rows)?;
        let kernel = self.kernel("sample", K)?;
        let (k_cap, stride) = (k_max as i32, to_i32(K, "args_stride", args_stride)?);
        let grid = u32::try_from(rows).map_err(|_| shape(K, format!("{rows} rows")))?;
        // SAFETY: sample_draw_f32(const int* sel, int k_cap, const int*
        // args, int args_stride, unsigned long long* rng, int* tokens):
        // block r < rows reads args[r * args_stride..][..DRAW_ARGS] (within
        // the stride), clamps k to 1 ..= k_cap (<= SAMPLE_MAX_K, its shared
        // array) and reads sel[r * 2 k_cap..][..2k], reads and writes
        // rng[r], writes tokens[r]; lengths checked above.
        unsafe {
            stream
                .launch(&kernel)
                .view(sel)
                .scalar(&k_cap)
                .view(args)
                .scalar(&stride)
                .buf_mut(rng)
                .buf_mut(tokens)
                .run(cfg((grid, 1, 1), SAMPLE_THREADS))?
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_match_the_kernel() {
        // `#define NAME value` in sample.cu: the launcher sizes the grid,
        // the output and the scratch by these.
        let src = include_str!("../../../kernels/sample.cu");
        let define = |name: &str| crate::cuda_define(src, name).expect(name);
        let num = |name: &str| define(name).parse::<usize>().expect(name);
        assert_eq!(num("SAMPLE_THREADS"), SAMPLE_THREADS as usize);
        assert_eq!(num("SAMPLE_MAX_K"), SELECT_MAX_K);
        assert_eq!(num("SAMPLE_ARGS"), SELECT_ARGS);
        assert_eq!(num("SAMPLE_MAX_BLOCKS"), SAMPLE_MAX_BLOCKS);
        assert_eq!(num("DRAW_ARGS"), DRAW_ARGS);
        assert_eq!(define("SAMPLE_SCRATCH"), "(2 * SAMPLE_MAX_BLOCKS + 32)");
        assert_eq!(SELECT_SCRATCH, 2 * SAMPLE_MAX_BLOCKS + 32);
    }
}
