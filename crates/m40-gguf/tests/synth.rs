//! Synthetic models: they open, pass the hyperparameter/tensor check,
//! dequantize, are deterministic, and keep activations O(1) through every layer.

use m40_gguf::hparams::{LayerNames, OUTPUT, OUTPUT_NORM, TOKEN_EMBD};
use m40_gguf::synth::{write_model, FileType, Shape, SynthOptions};
use m40_gguf::{GgmlType, GgufFile, HyperParams};

fn synth(shape: &str, ty: GgmlType, seed: u64) -> Vec<u8> {
    let shape = Shape::find(shape).unwrap();
    write_model(
        Vec::new(),
        &SynthOptions {
            shape,
            ty: ty.into(),
            seed,
        },
        |_, _| {},
    )
    .unwrap()
}

fn matvec(f: &GgufFile, name: &str, x: &[f32]) -> Vec<f32> {
    let t = f.tensor(name).unwrap();
    assert_eq!(t.info.row_len(), x.len(), "{name}");
    let mut row = vec![0f32; x.len()];
    (0..t.info.n_rows())
        .map(|r| {
            m40_gguf::quant::dequantize(t.info.ty, t.row(r), &mut row).unwrap();
            row.iter().zip(x).map(|(a, b)| a * b).sum()
        })
        .collect()
}

fn rmsnorm(f: &GgufFile, name: &str, x: &[f32], eps: f32) -> Vec<f32> {
    let w = f.tensor(name).unwrap().to_f32().unwrap();
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let s = 1.0 / (ms + eps).sqrt();
    x.iter().zip(&w).map(|(v, w)| v * s * w).collect()
}

fn rms(x: &[f32]) -> f32 {
    (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt()
}

/// A one-token forward pass (at position 0 attention returns V, so RoPE and
/// softmax drop out) that records the residual stream's RMS after each layer.
fn forward_one_token(f: &GgufFile, token: usize) -> (Vec<f32>, Vec<f32>) {
    let hp = HyperParams::from_file(f).unwrap();
    let embd = f.tensor(TOKEN_EMBD).unwrap();
    let mut x = vec![0f32; hp.n_embd];
    m40_gguf::quant::dequantize(embd.info.ty, embd.row(token), &mut x).unwrap();
    let mut rms_per_layer = vec![rms(&x)];
    let group = hp.n_head / hp.n_head_kv;
    for l in 0..hp.n_layer {
        let n = LayerNames::new(l);
        let h = rmsnorm(f, &n.attn_norm, &x, hp.rms_eps);
        let v = matvec(f, &n.wv, &h);
        let attn: Vec<f32> = (0..hp.n_head * hp.head_dim)
            .map(|i| v[(i / hp.head_dim / group) * hp.head_dim + i % hp.head_dim])
            .collect();
        for (xi, o) in x.iter_mut().zip(matvec(f, &n.wo, &attn)) {
            *xi += o;
        }
        let h = rmsnorm(f, &n.ffn_norm, &x, hp.rms_eps);
        let g = matvec(f, &n.ffn_gate, &h);
        let u = matvec(f, &n.ffn_up, &h);
        let a: Vec<f32> = g
            .iter()
            .zip(&u)
            .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
            .collect();
        for (xi, o) in x.iter_mut().zip(matvec(f, &n.ffn_down, &a)) {
            *xi += o;
        }
        rms_per_layer.push(rms(&x));
    }
    let h = rmsnorm(f, OUTPUT_NORM, &x, hp.rms_eps);
    let out = if hp.tied_output { TOKEN_EMBD } else { OUTPUT };
    (rms_per_layer, matvec(f, out, &h))
}

#[test]
fn tiny_models_of_every_writable_type_open_and_dequantize() {
    for &ty in GgmlType::QUANTIZABLE {
        let f = GgufFile::from_bytes(synth("tiny", ty, 1)).unwrap();
        let hp = HyperParams::from_file(&f).unwrap();
        assert_eq!(
            (hp.n_layer, hp.n_embd, hp.n_vocab, hp.tied_output),
            (2, 256, 512, false)
        );
        for info in f.tensors() {
            let want = if info.shape.len() == 1 {
                GgmlType::F32
            } else {
                ty
            };
            assert_eq!(info.ty, want, "{}", info.name);
            let v = f.view(info).to_f32().unwrap();
            assert!(v.iter().all(|x| x.is_finite()), "{ty} {}", info.name);
            assert!(rms(&v) > 0.0, "{ty} {} is all zeros", info.name);
        }
        // Embedding rows have the standard deviation they were drawn with.
        let e = f.tensor(TOKEN_EMBD).unwrap().to_f32().unwrap();
        let want = 256f32.powf(-0.25);
        assert!(
            (rms(&e) / want - 1.0).abs() < 0.05,
            "{ty}: embedding rms {} vs {want}",
            rms(&e)
        );
        assert!(
            f.metadata()
                .opt_str_array("tokenizer.ggml.tokens")
                .unwrap()
                .unwrap()
                .len()
                == 512
        );
    }
}

#[test]
fn same_seed_same_file_other_seed_other_weights() {
    let a = synth("tiny", GgmlType::Q4_0, 7);
    assert_eq!(a, synth("tiny", GgmlType::Q4_0, 7));
    assert_ne!(a, synth("tiny", GgmlType::Q4_0, 8));
}

#[test]
fn activations_stay_order_one_through_every_layer() {
    for (shape, ty) in [
        ("tiny", GgmlType::F16),
        ("smollm2-135m", GgmlType::Q4_0),
        ("smollm2-135m", GgmlType::Q8_0),
    ] {
        let f = GgufFile::from_bytes(synth(shape, ty, 3)).unwrap();
        for token in [0, 3, 300] {
            let (per_layer, logits) = forward_one_token(&f, token);
            eprintln!(
                "{shape} {ty} token {token}: residual rms {:?}, logits rms {}",
                per_layer
                    .iter()
                    .map(|r| (r * 100.0).round() / 100.0)
                    .collect::<Vec<_>>(),
                rms(&logits)
            );
            for (l, r) in per_layer.iter().enumerate() {
                assert!(
                    r.is_finite() && *r > 1e-2 && *r < 10.0,
                    "{shape} {ty} token {token}: residual rms {r} after layer {l}"
                );
            }
            assert!(logits.iter().all(|v| v.is_finite()));
            let s = rms(&logits);
            assert!(s > 0.1 && s < 30.0, "{shape} {ty}: logits rms {s}");
        }
    }
}

#[test]
fn unwritable_types_are_refused() {
    let shape = Shape::find("tiny").unwrap();
    let e = write_model(
        Vec::new(),
        &SynthOptions {
            shape,
            ty: GgmlType::IQ4_XS.into(),
            seed: 0,
        },
        |_, _| {},
    )
    .unwrap_err();
    assert!(e.to_string().contains("IQ4_XS"), "{e}");
}

#[test]
fn q4_k_m_mixes_q4_k_and_q6_k_as_llama_quantize_does() {
    let shape = Shape::find("tiny").unwrap();
    let bytes = write_model(
        Vec::new(),
        &SynthOptions {
            shape,
            ty: FileType::Q4KM,
            seed: 3,
        },
        |_, _| {},
    )
    .unwrap();
    let f = GgufFile::from_bytes(bytes).unwrap();
    // Two layers: the last eighth is layer 1, so its attn_v and ffn_down get
    // Q6_K; so does the output matrix.
    let six = [
        "blk.1.attn_v.weight",
        "blk.1.ffn_down.weight",
        "output.weight",
    ];
    for info in f.tensors() {
        let want = if info.shape.len() == 1 {
            GgmlType::F32
        } else if six.contains(&info.name.as_str()) {
            GgmlType::Q6_K
        } else {
            GgmlType::Q4_K
        };
        assert_eq!(info.ty, want, "{}", info.name);
        let v = f.view(info).to_f32().unwrap();
        assert!(rms(&v) > 0.0, "{}", info.name);
    }
    assert_eq!(f.metadata().u64("general.file_type").unwrap(), 15);
    assert_eq!(FileType::parse("q4_k_m"), Some(FileType::Q4KM));
    assert_eq!(FileType::parse("Q6_K"), Some(FileType::All(GgmlType::Q6_K)));
    assert_eq!(FileType::parse("IQ4_XS"), None);
}

/// gemma's hyperparameters as llama.cpp reads them: the synthetic shapes'
/// windows and patterns; gemma2's defaults where its keys are missing
/// (window 4096, every other layer, caps 50 and 30); a pattern given as
/// per-layer flags; gemma3 without a window; a flag array of the wrong
/// length is an error that names the key.
#[test]
fn gemma_windows_caps_and_scales_read_as_llama_cpp_does() {
    use m40_gguf::hparams::{Activation, Arch};
    use m40_gguf::synth::{metadata, FileType, Shape};
    use m40_gguf::{Array, Value};
    let md = |shape: &str| metadata(Shape::find(shape).unwrap(), FileType::All(GgmlType::F32));
    let hp = HyperParams::from_metadata(&md("gemma3-tiny")).unwrap();
    assert_eq!(hp.arch, Arch::Gemma3);
    let w = hp.sliding_window.as_ref().unwrap();
    assert_eq!(
        (w.window, w.rope_freq_base, w.rope_linear),
        (5, 10000.0, 1.0)
    );
    // Period 3 over 3 layers: two window layers, then a global one.
    assert_eq!(w.layers, [true, true, false]);
    assert_eq!(hp.act, Activation::GeluTanh);
    assert!(hp.post_norms && hp.qk_norm);
    assert_eq!((hp.attn_softcap, hp.final_softcap), (None, None));
    assert_eq!(hp.embd_scale, 128f32.sqrt());
    assert_eq!(hp.attn_scale, 1.0 / 8.0);

    let mut g2 = md("gemma2-tiny");
    let hp = HyperParams::from_metadata(&g2).unwrap();
    assert_eq!((hp.attn_softcap, hp.final_softcap), (Some(1.5), Some(30.0)));
    assert!(!hp.qk_norm && hp.is_swa(0) && !hp.is_swa(1));
    // Without its keys, gemma2 takes llama.cpp's defaults.
    let mut bare = m40_gguf::Metadata::new();
    for (k, v) in g2.iter() {
        if !k.contains("sliding_window") && !k.contains("softcapping") {
            bare.insert(k, v.clone());
        }
    }
    let hp = HyperParams::from_metadata(&bare).unwrap();
    let w = hp.sliding_window.as_ref().unwrap();
    assert_eq!((w.window, w.layers.as_slice()), (4096, &[true, false][..]));
    assert_eq!(
        (hp.attn_softcap, hp.final_softcap),
        (Some(50.0), Some(30.0))
    );
    // Flags, layer by layer.
    let key = "gemma2.attention.sliding_window_pattern";
    g2.insert(key, Value::Array(Array::Bool(vec![false, true])));
    let hp = HyperParams::from_metadata(&g2).unwrap();
    assert!(!hp.is_swa(0) && hp.is_swa(1));
    g2.insert(key, Value::Array(Array::Bool(vec![true])));
    let e = HyperParams::from_metadata(&g2).unwrap_err().to_string();
    assert!(e.contains(key) && e.contains("1 flags for 2 layers"), "{e}");
    // gemma3 with a window of 0: none.
    let mut g3 = md("gemma3-tiny");
    g3.insert("gemma3.attention.sliding_window", Value::U32(0));
    assert!(HyperParams::from_metadata(&g3)
        .unwrap()
        .sliding_window
        .is_none());
}

/// granite's multipliers as llama.cpp reads them; its logit scale is
/// required.
#[test]
fn granite_multipliers_are_read_and_the_logit_scale_is_required() {
    use m40_gguf::synth::{metadata, FileType, Shape};
    let md = metadata(
        Shape::find("granite-tiny").unwrap(),
        FileType::All(GgmlType::F32),
    );
    let hp = HyperParams::from_metadata(&md).unwrap();
    assert_eq!(
        (
            hp.embd_scale,
            hp.attn_scale,
            hp.residual_scale,
            hp.logit_scale
        ),
        (12.0, 1.0 / 64.0, 0.22, 1.0 / 8.0)
    );
    assert!(hp.residual_transformed() && !hp.post_norms);
    let mut bare = m40_gguf::Metadata::new();
    for (k, v) in md.iter().filter(|(k, _)| *k != "granite.logit_scale") {
        bare.insert(k, v.clone());
    }
    let e = HyperParams::from_metadata(&bare).unwrap_err().to_string();
    assert!(e.contains("granite.logit_scale"), "{e}");
}

/// YaRN and mistral3's temperature as llama.cpp reads them: mistral3 reads
/// the betas and the log multiplier, other architectures take llama.cpp's
/// defaults; the magnitude scale (llama.cpp prints 1.1218 for this file's
/// `yarn_attn_factor`) goes into the score scale squared; the temperature
/// starts at the original context.
#[test]
fn yarn_and_the_attention_temperature_read_as_llama_cpp_does() {
    use m40_gguf::hparams::{AttnTemperature, RopeScaling};
    use m40_gguf::synth::{metadata, FileType, Shape};
    use m40_gguf::Value;
    let md = metadata(
        Shape::find("mistral3-tiny").unwrap(),
        FileType::All(GgmlType::F32),
    );
    let hp = HyperParams::from_metadata(&md).unwrap();
    assert_eq!(
        hp.rope_scaling,
        RopeScaling::Yarn {
            factor: 16.0,
            original_context: 8,
            beta_fast: 4.0,
            beta_slow: 0.75,
            log_mul: 0.5
        }
    );
    let m = hp.rope_mscale();
    assert!((m - 1.1218).abs() < 1e-4, "{m}");
    assert_eq!(hp.attn_scale, 1.0 / 8.0);
    assert_eq!(hp.max_context(), 512);
    let t = hp.attn_temp.unwrap();
    assert_eq!(
        t,
        AttnTemperature {
            scale: 0.3,
            floor: 8
        }
    );
    assert_eq!((t.at(0), t.at(7)), (1.0, 1.0));
    assert!((t.at(8) - (1.0 + 0.3 * 2f32.ln())).abs() < 1e-7);
    // The ramp: extrapolated (1) below pair 0, interpolated (0) from pair
    // 25 (corr dims 0 and ceil(64 ln(8 / (0.75 2 pi)) / (2 ln 2)) = 25).
    let ramp = hp.rope_scaling.yarn_ramp(64, 2.0).unwrap();
    assert_eq!(ramp.len(), 32);
    assert_eq!((ramp[0], ramp[25], ramp[31]), (1.0, 0.0, 0.0));
    assert!((ramp[5] - (1.0 - 5.0 / 25.0)).abs() < 1e-6);

    // The same keys in a qwen3 file: betas and multiplier ignored (32, 1,
    // none), so its scale is 1 + 0.1 ln 16; no temperature.
    let mut q = m40_gguf::Metadata::new();
    for (k, v) in md.iter() {
        q.insert(k.replace("mistral3.", "qwen3."), v.clone());
    }
    q.insert("general.architecture", Value::String("qwen3".into()));
    let hq = HyperParams::from_metadata(&q).unwrap();
    assert!(matches!(
        hq.rope_scaling,
        RopeScaling::Yarn {
            beta_fast: 32.0,
            beta_slow: 1.0,
            log_mul: 0.0,
            ..
        }
    ));
    assert!((hq.rope_mscale() - (1.0 + 0.1 * 16f32.ln())).abs() < 1e-6);
    assert!(hq.attn_temp.is_none());

    // rope.scaling.attn_factor scales every RoPE, YaRN's or not.
    let mut p = md.clone();
    p.insert("mistral3.rope.scaling.attn_factor", Value::F32(1.5));
    let hp = HyperParams::from_metadata(&p).unwrap();
    assert!((hp.rope_mscale() - 1.5 * m).abs() < 1e-5);
}

/// phi3 as llama.cpp lays it out: Q/K/V in one matrix and gate/up in one
/// (gate first) in the file, read as their parts; the original context
/// LongRoPE chooses by.
#[test]
fn phi3_fused_matrices_are_split_into_their_parts() {
    use m40_gguf::synth::{write_model, FileType, Shape, SynthOptions};
    let shape = Shape::find("phi3-tiny").unwrap();
    let opts = SynthOptions {
        shape,
        ty: FileType::All(GgmlType::Q8_0),
        seed: 0,
    };
    let bytes = write_model(Vec::new(), &opts, |_, _| {}).unwrap();
    let mut f = m40_gguf::GgufFile::from_bytes(bytes).unwrap();
    let hp = HyperParams::from_file(&f).unwrap();
    assert_eq!((hp.n_ctx_train, hp.n_ctx_orig), (1024, 256));
    assert!((hp.rope_mscale() - 1.2).abs() < 1e-6);
    let qkv = f.tensor_info("blk.1.attn_qkv.weight").unwrap().clone();
    let up = f.tensor_info("blk.1.ffn_up.weight").unwrap().clone();
    assert_eq!(
        (qkv.shape.clone(), up.shape.clone()),
        (vec![256, 512], vec![256, 768])
    );
    assert!(f.tensor_info("blk.1.attn_q.weight").is_none());
    hp.unfuse(&mut f).unwrap();
    assert!(f.tensor_info("blk.1.attn_qkv.weight").is_none());
    let rb = qkv.row_bytes() as u64;
    for (name, rows, first) in [
        ("attn_q", 256, 0),
        ("attn_k", 128, 256),
        ("attn_v", 128, 384),
    ] {
        let t = f.tensor_info(&format!("blk.1.{name}.weight")).unwrap();
        assert_eq!(t.shape, vec![256, rows], "{name}");
        assert_eq!(t.offset, qkv.offset + first * rb, "{name}");
    }
    let (g, u) = (
        f.tensor_info("blk.1.ffn_gate.weight").unwrap(),
        f.tensor_info("blk.1.ffn_up.weight").unwrap(),
    );
    assert_eq!((g.offset, u.offset), (up.offset, up.offset + 384 * rb));
    assert_eq!(
        (g.shape.clone(), u.shape.clone()),
        (vec![256, 384], vec![256, 384])
    );
    // Splitting twice, or into rows that do not add up, is an error.
    let e = f
        .split_rows("blk.1.ffn_up.weight", &[("x".into(), 1)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot be split"), "{e}");
}

/// gpt-oss as llama.cpp reads it: the architecture's name with '-' in
/// every key, every other layer a window from layer 0 (the global RoPE on
/// both), biases and sinks, `post_attention_norm` as the FFN norm, its
/// published MXFP4_MOE mix; a file without its window is refused.
#[test]
fn gpt_oss_reads_as_llama_cpp_does() {
    use m40_gguf::hparams::Activation;
    use m40_gguf::synth::{metadata, write_model, FileType, Shape, SynthOptions};
    let shape = Shape::find("gpt-oss-tiny").unwrap();
    let opts = SynthOptions {
        shape,
        ty: FileType::Mxfp4Moe,
        seed: 0,
    };
    let f =
        m40_gguf::GgufFile::from_bytes(write_model(Vec::new(), &opts, |_, _| {}).unwrap()).unwrap();
    let hp = HyperParams::from_file(&f).unwrap();
    let w = hp.sliding_window.clone().unwrap();
    assert_eq!((w.window, w.layers.clone()), (5, vec![true, false]));
    assert_eq!(w.rope_freq_base, hp.rope_freq_base);
    assert_eq!(
        (hp.head_dim, hp.n_head * hp.head_dim, hp.n_embd),
        (64, 256, 128)
    );
    assert!(hp.qkv_bias && hp.out_bias && hp.attn_sinks && !hp.post_norms);
    assert_eq!(hp.act, Activation::SwigluOai);
    let m = hp.moe.unwrap();
    assert_eq!(
        (m.n_expert, m.n_expert_used, m.n_ff_exp, m.bias),
        (8, 3, 128, true)
    );
    assert_eq!(
        hp.layer_names(1).ffn_norm,
        "blk.1.post_attention_norm.weight"
    );
    for (name, ty) in [
        ("blk.0.ffn_gate_exps.weight", GgmlType::MXFP4),
        ("blk.0.ffn_down_exps.weight", GgmlType::MXFP4),
        ("blk.0.ffn_down_exps.bias", GgmlType::F32),
        ("blk.0.ffn_gate_inp.weight", GgmlType::F32),
        ("blk.0.attn_q.weight", GgmlType::Q8_0),
        ("blk.0.attn_sinks.weight", GgmlType::F32),
        ("output.weight", GgmlType::Q8_0),
    ] {
        assert_eq!(f.tensor_info(name).unwrap().ty, ty, "{name}");
    }
    let mut md = metadata(shape, FileType::Mxfp4Moe);
    md.remove("gpt-oss.attention.sliding_window");
    let err = HyperParams::from_metadata(&md).unwrap_err().to_string();
    assert!(err.contains("gpt-oss.attention.sliding_window"), "{err}");
}

/// command-r as llama.cpp reads it: LayerNorm with its own epsilon key
/// (required), parallel attention and FFN (no ffn_norm), the output tied to
/// the embedding, logits times logit_scale; per-head Q/K LayerNorms (F32,
/// (head_dim, heads)) from 64 layers on.
#[test]
fn command_r_reads_as_llama_cpp_does() {
    use m40_gguf::synth::{metadata, write_model, FileType, Shape, SynthOptions};
    use m40_gguf::NormKind;
    for (name, layers, head_norms) in [
        ("command-r-tiny", 2, false),
        ("command-r-plus-tiny", 64, true),
    ] {
        let shape = Shape::find(name).unwrap();
        let opts = SynthOptions {
            shape,
            ty: FileType::All(GgmlType::F16),
            seed: 0,
        };
        let f = m40_gguf::GgufFile::from_bytes(write_model(Vec::new(), &opts, |_, _| {}).unwrap())
            .unwrap();
        let hp = HyperParams::from_file(&f).unwrap();
        assert_eq!(
            (hp.norm, hp.n_layer, hp.rms_eps),
            (NormKind::Layer, layers, 1e-5)
        );
        assert!(hp.parallel && hp.tied_output && !hp.qkv_bias);
        assert_eq!(hp.logit_scale, 0.0625);
        assert_eq!(hp.rope_style, m40_gguf::RopeStyle::Normal);
        assert_eq!(hp.qk_norm, head_norms, "{name}");
        assert!(f.tensor_info("blk.0.ffn_norm.weight").is_none());
        if head_norms {
            let q = f.tensor_info("blk.0.attn_q_norm.weight").unwrap();
            assert_eq!((q.ty, q.shape.clone()), (GgmlType::F32, vec![16, 4]));
            let k = f.tensor_info("blk.0.attn_k_norm.weight").unwrap();
            assert_eq!(k.shape, vec![16, 2]);
        }
        // The epsilon is required.
        let md = metadata(shape, FileType::All(GgmlType::F32));
        let mut bare = m40_gguf::Metadata::new();
        for (k, v) in md
            .iter()
            .filter(|(k, _)| !k.ends_with("layer_norm_epsilon"))
        {
            bare.insert(k, v.clone());
        }
        let e = HyperParams::from_metadata(&bare).unwrap_err().to_string();
        assert!(e.contains("command-r.attention.layer_norm_epsilon"), "{e}");
    }
}
