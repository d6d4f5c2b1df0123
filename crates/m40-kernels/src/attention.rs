//! Attention over the paged KV cache (kernels/attention.cu).

use m40_device::{DeviceBuffer, DeviceView, KernelArgs, Stream};

use crate::decode::{DecodeOp, DecodeOpHead, OpArgs, DEC_MAX_HEAD_DIM, DEC_SHARED, DEC_THREADS};
use crate::error::Result;
use crate::launch::{cfg_shared as cfg, check_len, shape, to_i32};
use crate::layout::{KvType, KV_PAGE};
use crate::Kernels;

/// Largest head dimension attention supports (`attn_f32_r8`: 8 per lane).
pub const MAX_HEAD_DIM: usize = 256;
/// `ATT_MAX_WARPS`: warps per attention block at most.
const ATT_MAX_WARPS: usize = 8;

/// The shape of an attention launch: `n_tok` query tokens at positions
/// `start..start + n_tok` of one sequence, each attending causally to the
/// keys before it (and itself). The kernels read the start from device
/// memory (`pos[0]`), so a captured launch replays at any position; `start`
/// here is the largest it will be (the launcher checks buffers against it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnShape {
    pub n_tok: usize,
    pub start: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// How scores are formed and which keys count.
    pub scores: Scores,
}

/// An attention's scores: q.k times `scale` (None: 1/sqrt(head_dim)),
/// soft-capped to c tanh(s / c) where `softcap` > 0 (gemma2), over the
/// `window` newest keys (a token's own included) where `window` > 0 (a
/// sliding-window layer), else over every key before it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Scores {
    pub scale: Option<f32>,
    pub softcap: f32,
    pub window: usize,
}

impl AttnShape {
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    fn check(&self, k: &'static str) -> Result<()> {
        let AttnShape {
            n_head,
            n_head_kv,
            head_dim,
            ..
        } = *self;
        if n_head_kv == 0 || !n_head.is_multiple_of(n_head_kv) {
            return Err(shape(
                k,
                format!("{n_head} query heads do not divide into {n_head_kv} KV heads"),
            ));
        }
        if head_dim == 0 || head_dim > MAX_HEAD_DIM || !head_dim.is_multiple_of(2) {
            return Err(shape(
                k,
                format!("head dimension {head_dim} (must be even, 2..={MAX_HEAD_DIM})"),
            ));
        }
        Ok(())
    }
}

/// Most key splits attn_combine_f32 merges (`ATT_MAX_SPLITS`), and its
/// threads (`ATT_COMBINE_THREADS`).
const ATT_MAX_SPLITS: usize = 1024;
const ATT_COMBINE_THREADS: u32 = 512;
/// Splits from which the combine takes a block per 32 dimensions of a row,
/// not one per row.
const ATT_COMBINE_PARTS_FROM: usize = 16;

/// Blocks per SM below which attention splits the keys. 8B decode at
/// depth 4096 on an H100: 2 per SM gave 33 splits of 4-5 pages.
const SPLIT_BLOCKS_PER_SM: usize = 8;

/// How an attention launch divides the work (see kernels/attention.cu).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnPlan {
    /// Query tokens per block.
    pub tpb: usize,
    /// Query heads per block, and blocks per KV head.
    pub gw: usize,
    pub hparts: usize,
    /// Key ranges (a multiple of KV_PAGE keys each) and their count.
    pub split_len: usize,
    pub splits: usize,
    /// Prefill in register tiles (`attn_tile_f32_d*`: 32 query rows a
    /// block, head dimensions 64 and 128; one split). `tpb`, `gw` and
    /// `hparts` are then the other kernel's, used only where a decode
    /// program records (the persistent kernel has no tile op).
    pub tile: bool,
    /// Decode (one query token) in `attn_dec_f32_*`: warps a block (1 to
    /// 8; 0: not that kernel), each taking 16 keys a pass for every query
    /// head of its block; a block per (KV head, split, head part: see
    /// `dec_heads`). As with `tile`,
    /// `tpb`, `gw` and `hparts` are the warp kernel's, for a decode
    /// program's record.
    pub dec_warps: usize,
    /// The decode kernel's query heads a block (its `G`: 1, 2, 4 or 8): all
    /// of the KV head's (the next power of two) or, where the keys are not
    /// split, fewer, in blocks of their own (more blocks at once for a
    /// latency-bound short context).
    pub dec_heads: usize,
}

impl AttnPlan {
    /// The plan for `s` on a GPU of `sm_count` SMs: one warp per (token,
    /// head), up to ATT_MAX_WARPS per block, the heads of a KV head together;
    /// keys split when there are fewer blocks than SPLIT_BLOCKS_PER_SM per
    /// SM, down to one page of keys per split (decode: each block walks its
    /// pages one after another, so the pages per block set the latency;
    /// BENCHMARKS.md, "Measurements behind constants").
    pub fn new(s: &AttnShape, sm_count: usize) -> AttnPlan {
        AttnPlan::choose(s, sm_count, true)
    }

    /// [`AttnPlan::new`], with one-token steps in the warp kernel where
    /// `decode_kernel` is false (to compare the two).
    pub fn choose(s: &AttnShape, sm_count: usize, decode_kernel: bool) -> AttnPlan {
        let group = s.n_head / s.n_head_kv;
        let gw = group.min(ATT_MAX_WARPS);
        let hparts = group.div_ceil(gw);
        let tpb = (ATT_MAX_WARPS / gw).clamp(1, s.n_tok.max(1));
        let blocks = s.n_tok.div_ceil(tpb) * s.n_head_kv * hparts;
        let keys = s.start + s.n_tok;
        let pages = keys.div_ceil(KV_PAGE).max(1);
        let want = (SPLIT_BLOCKS_PER_SM * sm_count.max(1))
            .div_ceil(blocks)
            .max(1);
        // The tile kernel walks all of a block's keys in one split: where
        // the warp kernel would split them (few query blocks) over many
        // pages (a short step deep in a context: a chat turn after a long
        // history), its blocks would each walk the whole context.
        let tile_ok = want == 1 || pages <= ATT_TILE_MAX_SPLIT_PAGES;
        if s.n_tok >= ATT_TILE_MIN_TOKENS && attn_tile_fits(s) && tile_ok {
            return AttnPlan {
                tpb,
                gw,
                hparts,
                split_len: pages * KV_PAGE,
                splits: 1,
                tile: true,
                dec_warps: 0,
                dec_heads: 0,
            };
        }
        let (splits, dec_warps, dec_heads) = match attn_dec_group(s).filter(|_| decode_kernel) {
            // Decode: no split while the block's warps take every key in
            // ATT_DEC_MAX_PASSES passes; else splits toward
            // ATT_DEC_BLOCKS_PER_SM blocks an SM, a pass per warp at least.
            Some(g) => {
                let passes = keys.div_ceil(ATT_DEC_KEYS);
                let warps = passes.min(ATT_DEC_MAX_WARPS);
                let splits = match passes <= ATT_DEC_MAX_WARPS * ATT_DEC_MAX_PASSES {
                    true => 1,
                    false => (ATT_DEC_BLOCKS_PER_SM * sm_count.max(1))
                        .div_ceil(s.n_head_kv)
                        .min(passes / ATT_DEC_MAX_WARPS),
                };
                let heads = match splits {
                    1 => ATT_DEC_SHORT_HEADS.min(g),
                    _ => g,
                };
                (splits, warps, heads)
            }
            None => (want.min(pages), 0, 0),
        };
        let split_len = pages.div_ceil(splits.clamp(1, ATT_MAX_SPLITS)) * KV_PAGE;
        AttnPlan {
            tpb,
            gw,
            hparts,
            split_len,
            splits: keys.div_ceil(split_len),
            tile: false,
            dec_warps,
            dec_heads,
        }
    }

    /// Floats of the partial-sum scratch: (n_tok, n_head, splits, head_dim),
    /// and of the (max, sum) scratch: (n_tok, n_head, splits, 2); empty
    /// without splits.
    pub fn scratch_len(&self, s: &AttnShape) -> (usize, usize) {
        if self.splits == 1 {
            return (0, 0);
        }
        let rows = s.n_tok * s.n_head * self.splits;
        (rows * s.head_dim, rows * 2)
    }
}

/// Keys a warp of the decode kernel takes a pass (`ATT_DEC_KEYS`), its
/// warps a block at most (`ATT_DEC_MAX_WARPS`), the passes a warp takes
/// before the keys split, and the blocks an SM the splits aim at.
const ATT_DEC_KEYS: usize = 16;
const ATT_DEC_MAX_WARPS: usize = 8;
const ATT_DEC_MAX_PASSES: usize = 2;
const ATT_DEC_BLOCKS_PER_SM: usize = 2;
/// The decode kernel's query heads a block where the keys are not split:
/// one (BENCHMARKS.md, "Measurements behind constants").
const ATT_DEC_SHORT_HEADS: usize = 1;

/// The query heads per KV head (`G`) of the decode kernel for `s`: one
/// query token, head dimension 64 or 128 with at most 8 query heads per KV
/// head, or 256 with at most 2 (the smallest of 1, 2, 4, 8 that holds
/// them); None where the warp kernel runs.
fn attn_dec_group(s: &AttnShape) -> Option<usize> {
    let group = s.n_head / s.n_head_kv.max(1);
    let most = match s.head_dim {
        64 | 128 => 8,
        256 => 2,
        _ => 0,
    };
    match s.n_tok == 1 && (1..=most).contains(&group) {
        true => Some(group.next_power_of_two()),
        false => None,
    }
}

/// Whether one-token steps of heads of `head_dim`, `group` query heads a
/// KV head, run the decode kernel, and so whether
/// [`Kernels::attention_decode_batch`] takes a batch of them.
pub fn attn_decodes(head_dim: usize, group: usize) -> bool {
    let s = AttnShape {
        n_tok: 1,
        start: 0,
        n_head: group,
        n_head_kv: 1,
        head_dim,
        scores: Scores::default(),
    };
    attn_dec_group(&s).is_some()
}

/// Bytes of dynamic shared memory of `attn_dec_f32_*` for head dimension
/// `hd` and `g` heads: q (g x hd), P (8 warps x 16 keys x g), the warps'
/// maxima and sums (2 x 8 x g) and outputs (8 x g x hd), FP32.
pub const fn attn_dec_shared_bytes(hd: usize, g: usize) -> usize {
    4 * g * (hd + ATT_DEC_MAX_WARPS * ATT_DEC_KEYS + 2 * ATT_DEC_MAX_WARPS + ATT_DEC_MAX_WARPS * hd)
}

/// Bytes of dynamic shared memory of `attn_f32_r*` for head dimension `hd`.
pub const fn attn_shared_bytes(hd: usize) -> usize {
    let hw = hd / 2;
    4 * (ATT_MAX_WARPS * hd + KV_PAGE * (hw + 1) + KV_PAGE * hw)
}
// The persistent decode kernel's blocks hold the attention ops it records.
const _: () = assert!(attn_shared_bytes(DEC_MAX_HEAD_DIM) == DEC_SHARED);

/// Query tokens from which a step's attention runs in register tiles
/// (`AttnPlan::tile`); decode steps and short prompts keep the warp per
/// (token, head) kernel and its key splits.
const ATT_TILE_MIN_TOKENS: usize = 32;
/// Pages of keys up to which a step whose warp-kernel plan would split the
/// keys still takes the tile kernel (SmolLM2's 512-token prompt: 3 KV heads,
/// 768 warp-kernel blocks on an H100, 16 pages).
const ATT_TILE_MAX_SPLIT_PAGES: usize = 32;
/// Threads and query rows (token, head) of a tile block.
const ATT_TILE_THREADS: u32 = 128;
const ATT_TILE_ROWS: usize = 32;

/// Whether `s` suits the tile kernel: head dimension 64 or 128, at most 32
/// query heads per KV head.
fn attn_tile_fits(s: &AttnShape) -> bool {
    matches!(s.head_dim, 64 | 128) && s.n_head / s.n_head_kv <= ATT_TILE_ROWS
}

/// Bytes of dynamic shared memory of `attn_tile_f32_d*` for head dimension
/// `hd`: Q (hd x 32), one page of K or V (32 x hd), P (32 x 32), FP32.
pub const fn attn_tile_shared_bytes(hd: usize) -> usize {
    4 * (2 * hd * ATT_TILE_ROWS + KV_PAGE * ATT_TILE_ROWS)
}

/// Scratch for attention's split partials ([`AttnPlan::scratch_len`]).
pub struct AttnScratch<'a> {
    pub part: &'a mut DeviceBuffer<f32>,
    pub part_ml: &'a mut DeviceBuffer<f32>,
}

impl Kernels {
    /// Causal attention of `s.n_tok` queries q (n_tok, n_head, head_dim) FP32
    /// (RoPE applied) over the keys and values of the sequence whose pages
    /// are `table`, positions 0..=pos[0]+i for query i (pos[0] read on the
    /// device, at most `s.start`); out (n_tok, n_head, head_dim) FP32.
    /// `scratch` must hold `plan.scratch_len(s)` floats when the plan
    /// splits the keys. Returns the plan launched.
    pub fn attention(
        &self,
        stream: &Stream,
        s: &AttnShape,
        inputs: &AttnInputs<'_, '_>,
        out: &mut DeviceBuffer<f32>,
        scratch: Option<AttnScratch<'_>>,
        plan: Option<AttnPlan>,
    ) -> Result<AttnPlan> {
        const K: &str = "attention";
        let AttnInputs {
            q,
            kpool,
            vpool,
            format,
            table,
            pos,
            sinks,
        } = *inputs;
        s.check(K)?;
        let sm = self.device().info().sm_count as usize;
        let plan = plan.unwrap_or_else(|| AttnPlan::new(s, sm));
        if s.n_tok == 0 {
            return Ok(plan);
        }
        let hd = s.head_dim;
        let rows = s.n_tok * s.n_head;
        check_len(K, "q", q.len(), rows * hd)?;
        check_len(K, "out", out.len(), rows * hd)?;
        let keys = s.start + s.n_tok;
        check_len(K, "table", table.len(), keys.div_ceil(KV_PAGE))?;
        format.check_pool(K, kpool.len(), s.kv_dim(), hd)?;
        check_len(K, "vpool", vpool.len(), kpool.len())?;
        check_len(K, "pos", pos.len(), 1)?;
        if let Some(sk) = sinks {
            check_len(K, "sinks", sk.len(), s.n_head)?;
        }
        let smem = attn_shared_bytes(hd);
        self.check_shared(K, smem)?;
        let group = s.n_head / s.n_head_kv;
        let args = attn_scalars(s, &plan)?;
        if plan.tile && (plan.splits != 1 || !attn_tile_fits(s)) {
            return Err(shape(K, format!("plan {plan:?}: no tile kernel for {s:?}")));
        }
        if plan.tile {
            let tpb = ATT_TILE_ROWS / group;
            let grid = (
                to_i32(K, "blocks", s.n_tok.div_ceil(tpb))? as u32,
                to_i32(K, "heads", s.n_head_kv)? as u32,
                1,
            );
            if grid.1 > 65535 {
                return Err(shape(K, format!("grid {grid:?} too large")));
            }
            let name = if hd == 64 {
                inputs
                    .format
                    .pick(&crate::layout::kv_names!("attn_tile_f32_d4"))
            } else {
                inputs
                    .format
                    .pick(&crate::layout::kv_names!("attn_tile_f32_d8"))
            };
            let kernel = self.kernel("attention", name)?;
            // SAFETY: attn_tile_f32_d<hd / 16> (the parameters of
            // attn_f32_r<R>, push_attn): reads pos[0] (at most s.start, the
            // caller's promise), q and table within the lengths checked
            // above and pool rows of the pages the table names; writes out
            // rows < n_tok * n_head; part_ml unused (null). Shared memory:
            // attn_tile_shared_bytes, under 48 KB for hd <= 128.
            unsafe {
                push_attn(stream.launch(&kernel), inputs, out, None, &args).run(cfg(
                    grid,
                    ATT_TILE_THREADS,
                    attn_tile_shared_bytes(hd) as u32,
                ))?
            };
            return Ok(plan);
        }
        if plan.gw * plan.hparts < group
            || plan.tpb * plan.gw > ATT_MAX_WARPS
            || !plan.split_len.is_multiple_of(KV_PAGE)
            || plan.split_len == 0
            || plan.splits * plan.split_len < keys
        {
            return Err(shape(K, format!("plan {plan:?} does not cover {s:?}")));
        }
        let grid = (
            to_i32(K, "blocks", s.n_tok.div_ceil(plan.tpb))? as u32,
            to_i32(K, "heads", s.n_head_kv * plan.hparts)? as u32,
            to_i32(K, "splits", plan.splits)? as u32,
        );
        if grid.1 > 65535 || grid.2 > 65535 {
            return Err(shape(K, format!("grid {grid:?} too large")));
        }
        if plan.splits > ATT_MAX_SPLITS {
            return Err(shape(
                K,
                format!("{} key splits (at most {ATT_MAX_SPLITS})", plan.splits),
            ));
        }
        let warps = plan.tpb * plan.gw;
        let threads = (32 * warps) as u32;
        let (np, nml) = plan.scratch_len(s);
        let mut scratch = match (plan.splits, scratch) {
            (1, _) => None,
            (_, Some(sc)) => {
                check_len(K, "part", sc.part.len(), np)?;
                check_len(K, "part_ml", sc.part_ml.len(), nml)?;
                Some(sc)
            }
            (n, None) => return Err(shape(K, format!("{n} key splits need scratch"))),
        };
        // An op of the persistent kernel (crate::decode) where its blocks
        // hold the plan (4 warps, head dims up to 128); else this plan's
        // kernel: the warp kernel, or the decode kernel of one token.
        let recordable =
            warps <= (DEC_THREADS / 32) as usize && hd <= DEC_MAX_HEAD_DIM && format == KvType::F16;
        let mut c = cfg(grid, threads, smem as u32);
        let exec = self.exec(recordable, || match plan.dec_warps {
            0 => self.kernel("attention", attn_warp_kernel(hd, format)),
            warps => {
                let g = plan.dec_heads;
                let name = attn_dec_kernel(s, g, false, format)
                    .filter(|_| warps <= ATT_DEC_MAX_WARPS)
                    .ok_or_else(|| {
                        shape(K, format!("plan {plan:?}: no decode kernel for {s:?}"))
                    })?;
                if !q.is_aligned(16) {
                    return Err(shape(K, "q must start at a multiple of 16 bytes".into()));
                }
                let parts = (s.n_head / s.n_head_kv).div_ceil(g);
                let grid = (s.n_head_kv as u32, grid.2, parts as u32);
                c = cfg(grid, 32 * warps as u32, attn_dec_shared_bytes(hd, g) as u32);
                self.kernel("attention", name)
            }
        })?;
        let head = DecodeOpHead {
            kind: DecodeOp::Attn,
            blocks: (grid.0 * grid.1 * grid.2) as usize,
            variant: hd.div_ceil(32) as i32,
            fold: 0,
            grid: [grid.0, grid.1, grid.2],
        };
        // Split keys write partials (and their max and sum) for the combine.
        let (dst, part_ml) = match &mut scratch {
            None => (&mut *out, None),
            Some(sc) => (&mut *sc.part, Some(&mut *sc.part_ml)),
        };
        let mut a = AttnArgs {
            p: inputs,
            out: dst,
            part_ml,
            sc: &args,
        };
        // SAFETY: attn_f32_r<R> (see push_attn for its parameters) with R =
        // ceil(hd / 32), or attn_dec_f32_d<hd / 32>_g<G> (G >= the query
        // heads per KV head in its head parts, one query token; grid
        // (n_head_kv, splits, ceil(heads per KV head / G))):
        // reads pos[0] (at most s.start, the caller's promise), q and table
        // within the lengths checked above and pool rows of the pages the
        // table names (below the pool's page count, kept so by the caller);
        // writes out rows < n_tok * n_head (or the split partials, sized by
        // the caller from scratch_len, checked above); part_ml is untouched
        // when splits == 1 (a null pointer then). Shared memory:
        // attn_shared_bytes, or attn_dec_shared_bytes (under 48 KB).
        // Recorded, the persistent kernel's attention op (the warp kernel's
        // code) does the same with the same arguments.
        unsafe { self.submit(stream, &exec, c, head, &mut a)? };
        if let Some(sc) = scratch {
            // Many splits (a long context): a block per row and 32
            // dimensions, so more SMs read the partials at once.
            let parts = match plan.splits >= ATT_COMBINE_PARTS_FROM {
                true => hd.div_ceil(32) as u32,
                false => 1,
            };
            let exec = self.exec(recordable, || self.kernel("attention", "attn_combine_f32"))?;
            let head = DecodeOpHead {
                kind: DecodeOp::Combine,
                blocks: rows,
                variant: 0,
                fold: 0,
                grid: [0; 3],
            };
            let comb = [plan.splits as i32, hd as i32, s.n_head as i32];
            let mut a = CombineArgs {
                s: &sc,
                out,
                sinks,
                sc: &comb,
            };
            let c = cfg((rows as u32, parts, 1), ATT_COMBINE_THREADS, 0);
            // SAFETY: attn_combine_f32(const float* part, const float* part_ml,
            // float* out, const float* sinks, int splits, int hd, int
            // n_head): block (r, y) reads part[(r*splits..)*hd],
            // part_ml[r*splits*2..], sinks[r % n_head] (n_head of them,
            // checked; or null) and writes its slice of out[r*hd..][..hd],
            // r < rows, y < parts <= hd; lengths checked above. Recorded:
            // decode.cu's DecCombine, the same.
            unsafe { self.submit(stream, &exec, c, head, &mut a)? };
        }
        Ok(plan)
    }

    /// Decode attention over a batch of sequences, one query token each
    /// (`attn_dec_b_f32_*`): token t (row t of q and out) at position
    /// pos[t] attends to its own sequence's keys 0 ..= pos[t], whose block
    /// table starts at `inputs.table[tab[t]]`. `s.n_tok` is the batch,
    /// `s.start` the largest position. No key splits: a block per (KV
    /// head, token, head part). An error where no decode kernel takes the
    /// shape (head dimensions other than 64 and 128, more than 8 query
    /// heads per KV head): the caller runs the sequences one by one.
    pub fn attention_decode_batch(
        &self,
        stream: &Stream,
        s: &AttnShape,
        inputs: &AttnInputs<'_, '_>,
        tab: &DeviceView<'_, i32>,
        out: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        const K: &str = "attention_decode_batch";
        s.check(K)?;
        let n = s.n_tok;
        if n == 0 {
            return Ok(());
        }
        let hd = s.head_dim;
        let rows = n * s.n_head;
        check_len(K, "q", inputs.q.len(), rows * hd)?;
        check_len(K, "out", out.len(), rows * hd)?;
        check_len(K, "pos", inputs.pos.len(), n)?;
        check_len(K, "tab", tab.len(), n)?;
        if let Some(sk) = inputs.sinks {
            check_len(K, "sinks", sk.len(), s.n_head)?;
        }
        let keys = s.start + 1;
        check_len(K, "table", inputs.table.len(), keys.div_ceil(KV_PAGE))?;
        let f = inputs.format;
        f.check_pool(K, inputs.kpool.len(), s.kv_dim(), hd)?;
        check_len(K, "vpool", inputs.vpool.len(), inputs.kpool.len())?;
        if !inputs.q.is_aligned(16) {
            return Err(shape(K, "q must start at a multiple of 16 bytes".into()));
        }
        let one = AttnShape { n_tok: 1, ..*s };
        let group = s.n_head / s.n_head_kv;
        let Some(g) = attn_dec_group(&one) else {
            return Err(shape(K, format!("no decode kernel for {s:?}")));
        };
        // All of a KV head's query heads in one block (its K and V read once)
        // once the batch fills the GPU; else blocks of ATT_DEC_SHORT_HEADS,
        // as one sequence's short context.
        let sm = self.device().info().sm_count as usize;
        let heads = match n * s.n_head_kv >= sm {
            true => g,
            false => ATT_DEC_SHORT_HEADS.min(g),
        };
        let zparts = group.div_ceil(heads);
        let warps = keys.div_ceil(ATT_DEC_KEYS).clamp(1, ATT_DEC_MAX_WARPS);
        let plan = AttnPlan {
            tpb: 1,
            gw: 1,
            hparts: 1,
            split_len: keys.div_ceil(KV_PAGE) * KV_PAGE,
            splits: 1,
            tile: false,
            dec_warps: warps,
            dec_heads: heads,
        };
        let args = attn_scalars(s, &plan)?;
        let z = to_i32(K, "blocks", n * zparts)?;
        if z > 65535 {
            return Err(shape(
                K,
                format!("{n} tokens x {zparts} head parts: grid too large"),
            ));
        }
        let name = attn_dec_kernel(&one, heads, true, f).expect("attn_dec_group's shape");
        let kernel = self.kernel("attention", name)?;
        let zp = zparts as i32;
        let c = cfg(
            (s.n_head_kv as u32, 1, z as u32),
            32 * warps as u32,
            attn_dec_shared_bytes(hd, heads) as u32,
        );
        // SAFETY: attn_dec_b_f32_d<hd / 32>_g<heads> (push_attn's parameters,
        // then const int* tab, int zparts): block (g, 0, z) reads tab[z /
        // zparts] (n of them, checked), pos[z / zparts] (at most s.start, the
        // caller's promise), q row z / zparts (checked) and table entries
        // from tab[t] on for its keys (within `table`, the caller's
        // promise), pool rows of the pages they name; writes out row z /
        // zparts (checked); no splits, part_ml null. Shared memory:
        // attn_dec_shared_bytes (under 48 KB for hd <= 128, heads <= 8).
        unsafe {
            push_attn(stream.launch(&kernel), inputs, out, None, &args)
                .view(tab)
                .scalar(&zp)
                .run(c)?
        };
        Ok(())
    }
}

/// Attention's scalar parameters for `s` under `plan`.
fn attn_scalars(s: &AttnShape, plan: &AttnPlan) -> Result<AttnScalars> {
    const K: &str = "attention";
    let i = |name, v| to_i32(K, name, v);
    i("start", s.start)?;
    Ok(AttnScalars {
        ints: [
            i("n_tok", s.n_tok)?,
            i("n_head", s.n_head)?,
            i("n_head_kv", s.n_head_kv)?,
            i("head_dim", s.head_dim)?,
            plan.tpb as i32,
            plan.gw as i32,
            plan.hparts as i32,
            i("split_len", plan.split_len)?,
        ],
        scale_log2: std::f32::consts::LOG2_E
            * s.scores.scale.unwrap_or(1.0 / (s.head_dim as f32).sqrt()),
        window: i("window", s.scores.window)?,
        softcap_log2: std::f32::consts::LOG2_E * s.scores.softcap.max(0.0),
    })
}

/// What attention reads: the queries (n_tok, n_head, head_dim) FP32, RoPE
/// applied (and rotated as the keys were, for quantized pages), and one
/// sequence's pages of the KV pools: its block table and pos[0], its
/// first query's position (read on the device).
#[derive(Clone, Copy)]
pub struct AttnInputs<'x, 'v> {
    pub q: &'x DeviceView<'v, f32>,
    pub kpool: &'x DeviceView<'v, u16>,
    pub vpool: &'x DeviceView<'v, u16>,
    /// The pools' page format (over quantized pages the kernels turn
    /// their output back from the values' rotation).
    pub format: KvType,
    pub table: &'x DeviceView<'v, i32>,
    pub pos: &'x DeviceView<'v, i32>,
    /// Per query head a logit in the softmax's denominator with no value
    /// (gpt-oss's attention sinks; n_head of them).
    pub sinks: Option<&'x DeviceView<'v, f32>>,
}

/// Attention's scalar parameters: n_tok, n_head, n_head_kv, hd, tpb, gw,
/// hparts, split_len; scale_log2, window, softcap_log2.
struct AttnScalars {
    ints: [i32; 8],
    scale_log2: f32,
    window: i32,
    softcap_log2: f32,
}

/// The parameters of attn_f32_r<R> (kernels/attention.cu; attention.cuh's
/// `AttnArgs`, which decode.cu reads from memory, has the same fields): const float* q, const u16* kpool, const
/// u16* vpool, const int* table, float* out, float* part_ml, const int* pos,
/// const float* sinks, int n_tok, int n_head, int n_head_kv, int hd, int tpb, int gw, int
/// hparts, int split_len, float scale_log2, int window, float softcap_log2.
fn push_attn<'l, A: KernelArgs<'l>>(
    l: A,
    p: &'l AttnInputs<'_, '_>,
    out: &'l mut DeviceBuffer<f32>,
    part_ml: Option<&'l mut DeviceBuffer<f32>>,
    sc: &'l AttnScalars,
) -> A {
    let l = l
        .view(p.q)
        .view(p.kpool)
        .view(p.vpool)
        .view(p.table)
        .buf_mut(out);
    let l = match part_ml {
        Some(ml) => l.buf_mut(ml),
        None => l.null(),
    };
    let l = l.view(p.pos);
    let mut l = match p.sinks {
        Some(sk) => l.view(sk),
        None => l.null(),
    };
    for v in &sc.ints {
        l = l.scalar(v);
    }
    l.scalar(&sc.scale_log2)
        .scalar(&sc.window)
        .scalar(&sc.softcap_log2)
}

/// Attention's arguments (see [`push_attn`]), for [`Kernels::submit`].
struct AttnArgs<'r, 'x, 'v> {
    p: &'r AttnInputs<'x, 'v>,
    out: &'r mut DeviceBuffer<f32>,
    part_ml: Option<&'r mut DeviceBuffer<f32>>,
    sc: &'r AttnScalars,
}

impl OpArgs for AttnArgs<'_, '_, '_> {
    fn push<'l, A: KernelArgs<'l>>(&'l mut self, a: A) -> A {
        push_attn(a, self.p, self.out, self.part_ml.as_deref_mut(), self.sc)
    }
}

/// The split combine's arguments (see [`push_combine`]).
struct CombineArgs<'r, 's> {
    s: &'r AttnScratch<'s>,
    out: &'r mut DeviceBuffer<f32>,
    sinks: Option<&'r DeviceView<'r, f32>>,
    sc: &'r [i32; 3],
}

impl OpArgs for CombineArgs<'_, '_> {
    fn push<'l, A: KernelArgs<'l>>(&'l mut self, a: A) -> A {
        push_combine(a, self.s, self.out, self.sinks, self.sc)
    }
}

/// The parameters of attn_combine_f32 (kernels/attention.cu; decode.cu's
/// `DecCombine`): const float* part, const float* part_ml, float* out,
/// const float* sinks, int splits, int hd, int n_head (`sc`).
fn push_combine<'l, A: KernelArgs<'l>>(
    l: A,
    s: &'l AttnScratch<'_>,
    out: &'l mut DeviceBuffer<f32>,
    sinks: Option<&'l DeviceView<'l, f32>>,
    sc: &'l [i32; 3],
) -> A {
    let l = l.buf(s.part).buf(s.part_ml).buf_mut(out);
    let l = match sinks {
        Some(sk) => l.view(sk),
        None => l.null(),
    };
    l.scalar(&sc[0]).scalar(&sc[1]).scalar(&sc[2])
}

mod names;
use names::{attn_dec_kernel, attn_warp_kernel};

#[cfg(test)]
mod tests;
