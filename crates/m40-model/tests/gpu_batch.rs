//! Batched steps on the GPU (`Backend::forward_batch`): decode tokens of
//! many sequences in one forward against each sequence's CPU logits, and
//! with `batch_decode` off, bitwise each sequence's own forward. Every
//! test needs a GPU (ignored without one; run by the GPU pack).

mod gpu_common;

use std::sync::Arc;

use gpu_common::{argmax, rel_err, synth, tokens as ids};
use m40_device::testing::gpu_device;
use m40_gguf::GgmlType;
use m40_model::cpu::{CpuBackend, CpuCache, CpuMath};
use m40_model::gpu::{GpuBackend, GpuCache, GpuOptions};
use m40_model::{Backend, KvState, Logits, Model, Selection, SeqStep, StepOut, Want};

/// The relative error the GPU is allowed against the CPU.
const TOL: f64 = 1e-3;

fn gpu(model: &Arc<Model>, batch_decode: bool) -> GpuBackend {
    gpu_grouping(model, batch_decode, false)
}

/// [`gpu`] with a mixture's experts grouped on the device or not
/// (`GpuOptions::group_experts`).
fn gpu_grouping(model: &Arc<Model>, batch_decode: bool, group_experts: bool) -> GpuBackend {
    let opts = GpuOptions {
        kv_tokens: 8192,
        batch_decode,
        group_experts,
        ..Default::default()
    };
    GpuBackend::new(gpu_device("batched steps"), model.clone(), opts).unwrap()
}

/// The logits of each of `steps`.
fn logits(outs: Vec<StepOut>) -> Vec<Vec<f32>> {
    outs.into_iter()
        .map(|o| match o {
            StepOut::Logits(l) => l,
            other => panic!("logits expected, got {other:?}"),
        })
        .collect()
}

/// One batched step of `tokens[i]` on each of `caches`, every sequence's
/// logits.
fn batch_logits<T: AsRef<[u32]>>(
    g: &GpuBackend,
    caches: &mut [GpuCache],
    tokens: &[T],
) -> Vec<Vec<f32>> {
    let mut steps: Vec<SeqStep<'_, GpuCache>> = caches
        .iter_mut()
        .zip(tokens)
        .map(|(cache, t)| SeqStep {
            cache,
            tokens: t.as_ref(),
            want: Want::Logits,
        })
        .collect();
    logits(g.forward_batch(&mut steps).unwrap())
}

/// Sequences of different lengths (1 to 150 tokens of prompt, so some
/// cross pages and some share none) run their prompts in batched steps as
/// large as the backend's step limits allow (those of up to JOIN_CHUNK
/// tokens joined, the others alone), then
/// decode 4 tokens in batched steps of all of them; every sequence's
/// logits each step against its CPU logits, fed the same tokens. Batches
/// of 2 to 40 (the packed GEMV of a few tokens and the GEMM), twelve shapes
/// (3 and 2 query heads per KV head; qwen3's head norms; gemma's sliding
/// windows, soft-caps, post-norms and heads of 256; granite's multipliers; qwen3moe's
/// experts; mistral3's YaRN and temperature, per-token positions; phi3's
/// fused matrices and LongRoPE; gpt-oss's sinks, biases and MXFP4;
/// command-r's LayerNorm and parallel FFN); the mixtures with their experts
/// grouped on the device too (`group_experts`).
#[test]
#[ignore = "needs a GPU"]
fn batched_decode_matches_cpu() {
    let dir = tempfile::tempdir().unwrap();
    for (shape, ty) in [
        ("smollm2-135m", GgmlType::Q4_0),
        ("tiny", GgmlType::Q8_0),
        ("qwen3-tiny", GgmlType::Q4_0),
        ("gemma2-tiny", GgmlType::Q8_0),
        ("gemma3-tiny", GgmlType::Q4_0),
        ("gemma3-tiny-256", GgmlType::Q4_0),
        ("granite-tiny", GgmlType::Q4_0),
        ("qwen3moe-tiny", GgmlType::Q8_0),
        ("mistral3-tiny", GgmlType::Q4_0),
        ("phi3-tiny", GgmlType::Q8_0),
        ("gpt-oss-tiny", GgmlType::MXFP4),
        ("command-r-tiny", GgmlType::Q8_0),
    ] {
        let model = synth(dir.path(), shape, ty);
        // KV pages for the largest batch's 40 caches of 200 tokens.
        let cpu = CpuBackend::with_kv(model.clone(), CpuMath::Exact, 40 * 200).unwrap();
        // A mixture's steps with and without the experts grouped on the
        // device.
        let grouping: &[bool] = match model.hparams().moe {
            Some(_) => &[false, true],
            None => &[false],
        };
        for &group in grouping {
            let g = gpu_grouping(&model, true, group);
            let shape = format!("{shape} grouped {group}");
            assert!(g.batches_decode(), "{shape}: the batched path");
            let n_vocab = model.hparams().n_vocab;
            for b in [2usize, 5, 17, 40] {
                let mut cc: Vec<CpuCache> = Vec::new();
                let mut gc: Vec<GpuCache> = Vec::new();
                let mut next: Vec<u32> = Vec::new();
                let mut prompts = Vec::new();
                let mut first = Vec::new();
                for s in 0..b {
                    let prompt = ids(1 + (s * 37) % 150, n_vocab, (b * 100 + s) as u64);
                    let mut c = cpu.new_cache(200).unwrap();
                    let l = cpu.forward(&mut c, &prompt, Logits::Last).unwrap();
                    next.push(argmax(&l));
                    first.push(l);
                    cc.push(c);
                    gc.push(g.new_cache(200).unwrap());
                    prompts.push(prompt);
                }
                // The prompts in as few steps as the backend's limits allow
                // (one forward takes at most `step_limits()` rows and sequences).
                let limits = g.step_limits();
                let mut got = Vec::new();
                let mut start = 0;
                while start < b {
                    let mut end = start;
                    let mut rows = 0;
                    while end < b
                        && end - start < limits.seqs
                        && rows + prompts[end].len() <= limits.tokens
                    {
                        rows += prompts[end].len();
                        end += 1;
                    }
                    got.extend(batch_logits(&g, &mut gc[start..end], &prompts[start..end]));
                    start = end;
                }
                for s in 0..b {
                    let e = rel_err(&got[s], &first[s]);
                    assert!(
                        e <= TOL,
                        "{shape} {ty}: batch {b}, prompt of {} tokens: rel err {e:.2e}",
                        prompts[s].len()
                    );
                }
                for step in 0..4 {
                    let toks: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
                    let got = batch_logits(&g, &mut gc, &toks);
                    for s in 0..b {
                        let want = cpu.forward(&mut cc[s], &toks[s], Logits::Last).unwrap();
                        let e = rel_err(&got[s], &want);
                        assert!(
                            e <= TOL,
                            "{shape} {ty}: batch {b}, step {step}, sequence {s}: rel err {e:.2e}"
                        );
                        assert_eq!(gc[s].len(), cc[s].len());
                        next[s] = argmax(&want);
                    }
                }
            }
        }
    }
}

/// Rows past the GEMM's last full tile, through the GEMV from their first
/// token on: prompts of 129 to 144 tokens alone (past the small models'
/// GEMV range, 128: 2 large tiles and 1 to 16 rows; 150 none), and three
/// of 45 joined in one batched step (135 rows: 7 past two tiles), each
/// sequence's last logits against the CPU's, in four formats and FFN
/// kinds (SwiGLU stacks, gpt-oss's biases, command-r's parallel FFN).
#[test]
#[ignore = "needs a GPU"]
fn rows_past_the_last_tile_match_cpu() {
    let dir = tempfile::tempdir().unwrap();
    for (shape, ty) in [
        ("smollm2-135m", GgmlType::Q4_0),
        ("qwen3-tiny", GgmlType::Q4_K),
        ("gpt-oss-tiny", GgmlType::MXFP4),
        ("command-r-tiny", GgmlType::Q8_0),
    ] {
        let model = synth(dir.path(), shape, ty);
        let cpu = CpuBackend::with_kv(model.clone(), CpuMath::Exact, 4 * 200).unwrap();
        let g = gpu(&model, true);
        let n_vocab = model.hparams().n_vocab;
        let cases: [&[usize]; 5] = [&[129], &[136], &[144], &[150], &[45, 45, 45]];
        for (c, lens) in cases.iter().enumerate() {
            let prompts: Vec<Vec<u32>> = lens
                .iter()
                .enumerate()
                .map(|(i, &n)| ids(n, n_vocab, (c * 10 + i) as u64))
                .collect();
            let mut gc: Vec<GpuCache> = lens.iter().map(|_| g.new_cache(200).unwrap()).collect();
            let got = batch_logits(&g, &mut gc, &prompts);
            for (p, got) in prompts.iter().zip(&got) {
                let mut cc = cpu.new_cache(200).unwrap();
                let want = cpu.forward(&mut cc, p, Logits::Last).unwrap();
                let e = rel_err(got, &want);
                assert!(
                    e <= TOL,
                    "{shape} {ty}: prompts {lens:?}, the one of {}: rel err {e:.2e}",
                    p.len()
                );
            }
        }
    }
}

/// A step mixing decodes, short prompt chunks (one for its logits, one for
/// nothing: both join the batched forward) and a long one (alone) answers
/// each as asked, and the chunks' keys and values are in place for the
/// next token; with `batch_decode` off everything is bitwise each
/// sequence's own forward (batch invariance).
#[test]
#[ignore = "needs a GPU"]
fn mixed_steps_and_the_invariant_mode() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "smollm2-135m", GgmlType::Q4_0);
    let n_vocab = model.hparams().n_vocab;
    for batch_decode in [true, false] {
        let g = gpu(&model, batch_decode);
        let alone = gpu(&model, false);
        // 10 to 45 tokens, and 100 (over JOIN_CHUNK: alone).
        let prompts: Vec<Vec<u32>> = (0..7)
            .map(|s| ids(if s == 6 { 100 } else { 10 + 7 * s }, n_vocab, s as u64))
            .collect();
        let (mut caches, mut solo): (Vec<GpuCache>, Vec<GpuCache>) = (Vec::new(), Vec::new());
        for p in &prompts[..4] {
            let mut c = g.new_cache(300).unwrap();
            g.forward(&mut c, p, Logits::None).unwrap();
            caches.push(c);
            let mut c = alone.new_cache(300).unwrap();
            alone.forward(&mut c, p, Logits::None).unwrap();
            solo.push(c);
        }
        // Sequences 0-3 decode; 4 runs its prompt for its logits, 5 a
        // chunk for nothing, 6 a long prompt for its logits.
        for _ in 0..3 {
            caches.push(g.new_cache(300).unwrap());
        }
        let toks: Vec<Vec<u32>> = (0..7)
            .map(|s| {
                if s < 4 {
                    vec![(s * 11) as u32]
                } else {
                    prompts[s].clone()
                }
            })
            .collect();
        // 2 and 3 ask for a selection (greedy; the 5 best after penalties).
        let greedy = Selection::greedy();
        let top5 = Selection {
            k: 5,
            penalties: vec![(3, 2), (17, 1), (400, 5)],
            repeat: 1.3,
            frequency: 0.1,
            presence: 0.2,
            mask: None,
        };
        let wants = [
            Want::Logits,
            Want::Logits,
            Want::Select(greedy.clone()),
            Want::Select(top5.clone()),
            Want::Logits,
            Want::Nothing,
            Want::Logits,
        ];
        // The step runs twice from the same caches: its shape's kernels
        // launch one by one the first time, from the graph captured then
        // the second, to the same bits.
        let lens: Vec<usize> = caches.iter().map(|c| c.len()).collect();
        let mut runs = Vec::new();
        for _ in 0..2 {
            for (c, &n) in caches.iter_mut().zip(&lens) {
                c.truncate(n);
            }
            let mut steps: Vec<SeqStep<'_, GpuCache>> = caches
                .iter_mut()
                .zip(&toks)
                .zip(wants.clone())
                .map(|((cache, t), want)| SeqStep {
                    cache,
                    tokens: t,
                    want,
                })
                .collect();
            runs.push(g.forward_batch(&mut steps).unwrap());
        }
        assert_eq!(
            runs[0], runs[1],
            "the captured step differs from its launches"
        );
        let outs = runs.remove(1);
        assert_eq!(outs[5], StepOut::Nothing);
        for (s, c) in caches.iter().enumerate() {
            assert_eq!(
                c.len(),
                if s < 4 {
                    prompts[s].len() + 1
                } else {
                    prompts[s].len()
                }
            );
        }
        for (s, sel) in [(2, &greedy), (3, &top5)] {
            let StepOut::Top(got) = &outs[s] else {
                panic!("a selection expected, got {:?}", outs[s])
            };
            let want = alone.forward_select(&mut solo[s], &toks[s], sel).unwrap();
            assert_eq!(got.len(), sel.k);
            if batch_decode {
                // The k best values within the tolerance of the solo
                // step's; a candidate the solo step did not pick is a
                // near-tie with its k-th.
                let tol = |w: f32| 1e-3 * w.abs().max(1.0);
                for (g, w) in got.iter().zip(&want) {
                    assert!(
                        (g.1 - w.1).abs() <= tol(w.1),
                        "sequence {s}: {g:?} vs {w:?}"
                    );
                }
                let last = want[sel.k - 1].1;
                for g in got {
                    let picked = want.iter().any(|w| w.0 == g.0);
                    assert!(
                        picked || (g.1 - last).abs() <= tol(last),
                        "sequence {s}: {g:?}"
                    );
                }
            } else {
                assert_eq!(got, &want, "sequence {s}: not bitwise its own selection");
            }
        }
        for s in 0..2 {
            let StepOut::Logits(got) = &outs[s] else {
                panic!("logits expected")
            };
            let want = alone.forward(&mut solo[s], &toks[s], Logits::Last).unwrap();
            if batch_decode {
                let e = rel_err(got, &want);
                assert!(
                    e <= TOL,
                    "sequence {s}: rel err {e:.2e} against its own step"
                );
            } else {
                assert_eq!(got, &want, "sequence {s}: not bitwise its own step");
            }
        }
        // The prompts' logits: the joined chunk within the tolerance of
        // its own forward (bitwise with batch_decode off), the long one
        // bitwise (alone either way).
        for s in [4, 6] {
            let StepOut::Logits(got) = &outs[s] else {
                panic!("logits expected")
            };
            let mut c = alone.new_cache(300).unwrap();
            let want = alone.forward(&mut c, &prompts[s], Logits::Last).unwrap();
            if batch_decode && s == 4 {
                let e = rel_err(got, &want);
                assert!(
                    e <= TOL,
                    "prompt {s}: rel err {e:.2e} against its own forward"
                );
            } else {
                assert_eq!(got, &want, "prompt {s}: not bitwise its own forward");
            }
        }
        // The chunk that wanted nothing left its keys and values: its next
        // token's logits against a solo run of the same tokens.
        let next = [7u32];
        let got = g.forward(&mut caches[5], &next, Logits::Last).unwrap();
        let mut c = alone.new_cache(300).unwrap();
        alone.forward(&mut c, &prompts[5], Logits::None).unwrap();
        let want = alone.forward(&mut c, &next, Logits::Last).unwrap();
        if batch_decode {
            let e = rel_err(&got, &want);
            assert!(e <= TOL, "after a joined chunk: rel err {e:.2e}");
        } else {
            assert_eq!(got, want, "after a chunk alone: not bitwise");
        }
    }
}

/// A mixture's prefill groups its slots by expert (from `MOE_GROUP_ROWS`
/// slots an expert on average: one GEMM per chosen expert over the tokens
/// routed to it): qwen3moe-tiny (8 experts, 3 a token) with gate and up
/// interleaved (the SiLU pairs) and, with `fuse` off, apart; Mixtral (4,
/// 2) in Q8_0; gpt-oss-tiny (its biases). Every position of a 340-token
/// prompt (127 to 255 slots an expert), then 60 (15 to 30) and 31 more
/// tokens, against the CPU. With `group_experts` the device groups them:
/// grouped GEMMs in tiles of 64 (the first chunk) and 32 (the second:
/// from 16 an expert), the grouped GEMVs below.
#[test]
#[ignore = "needs a GPU"]
fn moe_prefill_grouped_by_expert_matches_cpu() {
    let dir = tempfile::tempdir().unwrap();
    for (shape, ty) in [
        ("qwen3moe-tiny", GgmlType::Q4_0),
        ("qwen3moe-tiny", GgmlType::F16),
        ("mixtral-tiny", GgmlType::Q8_0),
        ("gpt-oss-tiny", GgmlType::MXFP4),
    ] {
        let model = synth(dir.path(), shape, ty);
        let cpu = CpuBackend::new(model.clone()).unwrap();
        let n_vocab = model.hparams().n_vocab;
        let toks = ids(431, n_vocab, 5);
        let mut cc = cpu.new_cache(440).unwrap();
        let want = cpu.forward(&mut cc, &toks, Logits::All).unwrap();
        for (fuse, group_experts) in [(true, false), (false, false), (true, true), (false, true)] {
            let opts = GpuOptions {
                kv_tokens: 1024,
                fuse,
                group_experts,
                ..Default::default()
            };
            let g = GpuBackend::new(gpu_device("moe prefill"), model.clone(), opts).unwrap();
            let mut gc = g.new_cache(440).unwrap();
            let mut got = Vec::new();
            for chunk in [&toks[..340], &toks[340..400], &toks[400..]] {
                got.extend(g.forward(&mut gc, chunk, Logits::All).unwrap());
            }
            assert_eq!(got.len(), want.len());
            for (pos, (a, b)) in got.chunks(n_vocab).zip(want.chunks(n_vocab)).enumerate() {
                let e = rel_err(a, b);
                assert!(
                    e <= TOL,
                    "{shape} {ty:?} fuse {fuse} group {group_experts}, position {pos}: {e:.2e}"
                );
            }
        }
        println!("{shape} {ty:?}: 431 positions within {TOL}");
    }
}
