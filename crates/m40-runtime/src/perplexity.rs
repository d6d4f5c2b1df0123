//! Perplexity as llama.cpp's `llama-perplexity` measures it, or over every
//! position (the protocol of ../shared/testdata/smollm2's reference).
//!
//! Both cut the text's tokens into consecutive chunks of `ctx` tokens (the
//! tail that does not fill a chunk is dropped) and evaluate each chunk from
//! an empty KV cache. [`Scoring::SecondHalf`] is llama-perplexity's: the
//! tokens come with the BOS the model adds, each chunk's first token is
//! replaced by BOS (where the model adds one), and only the predictions
//! from positions ctx/2..ctx-2 are scored, so that every scored token has
//! at least ctx/2 tokens of context. [`Scoring::All`] scores positions
//! 0..ctx-2 of the chunk as the text has it.

use m40_model::{Backend, Logits};
use serde::Serialize;

/// Which positions of a chunk are scored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scoring {
    /// llama-perplexity's: the second half, each chunk led by BOS where
    /// the model adds one.
    SecondHalf,
    /// Every position, the chunk as it is.
    All,
}

impl Scoring {
    /// The first position whose prediction is scored in a chunk of `ctx`.
    pub fn first(self, ctx: usize) -> usize {
        match self {
            Scoring::SecondHalf => ctx / 2,
            Scoring::All => 0,
        }
    }

    /// Tokens a text needs for one chunk (llama-perplexity asks for two
    /// chunks' worth).
    pub fn min_tokens(self, ctx: usize) -> usize {
        match self {
            Scoring::SecondHalf => 2 * ctx,
            Scoring::All => ctx,
        }
    }
}

/// The result of a perplexity run.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct Perplexity {
    pub ppl: f64,
    /// llama-perplexity's "+/-": the standard error of the mean NLL times
    /// the perplexity.
    pub ppl_err: f64,
    pub mean_nll: f64,
    pub n_chunks: usize,
    pub scored_tokens: usize,
    pub scoring: Scoring,
    /// The running perplexity after each chunk (llama-perplexity's
    /// `[1]x,[2]y,...`).
    pub running: Vec<f64>,
    /// Per chunk, the most likely next token at each scored position.
    pub argmax: Vec<Vec<u32>>,
}

/// Run the protocol over `tokens` with chunks of `ctx`; `bos` replaces each
/// chunk's first token under [`Scoring::SecondHalf`] (pass the model's BOS
/// where its tokenizer adds one, else `None`). `progress` is called after
/// each chunk with (chunk, n_chunks, running ppl).
pub fn perplexity<B: Backend>(
    backend: &B,
    tokens: &[u32],
    ctx: usize,
    scoring: Scoring,
    bos: Option<u32>,
    mut progress: impl FnMut(usize, usize, f64),
) -> Result<Perplexity, m40_model::ModelError> {
    let n_vocab = backend.hparams().n_vocab;
    let n_chunks = if ctx >= 2 { tokens.len() / ctx } else { 0 };
    let first = scoring.first(ctx);
    let (mut nll_sum, mut nll2_sum) = (0f64, 0f64);
    let mut scored = 0usize;
    let mut argmax = Vec::with_capacity(n_chunks);
    let mut running = Vec::with_capacity(n_chunks);
    for c in 0..n_chunks {
        let mut chunk = tokens[c * ctx..(c + 1) * ctx].to_vec();
        if let (Scoring::SecondHalf, Some(b)) = (scoring, bos) {
            chunk[0] = b;
        }
        let mut cache = backend.new_cache(ctx)?;
        let logits = backend.forward(&mut cache, &chunk, Logits::All)?;
        let mut best = Vec::with_capacity(ctx - 1 - first);
        for pos in first..ctx - 1 {
            let row = &logits[pos * n_vocab..(pos + 1) * n_vocab];
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let lse =
                (row.iter().map(|&v| ((v - max) as f64).exp()).sum::<f64>()).ln() + max as f64;
            let nll = lse - row[chunk[pos + 1] as usize] as f64;
            nll_sum += nll;
            nll2_sum += nll * nll;
            scored += 1;
            let top = row
                .iter()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |b, (i, &v)| if v > b.1 { (i, v) } else { b },
                );
            best.push(top.0 as u32);
        }
        argmax.push(best);
        let ppl = (nll_sum / scored as f64).exp();
        running.push(ppl);
        progress(c + 1, n_chunks, ppl);
    }
    let mean_nll = if scored > 0 {
        nll_sum / scored as f64
    } else {
        f64::NAN
    };
    let ppl = mean_nll.exp();
    // llama-perplexity's uncertainty: sqrt(var / (n - 1)) of the NLLs.
    let var = nll2_sum / scored as f64 - mean_nll * mean_nll;
    let ppl_err = if var > 0.0 && scored > 1 {
        (var / (scored - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    Ok(Perplexity {
        ppl,
        ppl_err,
        mean_nll,
        n_chunks,
        scored_tokens: scored,
        scoring,
        running,
        argmax,
    })
}
