//! Batched steps: the decode tokens and short prompt chunks of several
//! sequences through one forward, each token a row. The weight matmuls take
//! all of the step's rows together (the packed GEMV of several tokens, or
//! the GEMM), so the weights are read once for the batch; RoPE with the KV
//! append and attention take each row at its own position over its own
//! sequence's pages, in one launch each per layer (`rope_kv_append_batch`,
//! `attention_decode_batch`).
//!
//! Where the sequences ask for a selection, the rows' selections run in
//! one launch (`select_top_k_rows`) and only their candidates come back.
//!
//! Not bitwise the same as each sequence's own step: the one-token step
//! folds the norms and RoPE into its GEMVs, and splits long contexts'
//! keys; a prompt alone takes the prefill attention. With
//! `GpuOptions::batch_decode` off each sequence runs alone instead.

use super::forward::StepAttn;
use super::kv::GpuCache;
use super::residual::Residual;
use super::tuning::JOIN_CHUNK;
use super::workspace::{mask_words, LOGIT_ROWS};
use super::{lock, GpuBackend, State};
use crate::batch::{SeqStep, StepOut, Want};
use crate::error::{ModelError, Result};
use crate::KvState;
use m40_kernels::{
    attn_decodes, select_args, Penalties, SelectMasks, SelectOut, SelectRows, KV_PAGE, SELECT_ARGS,
};

/// The sequences of a step that run in one batched forward (checked: in
/// the vocabulary, room in the context): those of one to [`JOIN_CHUNK`]
/// tokens where there are two or more and the backend batches decode
/// steps; none otherwise (each runs alone). The scheduler plans within
/// `step_limits`, so nothing is regrouped here: more rows or sequences
/// than one forward takes are an error.
pub(super) fn joins(b: &GpuBackend, seqs: &[SeqStep<'_, GpuCache>]) -> Result<Vec<usize>> {
    let join = JOIN_CHUNK.min(b.max_batch);
    let joined: Vec<usize> = (0..seqs.len())
        .filter(|&i| (1..=join).contains(&seqs[i].tokens.len()))
        .collect();
    if !b.batches_decode() || joined.len() < 2 {
        return Ok(Vec::new());
    }
    let rows: usize = joined.iter().map(|&i| seqs[i].tokens.len()).sum();
    if rows > b.max_batch || joined.len() > LOGIT_ROWS {
        return Err(ModelError::Unsupported(format!(
            "a batched step of {rows} rows over {} sequences; one forward takes at most {} rows and {LOGIT_ROWS} sequences (Backend::step_limits)",
            joined.len(),
            b.max_batch
        )));
    }
    Ok(joined)
}

impl GpuBackend {
    /// Whether this backend batches decode steps: `batch_decode`, and a
    /// shape the batched attention takes (`attn_decodes`: head dimension
    /// 64 or 128 with at most 8 query heads per KV head, 256 with 2).
    pub fn batches_decode(&self) -> bool {
        let hp = self.model.hparams();
        let group = hp.n_head / hp.n_head_kv.max(1);
        self.batch_decode && attn_decodes(hp.head_dim, group)
    }

    /// Every sequence's input of a step, checked before any runs: ids in
    /// the vocabulary, room in its context, a cache of this backend.
    pub(super) fn check_steps(&self, seqs: &[SeqStep<'_, GpuCache>]) -> Result<()> {
        let hp = self.model.hparams();
        for s in seqs {
            crate::check_input(s.cache.len(), s.cache.n_ctx(), s.tokens, hp.n_vocab)?;
            if !s.cache.is_of(&self.pages) {
                return Err(ModelError::Unsupported(
                    "a KV cache of another GPU backend".into(),
                ));
            }
        }
        Ok(())
    }

    /// [`crate::Backend::forward_batch`]: the decode tokens and short
    /// prompt chunks ([`JOIN_CHUNK`]) of two or more sequences in one
    /// batched forward, each other sequence alone (before it).
    pub(super) fn forward_batch_gpu(
        &self,
        seqs: &mut [SeqStep<'_, GpuCache>],
    ) -> Result<Vec<StepOut>> {
        self.batch_rows(seqs, None, None)
    }

    /// The tokens of each of `caches` (`steps`: one to JOIN_CHUNK each,
    /// checked by the caller: in the vocabulary, room in the context)
    /// through one forward, each token a row at its own position; each
    /// sequence's logits after its last token, or the selection its `Want`
    /// asks for (all the rows' in one launch, `select_top_k_rows`; its
    /// logits instead where the inputs have no room for the rows'
    /// penalties). Rows: the sequences' last tokens, whose rows alone reach
    /// the output matmul, then every sequence's other tokens.
    /// A later stage's layers take the rows `x`, an earlier stage's give
    /// theirs to `rows_out` (and nothing else), each a row per token,
    /// sequence after sequence.
    pub(super) fn step_batch(
        &self,
        caches: &mut [&mut GpuCache],
        steps: &[(&[u32], Want)],
        x: Option<&[f32]>,
        rows_out: Option<&mut Vec<f32>>,
    ) -> Result<Vec<StepOut>> {
        let hp = self.model.hparams();
        let n_vocab = hp.n_vocab;
        let seqs = steps.len();
        debug_assert!(seqs <= LOGIT_ROWS && caches.len() == seqs);
        let wants: Vec<&Want> = steps.iter().map(|(_, w)| w).collect();
        // The rows' selection arguments, `stride` apart (a row that wants
        // logits selects its argmax, unused).
        let args: Vec<Option<Vec<i32>>> = wants
            .iter()
            .map(|w| match w {
                Want::Select(sel) => self.selection_args(sel).map(Some),
                _ => Ok(None),
            })
            .collect::<Result<_>>()?;
        let stride = args.iter().flatten().map(Vec::len).max().unwrap_or(0);
        let select = stride > 0 && seqs * stride <= SELECT_ARGS + 2 * n_vocab;
        let mut sel = Vec::new();
        if select {
            let plain = select_args(1, Penalties::NONE, &[]);
            for a in &args {
                let at = sel.len();
                sel.extend_from_slice(a.as_deref().unwrap_or(&plain));
                sel.resize(at + stride, 0);
            }
        }
        let mut st = lock(&self.state);
        let State {
            work: w,
            pools,
            graphs,
        } = &mut *st;
        let before: Vec<usize> = caches.iter().map(|c| c.len()).collect();
        let tables: usize = caches
            .iter()
            .zip(steps)
            .map(|(c, (t, _))| (c.len() + t.len()).div_ceil(KV_PAGE))
            .sum();
        if tables > self.pages.pages() {
            // Sequences sharing prefix pages can list more pages than the
            // pool has: the inputs have no room for their tables.
            return Err(ModelError::Unsupported(format!(
                "a batched step over {tables} block-table entries (the pool has {} pages)",
                self.pages.pages()
            )));
        }
        for (c, (t, _)) in caches.iter_mut().zip(steps) {
            if let Some((from, to)) = c.unshare_tail()? {
                pools.copy_page(&self.stream, from, to)?;
            }
            c.extend_to(c.len() + t.len())?;
        }
        // (sequence, token index) of each row: the sequences' last tokens,
        // whose rows alone reach the output matmul, then the leading ones.
        let last = steps.iter().enumerate().map(|(j, (t, _))| (j, t.len() - 1));
        let lead = steps
            .iter()
            .enumerate()
            .flat_map(|(j, (t, _))| (0..t.len() - 1).map(move |i| (j, i)));
        let rows: Vec<(usize, usize)> = last.chain(lead).collect();
        // A decode-only step (a row per sequence) replays a graph for its
        // row count and context bucket. A step with prompt rows launches
        // its kernels one by one: such steps are GPU-bound (replayed, a
        // SmolLM2 step of 31 decodes and an 8-token prompt took as long),
        // their mixes rarely repeat, and capturing one delayed the step
        // (and its new prompt's first token) by 2.5-3 ms (BENCHMARKS.md,
        // issue 33: the steady TTFT probe).
        let graphs_on = self.graphs.load(std::sync::atomic::Ordering::Relaxed);
        let ends = self.span.last();
        let graph = graphs_on
            && rows.len() == seqs
            && seqs <= self.max_batch
            && !wants.iter().any(|w| **w == Want::Hidden);
        let mut hidden: Vec<Option<Vec<f32>>> = vec![None; seqs];
        let n = rows.len();
        let tokens: Vec<u32> = rows.iter().map(|&(j, i)| steps[j].0[i]).collect();
        let pos: Vec<usize> = rows.iter().map(|&(j, i)| before[j] + i).collect();
        let of: Vec<usize> = rows.iter().map(|&(j, _)| j).collect();
        let pages: Vec<&[u32]> = caches.iter().map(|c| c.pages()).collect();
        self.upload_batch(w, &tokens, &pos, &pages, &of, &sel)?;
        // A row's place in `x` and `rows_out`: its sequence's first row,
        // then its token's.
        let first = crate::split::row_starts(steps.iter().map(|(t, _)| t.len()));
        let canon: Vec<usize> = rows.iter().map(|&(j, i)| first[j] + i).collect();
        if let Some(x) = x {
            self.check_rows(Some(x), n)?;
            let d = hp.n_embd;
            let mut mine = vec![0f32; n * d];
            for (r, &c) in canon.iter().enumerate() {
                mine[r * d..(r + 1) * d].copy_from_slice(&x[c * d..(c + 1) * d]);
            }
            self.upload_rows(w, &mine)?;
        }
        let max_start = *pos.iter().max().expect("a batch");
        if graph {
            self.batch_graph_step(w, pools, graphs, n, max_start)?;
        } else {
            self.enqueue(w, pools, n, max_start, StepAttn::Batch, false)?;
        }
        if !ends {
            for ((c, &p), (t, _)) in caches.iter_mut().zip(&before).zip(steps) {
                c.set_len(p + t.len());
            }
            let d = hp.n_embd;
            let mut mine = Vec::with_capacity(n * d);
            self.rows_out(w, n, Some(&mut mine))?;
            if let Some(out) = rows_out {
                let at = out.len();
                out.resize(at + n * d, 0.0);
                for (r, &c) in canon.iter().enumerate() {
                    out[at + c * d..at + (c + 1) * d].copy_from_slice(&mine[r * d..(r + 1) * d]);
                }
            }
            return Ok(vec![StepOut::Nothing; seqs]);
        }
        if !graph {
            if wants.iter().any(|w| **w == Want::Hidden) {
                // Every row's hidden state, before the logits' norm
                // overwrites them, back in each sequence's token order.
                let d = hp.n_embd;
                let mut all = Vec::with_capacity(n * d);
                self.hidden(w, n, &mut all)?;
                let mut each: Vec<Vec<f32>> =
                    steps.iter().map(|(t, _)| vec![0f32; t.len() * d]).collect();
                for (r, &(j, i)) in rows.iter().enumerate() {
                    each[j][i * d..(i + 1) * d].copy_from_slice(&all[r * d..(r + 1) * d]);
                }
                for (j, h) in each.into_iter().enumerate() {
                    if *wants[j] == Want::Hidden {
                        hidden[j] = Some(h);
                    }
                }
            }
            self.logits(w, 0..seqs, Residual::Done)?;
        }
        for ((c, &p), (t, _)) in caches.iter_mut().zip(&before).zip(steps) {
            c.set_len(p + t.len());
        }
        let mut out: Vec<StepOut> = hidden
            .into_iter()
            .map(|h| h.map_or(StepOut::Nothing, StepOut::Hidden))
            .collect();
        // Rows that want their logits come to the host before any
        // selection penalizes its row in place.
        for (r, a) in args.iter().enumerate() {
            if *wants[r] == Want::Logits || (!select && a.is_some()) {
                let mut row = vec![0f32; n_vocab];
                self.stream
                    .copy_to_host(&w.logits.slice(r * n_vocab..(r + 1) * n_vocab)?, &mut row)?;
                out[r] = StepOut::Logits(row);
            }
        }
        if select {
            let k_max = wants
                .iter()
                .map(|w| match w {
                    Want::Select(s) => s.k,
                    _ => 1,
                })
                .max()
                .unwrap_or(1);
            let at = self.sel_at();
            let rows = SelectRows {
                rows: seqs,
                n_vocab,
                args_stride: stride,
                k_max,
            };
            // The host computed the masks while the step ran.
            let slots: Vec<Option<&crate::MaskSlot>> = wants
                .iter()
                .map(|w| match w {
                    Want::Select(s) => s.mask.as_ref(),
                    _ => None,
                })
                .collect();
            self.upload_masks(w, &slots)?;
            let words = mask_words(n_vocab);
            let args_v = w.inputs.slice(at..at + seqs * stride)?;
            let mv = w.masks.slice(0..seqs * words)?;
            let masks = Some(SelectMasks { masks: &mv, words });
            let so = SelectOut {
                out: &mut w.sel_out,
                scratch: &mut w.sel_scratch,
            };
            self.kernels.select_top_k_rows(
                &self.stream,
                &mut w.logits,
                &args_v,
                rows,
                masks,
                so,
            )?;
            let mut got = vec![0i32; seqs * 2 * k_max];
            self.stream
                .copy_to_host(&w.sel_out.slice(0..got.len())?, &mut got)?;
            for (r, want) in wants.iter().enumerate() {
                if let Want::Select(s) = want {
                    let o = &got[r * 2 * k_max..];
                    let top = (0..s.k)
                        .map(|i| (o[i] as u32, f32::from_bits(o[s.k + i] as u32)))
                        .collect();
                    out[r] = StepOut::Top(top);
                }
            }
        }
        // Surface errors the kernels raised while running.
        self.stream.synchronize()?;
        Ok(out)
    }
}
