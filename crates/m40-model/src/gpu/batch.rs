//! Batched decode steps: one token of each of several sequences through one
//! forward. The weight matmuls take all of the step's tokens together (the
//! packed GEMV of several tokens, or the GEMM), so the weights are read
//! once for the batch; RoPE with the KV append and attention take each
//! token at its own position over its own sequence's pages, in one launch
//! each per layer (`rope_kv_append_batch`, `attention_decode_batch`).
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
            if let Some(&t) = s.tokens.iter().find(|&&t| t as usize >= hp.n_vocab) {
                return Err(ModelError::BadToken {
                    id: t,
                    n_vocab: hp.n_vocab,
                });
            }
            if s.cache.len() + s.tokens.len() > s.cache.n_ctx() {
                return Err(ModelError::ContextFull {
                    needed: s.tokens.len(),
                    used: s.cache.len(),
                    n_ctx: s.cache.n_ctx(),
                });
            }
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
            let mut caches: Vec<&mut GpuCache> = seqs
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| group.contains(i))
                .map(|(_, s)| &mut *s.cache)
                .collect();
            let logits = self.decode_batch(&mut caches, &tokens)?;
            for (&i, l) in group.iter().zip(logits) {
                out[i] = StepOut::Logits(l);
            }
        }
        Ok(out)
    }

    /// One token of each of `caches` (checked by the caller: in the
    /// vocabulary, room in the context) through one forward; each one's
    /// logits. A selection is answered with the logits too (the sampler
    /// picks the same token from them).
    fn decode_batch(&self, caches: &mut [&mut GpuCache], tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        let hp = self.model.hparams();
        let n = tokens.len();
        let mut st = lock(&self.state);
        let State { work: w, pools, .. } = &mut *st;
        let before: Vec<usize> = caches.iter().map(|c| c.len()).collect();
        let tables: usize = caches
            .iter()
            .map(|c| (c.len() + 1).div_ceil(m40_kernels::KV_PAGE))
            .sum();
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
        self.upload_batch(w, tokens, &before, &pages)?;
        let max_start = *before.iter().max().expect("a batch");
        self.enqueue(w, pools, n, max_start, StepAttn::Batch, false)?;
        for (c, &p) in caches.iter_mut().zip(&before) {
            c.set_len(p + 1);
        }
        let n_vocab = hp.n_vocab;
        let mut out = Vec::with_capacity(n);
        let mut host = vec![0f32; LOGIT_ROWS.min(n) * n_vocab];
        for r0 in (0..n).step_by(LOGIT_ROWS) {
            let r1 = (r0 + LOGIT_ROWS).min(n);
            self.logits(w, r0..r1, Residual::Done)?;
            let rows = &mut host[..(r1 - r0) * n_vocab];
            self.stream
                .copy_to_host(&w.logits.slice(0..rows.len())?, rows)?;
            out.extend(rows.chunks_exact(n_vocab).map(<[f32]>::to_vec));
        }
        // Surface errors the kernels raised while running.
        self.stream.synchronize()?;
        Ok(out)
    }
}
