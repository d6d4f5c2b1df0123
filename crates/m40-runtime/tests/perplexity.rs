//! The perplexity protocols against a direct computation on a random tiny
//! model: llama-perplexity's (second half of each chunk, BOS at each
//! chunk's start) and the whole-chunk one.

use std::sync::Arc;

use m40_gguf::synth::{write_model, FileType, Shape, SynthOptions};
use m40_gguf::GgmlType;
use m40_model::cpu::CpuBackend;
use m40_model::{Backend, Logits, Model};
use m40_runtime::perplexity::{perplexity, Scoring};

fn tiny() -> (tempfile::TempDir, CpuBackend) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let opts = SynthOptions {
        shape: Shape::find("tiny").unwrap(),
        ty: FileType::All(GgmlType::Q8_0),
        seed: 5,
    };
    write_model(f, &opts, |_, _| {}).unwrap();
    let model = Arc::new(Model::open(&path).unwrap());
    (dir, CpuBackend::new(model).unwrap())
}

/// -log softmax(row)[target], in f64.
fn nll(row: &[f32], target: u32) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let lse = row
        .iter()
        .map(|&v| (v as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    lse - row[target as usize] as f64
}

#[test]
fn protocols_score_what_they_say() {
    let (_dir, cpu) = tiny();
    let n_vocab = cpu.hparams().n_vocab;
    let (ctx, bos) = (16usize, 1u32);
    // 3 chunks and a tail that is dropped.
    let tokens: Vec<u32> = (0..3 * ctx + 5)
        .map(|i| 3 + ((i * 37 + 11) % (n_vocab - 3)) as u32)
        .collect();
    let direct = |scoring: Scoring, lead: Option<u32>| -> (f64, usize) {
        let (mut sum, mut n) = (0f64, 0usize);
        for c in 0..3 {
            let mut chunk = tokens[c * ctx..(c + 1) * ctx].to_vec();
            if let Some(b) = lead {
                chunk[0] = b;
            }
            let mut cache = cpu.new_cache(ctx).unwrap();
            let logits = cpu.forward(&mut cache, &chunk, Logits::All).unwrap();
            for pos in scoring.first(ctx)..ctx - 1 {
                sum += nll(&logits[pos * n_vocab..][..n_vocab], chunk[pos + 1]);
                n += 1;
            }
        }
        (sum / n as f64, n)
    };
    for (scoring, lead) in [
        (Scoring::SecondHalf, Some(bos)),
        (Scoring::SecondHalf, None),
        (Scoring::All, None),
    ] {
        let r = perplexity(&cpu, &tokens, ctx, scoring, lead, |_, _, _| {}).unwrap();
        let (mean, n) = direct(scoring, lead);
        assert_eq!(r.n_chunks, 3);
        assert_eq!(r.scored_tokens, n, "{scoring:?}");
        assert_eq!(r.argmax.iter().map(Vec::len).sum::<usize>(), n);
        assert!(
            (r.mean_nll - mean).abs() < 1e-9,
            "{scoring:?}: {} vs {mean}",
            r.mean_nll
        );
        assert!((r.ppl - mean.exp()).abs() < 1e-9 * r.ppl);
        assert!((r.running[2] - r.ppl).abs() < 1e-12);
        assert!(r.ppl_err > 0.0 && r.ppl_err < r.ppl);
    }
    // BOS is only put in by the llama-perplexity protocol.
    let with = perplexity(&cpu, &tokens, ctx, Scoring::All, Some(bos), |_, _, _| {}).unwrap();
    let without = perplexity(&cpu, &tokens, ctx, Scoring::All, None, |_, _, _| {}).unwrap();
    assert_eq!(with.mean_nll, without.mean_nll);
    // Second half: 16 - 8 - 1 = 7 a chunk.
    let r = perplexity(&cpu, &tokens, ctx, Scoring::SecondHalf, None, |_, _, _| {}).unwrap();
    assert_eq!(r.scored_tokens, 3 * 7);
}
