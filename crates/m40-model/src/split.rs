//! A model split over devices: its layers in consecutive spans
//! (`crate::Span`), each run by a backend of its own (a GPU, or the CPU)
//! with a KV pool for its layers only. A step runs through the stages in
//! turn: the first embeds the tokens, each hands the rows leaving its
//! layers (every token's residual stream, FP32) to the next, the last
//! computes the outputs. Every stage's pool has the same pages, so one
//! block table (the scheduler's) serves them all.

use crate::batch::{SeqStep, StepLimits, StepOut, Want};
use crate::error::{ModelError, Result};
use crate::{AnyBackend, AnyCache, Backend, KvLayout, KvState, Logits, MemoryUse, Selection, Span};
use m40_gguf::HyperParams;

/// What a stage's step gives: the rows leaving its layers (an earlier
/// stage), or each sequence's outputs (the last).
#[derive(Debug)]
pub enum StageOut {
    Rows(Vec<f32>),
    Outs(Vec<StepOut>),
}

/// A backend that runs a span of a model's layers. Rows go between stages
/// a row per token, sequence after sequence, each sequence's tokens in
/// order.
pub trait Stage: Backend {
    /// The layers it runs.
    fn span(&self) -> &Span;

    /// One sequence's `tokens` through this stage's layers, appended to its
    /// cache: `x`, the rows entering them (None in the first stage). An
    /// earlier stage gives the rows leaving them; the last what
    /// [`Backend::forward`] gives for `want`.
    fn stage_forward(
        &self,
        cache: &mut Self::Cache,
        tokens: &[u32],
        x: Option<&[f32]>,
        want: Logits,
    ) -> Result<Vec<f32>>;

    /// The last stage's [`Backend::forward_select`] (`x` as in
    /// [`Stage::stage_forward`]).
    fn stage_select(
        &self,
        _cache: &mut Self::Cache,
        _tokens: &[u32],
        _x: Option<&[f32]>,
        _sel: &Selection,
    ) -> Result<Vec<(u32, f32)>> {
        Err(ModelError::Unsupported(
            "token selection on this backend".into(),
        ))
    }

    /// A step of several sequences through this stage's layers (`x`: their
    /// rows, sequence after sequence): [`StageOut::Rows`] from an earlier
    /// stage, [`StageOut::Outs`] (what [`Backend::forward_batch`] gives)
    /// from the last.
    fn stage_batch(
        &self,
        seqs: &mut [SeqStep<'_, Self::Cache>],
        x: Option<&[f32]>,
    ) -> Result<StageOut>;
}

/// Where each of a step's sequences starts among its rows (sequence after
/// sequence), given their token counts.
pub(crate) fn row_starts(counts: impl IntoIterator<Item = usize>) -> Vec<usize> {
    counts
        .into_iter()
        .scan(0, |at, c| {
            *at += c;
            Some(*at - c)
        })
        .collect()
}

/// Whether `x` is what a stage of `span` takes for `n` rows of `d`: none in
/// the first stage, `n` rows in a later one.
pub(crate) fn check_rows(span: &Span, d: usize, x: Option<&[f32]>, n: usize) -> Result<()> {
    match (x, span.first()) {
        (None, true) => Ok(()),
        (Some(x), false) if x.len() == n * d => Ok(()),
        (Some(x), false) => Err(ModelError::Unsupported(format!(
            "{} values entering {} for {n} rows of {d}",
            x.len(),
            span.describe()
        ))),
        (None, false) => Err(ModelError::Unsupported(format!(
            "a step of {} without the rows entering them",
            span.describe()
        ))),
        (Some(_), true) => Err(ModelError::Unsupported(
            "rows entering the first stage (it embeds the tokens)".into(),
        )),
    }
}

/// A model split over several backends, each a [`Stage`] (see the module's
/// documentation).
pub struct Split {
    stages: Vec<AnyBackend>,
}

/// A sequence's cache in a [`Split`]: its cache in each stage, on the same
/// pages.
pub struct SplitCache {
    parts: Vec<AnyCache>,
}

impl KvState for SplitCache {
    fn len(&self) -> usize {
        self.parts[0].len()
    }
    fn n_ctx(&self) -> usize {
        self.parts[0].n_ctx()
    }
    fn truncate(&mut self, n: usize) {
        self.parts.iter_mut().for_each(|c| c.truncate(n));
    }
}

impl Split {
    /// The stages, in order: their spans must cover the model's layers one
    /// after another, their KV pools the same format and pages.
    pub fn new(stages: Vec<AnyBackend>) -> Result<Split> {
        let refuse = |why: String| Err(ModelError::Unsupported(format!("a split model: {why}")));
        let Some(first) = stages.first() else {
            return refuse("no stages".into());
        };
        let n_layer = first.hparams().n_layer;
        let mut next = 0;
        for s in &stages {
            let span = match s {
                AnyBackend::Split(_) => return refuse("a stage that is itself split".into()),
                s => s.stage_span()?,
            };
            if span.layers.start != next || span.n_layer != n_layer {
                return refuse(format!(
                    "{} follows layer {next} of {n_layer}",
                    span.describe()
                ));
            }
            next = span.layers.end;
            if s.kv_pool().0.format != first.kv_pool().0.format {
                return refuse("stages with KV caches of different formats".into());
            }
        }
        if next != n_layer {
            return refuse(format!("its stages end at layer {next} of {n_layer}"));
        }
        Ok(Split { stages })
    }

    pub fn stages(&self) -> &[AnyBackend] {
        &self.stages
    }

    fn last(&self) -> &AnyBackend {
        self.stages.last().expect("a split has stages")
    }

    /// `one` over each stage, the rows of one going into the next: the
    /// last's result. On an error, `caches` are truncated back to `before`
    /// (a forward appends all of its tokens or none).
    fn through<T>(
        &self,
        caches: &mut [&mut SplitCache],
        mut earlier: impl FnMut(
            &AnyBackend,
            usize,
            &mut [&mut SplitCache],
            Option<&[f32]>,
        ) -> Result<Vec<f32>>,
        last: impl FnOnce(&AnyBackend, usize, &mut [&mut SplitCache], Option<&[f32]>) -> Result<T>,
    ) -> Result<T> {
        let before: Vec<usize> = caches.iter().map(|c| c.len()).collect();
        let n = self.stages.len();
        let go = || -> Result<T> {
            let mut x: Option<Vec<f32>> = None;
            for (i, s) in self.stages[..n - 1].iter().enumerate() {
                x = Some(earlier(s, i, caches, x.as_deref())?);
            }
            last(self.last(), n - 1, caches, x.as_deref())
        };
        let r = go();
        if r.is_err() {
            for (c, &b) in caches.iter_mut().zip(&before) {
                c.truncate(b);
            }
        }
        r
    }
}

impl Backend for Split {
    type Cache = SplitCache;

    fn hparams(&self) -> &HyperParams {
        self.stages[0].hparams()
    }

    fn new_cache(&self, n_ctx: usize) -> Result<SplitCache> {
        let parts = self
            .stages
            .iter()
            .map(|s| s.new_cache(n_ctx))
            .collect::<Result<_>>()?;
        Ok(SplitCache { parts })
    }

    fn forward(&self, cache: &mut SplitCache, tokens: &[u32], want: Logits) -> Result<Vec<f32>> {
        let hp = self.hparams();
        crate::check_input(cache.len(), cache.n_ctx(), tokens, hp.n_vocab)?;
        self.through(
            &mut [cache],
            |s, i, c, x| s.stage_forward(&mut c[0].parts[i], tokens, x, want),
            |s, i, c, x| s.stage_forward(&mut c[0].parts[i], tokens, x, want),
        )
    }

    fn forward_select(
        &self,
        cache: &mut SplitCache,
        tokens: &[u32],
        sel: &Selection,
    ) -> Result<Vec<(u32, f32)>> {
        let hp = self.hparams();
        crate::check_input(cache.len(), cache.n_ctx(), tokens, hp.n_vocab)?;
        self.through(
            &mut [cache],
            |s, i, c, x| s.stage_forward(&mut c[0].parts[i], tokens, x, Logits::None),
            |s, i, c, x| s.stage_select(&mut c[0].parts[i], tokens, x, sel),
        )
    }

    fn forward_batch(&self, seqs: &mut [SeqStep<'_, SplitCache>]) -> Result<Vec<StepOut>> {
        let hp = self.hparams();
        for s in seqs.iter() {
            crate::check_input(s.cache.len(), s.cache.n_ctx(), s.tokens, hp.n_vocab)?;
        }
        let plan: Vec<(&[u32], Want)> = seqs.iter().map(|s| (s.tokens, s.want.clone())).collect();
        let mut caches: Vec<&mut SplitCache> = seqs.iter_mut().map(|s| &mut *s.cache).collect();
        let last = self.stages.len() - 1;
        let step = |s: &AnyBackend, i: usize, c: &mut [&mut SplitCache], x: Option<&[f32]>| {
            let mut steps: Vec<SeqStep<'_, AnyCache>> = c
                .iter_mut()
                .zip(&plan)
                .map(|(c, (tokens, want))| SeqStep {
                    cache: &mut c.parts[i],
                    tokens,
                    // An earlier stage gives rows whatever is wanted (and
                    // a CPU stage selects nothing).
                    want: match i == last {
                        true => want.clone(),
                        false => Want::Nothing,
                    },
                })
                .collect();
            s.stage_batch(&mut steps, x)
        };
        self.through(
            &mut caches,
            |s, i, c, x| match step(s, i, c, x)? {
                StageOut::Rows(r) => Ok(r),
                StageOut::Outs(_) => Err(ModelError::Unsupported(
                    "outputs from an earlier stage".into(),
                )),
            },
            |s, i, c, x| match step(s, i, c, x)? {
                StageOut::Outs(o) => Ok(o),
                StageOut::Rows(_) => {
                    Err(ModelError::Unsupported("rows from the last stage".into()))
                }
            },
        )
    }

    fn max_step(&self) -> usize {
        self.stages.iter().map(|s| s.max_step()).min().unwrap_or(1)
    }

    fn step_tokens(&self) -> usize {
        self.stages
            .iter()
            .map(|s| s.step_tokens())
            .min()
            .unwrap_or(1)
    }

    fn step_limits(&self) -> StepLimits {
        let l: Vec<StepLimits> = self.stages.iter().map(|s| s.step_limits()).collect();
        StepLimits {
            tokens: l.iter().map(|l| l.tokens).min().unwrap_or(1),
            seqs: l.iter().map(|l| l.seqs).min().unwrap_or(1),
        }
    }

    fn select_max_k(&self) -> usize {
        self.last().select_max_k()
    }

    /// The whole model's layout over the pages every stage has.
    fn kv_pool(&self) -> (KvLayout, usize) {
        let (layout, _) = self.stages[0].kv_pool();
        let pages = self.stages.iter().map(|s| s.kv_pool().1).min().unwrap_or(0);
        (layout.of_layers(self.hparams().n_layer), pages)
    }

    /// Every stage's memory together (`on_device` where any is on a GPU).
    fn memory(&self) -> MemoryUse {
        self.stages
            .iter()
            .map(|s| s.memory())
            .fold(MemoryUse::default(), |a, m| MemoryUse {
                weights: a.weights + m.weights,
                kv: a.kv + m.kv,
                workspace: a.workspace + m.workspace,
                on_device: a.on_device || m.on_device,
            })
    }

    fn cache_on(
        &self,
        pages: Vec<u32>,
        copy: Option<(u32, u32)>,
        len: usize,
        n_ctx: usize,
    ) -> Result<SplitCache> {
        let parts = self
            .stages
            .iter()
            .map(|s| s.cache_on(pages.clone(), copy, len, n_ctx))
            .collect::<Result<_>>()?;
        Ok(SplitCache { parts })
    }
}
