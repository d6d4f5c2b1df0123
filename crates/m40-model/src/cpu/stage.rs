//! The CPU backend as a stage of a model split over devices
//! (`crate::split`): `run` takes the rows entering its layers and, in an
//! earlier stage, gives back the rows leaving them.

use super::{CpuBackend, CpuCache};
use crate::batch::{SeqStep, StepOut, Want};
use crate::error::{ModelError, Result};
use crate::split::{Stage, StageOut};
use crate::{Logits, Span};

impl Stage for CpuBackend {
    fn span(&self) -> &Span {
        &self.span
    }

    fn stage_forward(
        &self,
        cache: &mut CpuCache,
        tokens: &[u32],
        x: Option<&[f32]>,
        want: Logits,
    ) -> Result<Vec<f32>> {
        let mut out = self.run(&mut [(cache, tokens, want)], x)?;
        Ok(out.pop().unwrap_or_default())
    }

    fn stage_batch(
        &self,
        seqs: &mut [SeqStep<'_, CpuCache>],
        x: Option<&[f32]>,
    ) -> Result<StageOut> {
        let mut runs = Vec::with_capacity(seqs.len());
        for s in seqs.iter_mut() {
            let want = match s.want {
                Want::Nothing => Logits::None,
                Want::Logits => Logits::Last,
                Want::Hidden => Logits::Hidden,
                Want::Select(_) => {
                    return Err(ModelError::Unsupported(
                        "token selection on this backend".into(),
                    ))
                }
            };
            runs.push((&mut *s.cache, s.tokens, want));
        }
        let out = self.run(&mut runs, x)?;
        if !self.span.last() {
            return Ok(StageOut::Rows(out.concat()));
        }
        Ok(StageOut::Outs(
            out.into_iter()
                .zip(seqs.iter())
                .map(|(l, s)| match s.want {
                    Want::Nothing => StepOut::Nothing,
                    Want::Hidden => StepOut::Hidden(l),
                    _ => StepOut::Logits(l),
                })
                .collect(),
        ))
    }
}
