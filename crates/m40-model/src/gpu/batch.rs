//! Batched decode steps: one token of each of several sequences through one
//! forward. The weight matmuls take all of the step's tokens together (the
//! packed GEMV of several tokens, or the GEMM), so the weights are read
//! once for the batch; RoPE with the KV append and attention take each
//! token at its own position over its own sequence's pages, in one launch
//! each per layer (`rope_kv_append_batch`, `attention_decode_batch`).
//!
//! Where the sequences ask for a selection, the rows' selections run in
//! one launch (`select_top_k_rows`) and only their candidates come back.
//!
//! Not bitwise the same as each sequence's own step: the one-token step
//! folds the norms and RoPE into its GEMVs, and splits long contexts'
//! keys. `GpuOptions::batch_decode` off runs each sequence alone instead.

use super::forward::{Residual, StepAttn};
use super::kv::GpuCache;
use super::workspace::LOGIT_ROWS;
use super::{lock, GpuBackend, State};
use crate::batch::{forward_each, SeqStep, StepOut, Want};
use crate::error::{ModelError, Result};
use crate::KvState;
use m40_kernels::{select_args, Penalties, SelectOut, SelectRows, KV_PAGE, SELECT_ARGS};

impl GpuBackend {
    /// Sequences one batched decode step takes at most.
    fn batch_cap(&self) -> usize {
        self.max_batch.min(LOGIT_ROWS)
    }

    /// Whether this backend batches decode steps: `batch_decode`, and a
    /// shape the batched attention takes (head dimension 64 or 128, at
    /// most 8 query heads per KV head).
    pub fn batches_decode(&self) -> bool {
        let hp = self.model.hparams();
        let group = hp.n_head / hp.n_head_kv.max(1);
        self.batch_decode && matches!(hp.head_dim, 64 | 128) && (1..=8).contains(&group)
    }

    /// [`crate::Backend::forward_batch`]: the sequences that decode one
    /// token (two or more) in batched steps, each other one alone.
    pub(super) fn forward_batch_gpu(
        &self,
        seqs: &mut [SeqStep<'_, GpuCache>],
    ) -> Result<Vec<StepOut>> {
        let hp = self.model.hparams();
        // Every sequence's input is checked before any runs.
        for s in seqs.iter() {
            crate::check_input(s.cache.len(), s.cache.n_ctx(), s.tokens, hp.n_vocab)?;
            if !s.cache.is_of(&self.pages) {
                return Err(ModelError::Unsupported(
                    "a KV cache of another GPU backend".into(),
                ));
            }
        }
        let decodes: Vec<usize> = (0..seqs.len())
            .filter(|&i| seqs[i].tokens.len() == 1 && seqs[i].want != Want::Nothing)
            .collect();
        if !self.batches_decode() || decodes.len() < 2 {
            return forward_each(self, seqs);
        }
        let mut out = vec![StepOut::Nothing; seqs.len()];
        for i in 0..seqs.len() {
            if !decodes.contains(&i) {
                out[i] = forward_each(self, &mut seqs[i..=i])?.remove(0);
            }
        }
        for group in decodes.chunks(self.batch_cap()) {
            let tokens: Vec<u32> = group.iter().map(|&i| seqs[i].tokens[0]).collect();
            let wants: Vec<Want> = group.iter().map(|&i| seqs[i].want.clone()).collect();
            let mut caches: Vec<&mut GpuCache> = seqs
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| group.contains(i))
                .map(|(_, s)| &mut *s.cache)
                .collect();
            let outs = self.decode_batch(&mut caches, &tokens, &wants)?;
            for (&i, o) in group.iter().zip(outs) {
                out[i] = o;
            }
        }
        Ok(out)
    }

    /// One token of each of `caches` (checked by the caller: in the
    /// vocabulary, room in the context) through one forward; each one's
    /// logits, or the selection its `Want` asks for (all the rows' in one
    /// launch, `select_top_k_rows`; its logits instead where the inputs
    /// have no room for the rows' penalties).
    fn decode_batch(
        &self,
        caches: &mut [&mut GpuCache],
        tokens: &[u32],
        wants: &[Want],
    ) -> Result<Vec<StepOut>> {
        let hp = self.model.hparams();
        let (n, n_vocab) = (tokens.len(), hp.n_vocab);
        debug_assert!(n <= LOGIT_ROWS && wants.len() == n);
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
        let select = stride > 0 && n * stride <= SELECT_ARGS + 2 * n_vocab;
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
        let State { work: w, pools, .. } = &mut *st;
        let before: Vec<usize> = caches.iter().map(|c| c.len()).collect();
        let tables: usize = caches.iter().map(|c| (c.len() + 1).div_ceil(KV_PAGE)).sum();
        if tables > self.pages.pages() {
            // Sequences sharing prefix pages can list more pages than the
            // pool has: the inputs have no room for their tables.
            return Err(ModelError::Unsupported(format!(
                "a batched step over {tables} block-table entries (the pool has {} pages)",
                self.pages.pages()
            )));
        }
        for c in caches.iter_mut() {
            if let Some((from, to)) = c.unshare_tail()? {
                pools.copy_page(&self.stream, from, to)?;
            }
            c.extend_to(c.len() + 1)?;
        }
        let pages: Vec<&[u32]> = caches.iter().map(|c| c.pages()).collect();
        self.upload_batch(w, tokens, &before, &pages, &sel)?;
        let max_start = *before.iter().max().expect("a batch");
        self.enqueue(w, pools, n, max_start, StepAttn::Batch, false)?;
        for (c, &p) in caches.iter_mut().zip(&before) {
            c.set_len(p + 1);
        }
        self.logits(w, 0..n, Residual::Done)?;
        let mut out = vec![StepOut::Nothing; n];
        // Rows that want their logits come to the host before any
        // selection penalizes its row in place.
        for (r, a) in args.iter().enumerate() {
            if !(select && a.is_some()) {
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
                rows: n,
                n_vocab,
                args_stride: stride,
                k_max,
            };
            let so = SelectOut {
                out: &mut w.sel_out,
                scratch: &mut w.sel_scratch,
            };
            let args_v = w.inputs.slice(at..at + n * stride)?;
            self.kernels
                .select_top_k_rows(&self.stream, &mut w.logits, &args_v, rows, so)?;
            let mut got = vec![0i32; n * 2 * k_max];
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
