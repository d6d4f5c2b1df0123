//! The GPU backend as a stage of a model split over devices
//! (`crate::split`): the rows entering its layers uploaded into x in place
//! of the embedding, the rows leaving them read back from x where a later
//! stage computes the outputs.

use super::batch::joins;
use super::workspace::{Select, Workspace};
use super::{lock, GpuBackend, GpuCache, State};
use crate::batch::{SeqStep, StepOut, Want};
use crate::error::{ModelError, Result};
use crate::split::{check_rows, row_starts, Stage, StageOut};
use crate::{Logits, Selection, Span};

impl GpuBackend {
    /// The layers it runs.
    pub fn span(&self) -> &Span {
        &self.span
    }

    /// Whether `x` is what this stage takes for `n` rows (see
    /// `split::check_rows`).
    pub(super) fn check_rows(&self, x: Option<&[f32]>, n: usize) -> Result<()> {
        check_rows(&self.span, self.model.hparams().n_embd, x, n)
    }

    /// The rows entering this stage's layers into x (stream-ordered before
    /// the step's launches).
    pub(super) fn upload_rows(&self, w: &mut Workspace, x: &[f32]) -> Result<()> {
        Ok(self.stream.copy_to_device(x, &mut w.x)?)
    }

    /// The `n` rows leaving this stage's layers (x, every residual added)
    /// appended to `out`.
    pub(super) fn rows_out(
        &self,
        w: &mut Workspace,
        n: usize,
        out: Option<&mut Vec<f32>>,
    ) -> Result<()> {
        let d = self.model.hparams().n_embd;
        if let Some(out) = out {
            let at = out.len();
            out.resize(at + n * d, 0.0);
            self.stream
                .copy_to_host(&w.x.slice(0..n * d)?, &mut out[at..])?;
        }
        Ok(())
    }

    /// [`crate::Backend::forward_select`] with the rows `x` entering this
    /// stage's layers where it is a later stage.
    pub(super) fn select_rows(
        &self,
        st: &mut State,
        cache: &mut GpuCache,
        tokens: &[u32],
        sel: &Selection,
        x: Option<&[f32]>,
    ) -> Result<Vec<(u32, f32)>> {
        if tokens.is_empty() {
            return Err(ModelError::Unsupported("a selection without tokens".into()));
        }
        let args = self.selection_args(sel)?;
        let mut out = Vec::new();
        let select = Select {
            args: &args,
            k: sel.k,
            out: &mut out,
            mask: sel.mask.as_ref(),
        };
        self.run(st, cache, tokens, Logits::Last, None, Some(select), x)?;
        let (ids, bits) = out.split_at(sel.k);
        Ok(ids
            .iter()
            .zip(bits)
            .map(|(&i, &b)| (i as u32, f32::from_bits(b as u32)))
            .collect())
    }

    /// One sequence's step alone: what its `want` asks, or the rows
    /// leaving an earlier stage's layers (appended to `rows`).
    fn alone(
        &self,
        s: &mut SeqStep<'_, GpuCache>,
        x: Option<&[f32]>,
        rows: &mut Vec<f32>,
    ) -> Result<StepOut> {
        let mut st = lock(&self.state);
        if !self.span.last() {
            let (c, t) = (&mut *s.cache, s.tokens);
            self.run(&mut st, c, t, Logits::None, Some(rows), None, x)?;
            return Ok(StepOut::Nothing);
        }
        let mut out = Vec::new();
        let (c, t) = (&mut *s.cache, s.tokens);
        let logits = match &s.want {
            Want::Select(sel) => return Ok(StepOut::Top(self.select_rows(&mut st, c, t, sel, x)?)),
            Want::Nothing => Logits::None,
            Want::Logits => Logits::Last,
            Want::Hidden => Logits::Hidden,
        };
        self.run(&mut st, c, t, logits, Some(&mut out), None, x)?;
        Ok(match &s.want {
            Want::Nothing => StepOut::Nothing,
            Want::Hidden => StepOut::Hidden(out),
            _ => StepOut::Logits(out),
        })
    }

    /// A step of several sequences as [`crate::Backend::forward_batch`]
    /// runs it (the decode tokens and short prompt chunks of two or more
    /// in one batched forward, each other alone), with the rows `x`
    /// entering this stage's layers and, in an earlier stage, the rows
    /// leaving them into `rows_out` (a row per token, sequence after
    /// sequence, both).
    pub(super) fn batch_rows(
        &self,
        seqs: &mut [SeqStep<'_, GpuCache>],
        x: Option<&[f32]>,
        rows_out: Option<&mut Vec<f32>>,
    ) -> Result<Vec<StepOut>> {
        self.check_steps(seqs)?;
        let d = self.model.hparams().n_embd;
        let counts: Vec<usize> = seqs.iter().map(|s| s.tokens.len()).collect();
        let total: usize = counts.iter().sum();
        self.check_rows(x, total)?;
        let first = row_starts(counts.iter().copied());
        let x_of = |i: usize| x.map(|x| &x[first[i] * d..(first[i] + counts[i]) * d]);
        let mut rows = vec![0f32; if rows_out.is_some() { total * d } else { 0 }];
        let joined = joins(self, seqs)?;
        let mut out = vec![StepOut::Nothing; seqs.len()];
        for i in (0..seqs.len()).filter(|i| !joined.contains(i)) {
            let mut mine = Vec::new();
            out[i] = self.alone(&mut seqs[i], x_of(i), &mut mine)?;
            if !rows.is_empty() {
                rows[first[i] * d..(first[i] + counts[i]) * d].copy_from_slice(&mine);
            }
        }
        if !joined.is_empty() {
            let steps: Vec<(&[u32], Want)> = joined
                .iter()
                .map(|&i| (seqs[i].tokens, seqs[i].want.clone()))
                .collect();
            let xs: Option<Vec<f32>> = x.map(|_| {
                joined
                    .iter()
                    .flat_map(|&i| x_of(i).unwrap_or(&[]))
                    .copied()
                    .collect()
            });
            let mut caches: Vec<&mut GpuCache> = seqs
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| joined.contains(i))
                .map(|(_, s)| &mut *s.cache)
                .collect();
            let mut mine = Vec::new();
            let want_rows = (!rows.is_empty()).then_some(&mut mine);
            let outs = self.step_batch(&mut caches, &steps, xs.as_deref(), want_rows)?;
            let mut at = 0;
            for (&i, o) in joined.iter().zip(outs) {
                out[i] = o;
                if !rows.is_empty() {
                    let len = counts[i] * d;
                    rows[first[i] * d..first[i] * d + len].copy_from_slice(&mine[at..at + len]);
                    at += len;
                }
            }
        }
        if let Some(r) = rows_out {
            r.extend_from_slice(&rows);
        }
        Ok(out)
    }
}

impl Stage for GpuBackend {
    fn span(&self) -> &Span {
        &self.span
    }

    fn stage_forward(
        &self,
        cache: &mut GpuCache,
        tokens: &[u32],
        x: Option<&[f32]>,
        want: Logits,
    ) -> Result<Vec<f32>> {
        if self.encoder.is_some() {
            return Err(ModelError::Unsupported(
                "an encoder split over devices".into(),
            ));
        }
        let mut st = lock(&self.state);
        let mut out = Vec::new();
        self.run(&mut st, cache, tokens, want, Some(&mut out), None, x)?;
        Ok(out)
    }

    fn stage_select(
        &self,
        cache: &mut GpuCache,
        tokens: &[u32],
        x: Option<&[f32]>,
        sel: &Selection,
    ) -> Result<Vec<(u32, f32)>> {
        let mut st = lock(&self.state);
        self.select_rows(&mut st, cache, tokens, sel, x)
    }

    fn stage_batch(
        &self,
        seqs: &mut [SeqStep<'_, GpuCache>],
        x: Option<&[f32]>,
    ) -> Result<StageOut> {
        if self.encoder.is_some() {
            return Err(ModelError::Unsupported(
                "an encoder split over devices".into(),
            ));
        }
        if self.span.last() {
            return Ok(StageOut::Outs(self.batch_rows(seqs, x, None)?));
        }
        let mut rows = Vec::new();
        self.batch_rows(seqs, x, Some(&mut rows))?;
        Ok(StageOut::Rows(rows))
    }
}
