//! Perplexity exactly as llama.cpp's reference in ../shared/testdata measures
//! it: the text's tokens (no BOS) cut into consecutive chunks of `ctx` tokens
//! (the tail that does not fill a chunk is dropped), each chunk evaluated from
//! an empty KV cache, and at positions 0..ctx-2 the negative log-probability
//! of the next token summed.

use m40_model::{Backend, Logits};
use serde::Serialize;

/// The result of a perplexity run.
#[derive(Clone, Debug, Serialize)]
pub struct Perplexity {
    pub ppl: f64,
    pub mean_nll: f64,
    pub n_chunks: usize,
    pub scored_tokens: usize,
    /// Per chunk, the most likely next token at each scored position.
    pub argmax: Vec<Vec<u32>>,
}

/// Run the protocol over `tokens` with chunks of `ctx`; `progress` is called
/// after each chunk with (chunk, n_chunks, running ppl).
pub fn perplexity<B: Backend>(
    backend: &B,
    tokens: &[u32],
    ctx: usize,
    mut progress: impl FnMut(usize, usize, f64),
) -> Result<Perplexity, m40_model::ModelError> {
    let n_vocab = backend.hparams().n_vocab;
    let n_chunks = if ctx >= 2 { tokens.len() / ctx } else { 0 };
    let mut nll_sum = 0f64;
    let mut scored = 0usize;
    let mut argmax = Vec::with_capacity(n_chunks);
    for c in 0..n_chunks {
        let chunk = &tokens[c * ctx..(c + 1) * ctx];
        let mut cache = backend.new_cache(ctx)?;
        let logits = backend.forward(&mut cache, chunk, Logits::All)?;
        let mut best = Vec::with_capacity(ctx - 1);
        for pos in 0..ctx - 1 {
            let row = &logits[pos * n_vocab..(pos + 1) * n_vocab];
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let lse =
                (row.iter().map(|&v| ((v - max) as f64).exp()).sum::<f64>()).ln() + max as f64;
            nll_sum += lse - row[chunk[pos + 1] as usize] as f64;
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
        progress(c + 1, n_chunks, (nll_sum / scored as f64).exp());
    }
    let mean_nll = if scored > 0 {
        nll_sum / scored as f64
    } else {
        f64::NAN
    };
    Ok(Perplexity {
        ppl: mean_nll.exp(),
        mean_nll,
        n_chunks,
        scored_tokens: scored,
        argmax,
    })
}
