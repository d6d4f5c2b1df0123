//! Embeddings: each input's final hidden states (after the output norm
//! where the model has one), pooled as its GGUF's `pooling_type` says (mean
//! where it says nothing: any chat model, as Ollama allows), L2-normalized
//! as Ollama, llama.cpp's `llama-embedding` and OpenAI's API return them.
//! The inputs of a request run together in the engine's steps (64 short
//! texts in one step, beside whatever else runs).

use std::time::Instant;

use m40_gguf::hparams::Pooling;
use m40_tokenizer::Encode;

use crate::batcher::{SeqEvent, Submission};
use crate::cancel::CancelToken;
use crate::error::{EngineError, Result};
use crate::sampling::SamplingParams;
use crate::Engine;

/// One input to embed.
#[derive(Clone, Debug, PartialEq)]
pub enum EmbedInput {
    /// Text, tokenized as the model's vocabulary says (BERT's `[CLS]` and
    /// `[SEP]`, a BOS, qwen3-embedding's closing EOS); special tokens in it
    /// are not parsed.
    Text(String),
    /// Token ids, run as given (OpenAI's token arrays).
    Tokens(Vec<u32>),
}

/// What to embed and how.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbedRequest {
    pub inputs: Vec<EmbedInput>,
    /// An input longer than the model takes is cut to fit (its closing
    /// special token kept); else it is refused (Ollama's `truncate`).
    pub truncate: bool,
    /// Keep the first `dimensions` of each vector, normalized again
    /// (Matryoshka models; OpenAI's and Ollama's `dimensions`).
    pub dimensions: Option<usize>,
    /// Scale each vector to unit length (everything but Ollama's older
    /// `/api/embeddings`, which returns them as pooled).
    pub normalize: bool,
}

impl EmbedRequest {
    pub fn new(inputs: Vec<EmbedInput>) -> Self {
        Self {
            inputs,
            truncate: true,
            dimensions: None,
            normalize: true,
        }
    }
}

/// The vectors of a request's inputs, in its order.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Embeddings {
    pub vectors: Vec<Vec<f32>>,
    /// Each input's tokens as it ran (after any truncation).
    pub tokens: Vec<usize>,
    /// From the request's start to its last vector.
    pub total_ms: f64,
}

impl Embeddings {
    pub fn prompt_tokens(&self) -> usize {
        self.tokens.iter().sum()
    }
}

/// `v` scaled to unit length (left as it is when it is all zeros).
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
    }
}

/// One vector from a sequence's hidden states (`rows` of `d`).
pub fn pool(kind: Pooling, rows: &[f32], d: usize) -> Vec<f32> {
    let n = rows.len() / d;
    match kind {
        Pooling::Cls => rows[..d].to_vec(),
        Pooling::Last => rows[(n - 1) * d..].to_vec(),
        _ => {
            let mut sum = vec![0f64; d];
            for row in rows.chunks_exact(d) {
                sum.iter_mut().zip(row).for_each(|(s, &x)| *s += x as f64);
            }
            sum.into_iter().map(|s| (s / n as f64) as f32).collect()
        }
    }
}

impl Engine {
    /// How this model's embeddings pool: its file's `pooling_type`, mean
    /// where it has none (or says none: one vector per input is what the
    /// APIs return); a reranker's cannot be embeddings.
    pub fn pooling(&self) -> Result<Pooling> {
        match self.hparams().pooling {
            Some(Pooling::Rank) => Err(EngineError::NoEmbeddings(
                "it is a reranker (pooling_type rank), whose output is a score",
            )),
            Some(Pooling::None) | None => Ok(Pooling::Mean),
            Some(p) => Ok(p),
        }
    }

    /// The most tokens one input may have: the context, and for an encoder
    /// (whose input runs in one step) the step's tokens.
    pub fn max_embed_tokens(&self) -> usize {
        let step = self.activity().max_batch_tokens;
        if self.hparams().causal {
            self.n_ctx
        } else {
            self.n_ctx.min(step)
        }
    }

    /// Each input's token ids, cut or refused where too long.
    fn embed_tokens(&self, req: &EmbedRequest) -> Result<Vec<Vec<u32>>> {
        let tk = &self.core.tokenizer;
        let max = self.max_embed_tokens();
        // The special token a text ends with, kept last when one is cut.
        let closing = tk.closing_special();
        req.inputs
            .iter()
            .enumerate()
            .map(|(index, input)| {
                let (mut ids, close) = match input {
                    EmbedInput::Text(t) => {
                        let opts = Encode {
                            parse_special: false,
                            add_special: true,
                        };
                        (tk.encode(t, opts)?, closing)
                    }
                    EmbedInput::Tokens(ids) => {
                        tk.check(ids)?;
                        (ids.clone(), None)
                    }
                };
                if ids.is_empty() {
                    return Err(EngineError::EmptyPrompt);
                }
                if ids.len() > max {
                    if !req.truncate {
                        return Err(EngineError::InputTooLong {
                            index,
                            tokens: ids.len(),
                            max,
                        });
                    }
                    ids.truncate(max);
                    if let Some(c) = close {
                        ids[max - 1] = c;
                    }
                }
                Ok(ids)
            })
            .collect()
    }

    /// Embed `req`'s inputs: every one submitted at once, so that they run
    /// together in the engine's steps. ([`Engine::embed_start`] and
    /// [`EmbedRun::wait`].)
    pub fn embed(&self, req: &EmbedRequest, cancel: &CancelToken) -> Result<Embeddings> {
        self.embed_start(req, cancel)?.wait()
    }

    /// Check and tokenize `req`'s inputs and submit them all to the
    /// engine's steps; the returned [`EmbedRun`] gives their vectors
    /// (blocking, or awaited with the `stream` feature) and cancels them
    /// when dropped or when `cancel` fires.
    pub fn embed_start(&self, req: &EmbedRequest, cancel: &CancelToken) -> Result<EmbedRun> {
        let start = Instant::now();
        let pooling = self.pooling()?;
        let d = self.hparams().n_embd;
        if let Some(k) = req.dimensions {
            if k == 0 || k > d {
                return Err(EngineError::BadDimensions { asked: k, max: d });
            }
        }
        let inputs = self.embed_tokens(req)?;
        // The inputs' own token, under the caller's: the loop drops them
        // when either fires, and when the run is dropped.
        let stop = cancel.child();
        let (subs, rxs): (Vec<Submission>, Vec<flume::Receiver<SeqEvent>>) = inputs
            .iter()
            .map(|ids| {
                let (tx, rx) = flume::unbounded();
                let sub = Submission {
                    prompt: ids.clone(),
                    max_new: 1,
                    sampling: SamplingParams::default(),
                    logprobs: false,
                    logit_bias: Vec::new(),
                    ignore_eos: false,
                    constraint: None,
                    hidden: true,
                    shift: None,
                    cancel: stop.clone(),
                    events: tx,
                };
                (sub, rx)
            })
            .unzip();
        self.batcher.submit_all(subs);
        Ok(EmbedRun {
            rxs,
            tokens: inputs.iter().map(Vec::len).collect(),
            d,
            pooling,
            dimensions: req.dimensions,
            normalize: req.normalize,
            stop,
            start,
        })
    }
}

/// Embedding inputs running in the engine's steps
/// ([`Engine::embed_start`]); dropping it cancels them.
pub struct EmbedRun {
    rxs: Vec<flume::Receiver<SeqEvent>>,
    /// Each input's tokens.
    tokens: Vec<usize>,
    d: usize,
    pooling: Pooling,
    dimensions: Option<usize>,
    normalize: bool,
    stop: CancelToken,
    start: Instant,
}

impl Drop for EmbedRun {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl EmbedRun {
    /// Wait for every input's vector.
    pub fn wait(self) -> Result<Embeddings> {
        let mut all = Vec::with_capacity(self.rxs.len());
        for (i, rx) in self.rxs.iter().enumerate() {
            let mut rows = Vec::with_capacity(self.tokens[i] * self.d);
            while rows.len() < self.tokens[i] * self.d {
                self.take(rx.recv(), &mut rows)?;
            }
            all.push(rows);
        }
        Ok(self.vectors(all))
    }

    /// [`EmbedRun::wait`], awaited (the `stream` feature).
    #[cfg(feature = "stream")]
    pub async fn wait_async(self) -> Result<Embeddings> {
        let mut all = Vec::with_capacity(self.rxs.len());
        for (i, rx) in self.rxs.iter().enumerate() {
            let mut rows = Vec::with_capacity(self.tokens[i] * self.d);
            while rows.len() < self.tokens[i] * self.d {
                self.take(rx.recv_async().await, &mut rows)?;
            }
            all.push(rows);
        }
        Ok(self.vectors(all))
    }

    /// One event of an input: its hidden rows added, or why it ended.
    fn take(
        &self,
        ev: std::result::Result<SeqEvent, flume::RecvError>,
        rows: &mut Vec<f32>,
    ) -> Result<()> {
        if self.stop.is_cancelled() {
            return Err(EngineError::Cancelled);
        }
        match ev {
            Ok(SeqEvent::Hidden(r)) => rows.extend_from_slice(&r),
            Ok(SeqEvent::Failed(e)) => return Err(EngineError::Step(e)),
            Ok(SeqEvent::Stopped) => return Err(EngineError::Stopped),
            Ok(_) => {}
            Err(_) if self.stop.is_cancelled() => return Err(EngineError::Cancelled),
            Err(flume::RecvError::Disconnected) => {
                return Err(EngineError::Step(std::sync::Arc::new(
                    m40_model::ModelError::Unsupported(
                        "the step loop ended the embedding early".into(),
                    ),
                )))
            }
        }
        Ok(())
    }

    /// Each input's rows pooled, cut to the dimensions asked, normalized.
    fn vectors(&self, all: Vec<Vec<f32>>) -> Embeddings {
        let vectors = all
            .iter()
            .map(|rows| {
                let mut v = pool(self.pooling, rows, self.d);
                if let Some(k) = self.dimensions {
                    v.truncate(k);
                }
                if self.normalize {
                    normalize(&mut v);
                }
                v
            })
            .collect();
        Embeddings {
            vectors,
            tokens: self.tokens.clone(),
            total_ms: self.start.elapsed().as_secs_f64() * 1e3,
        }
    }
}
