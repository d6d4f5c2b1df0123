//! Every quant-zoo file opens, its hyperparameters check out, and every tensor
//! dequantizes to what gguf-py's reference dequantization gives.

mod common;

use m40_gguf::{GgmlType, GgufFile, HyperParams};
use serde_json::Value;

fn ulps(a: f32, b: f32) -> u32 {
    if a == b {
        return 0;
    }
    if a.is_nan() || b.is_nan() || a.signum() != b.signum() {
        return u32::MAX;
    }
    a.to_bits().abs_diff(b.to_bits())
}

#[test]
fn every_zoo_tensor_matches_reference_dequantization() {
    let Some(td) = common::testdata() else { return };
    let zoo = td.join("quant-zoo");
    let expected: Value =
        serde_json::from_slice(&std::fs::read(zoo.join("expected.json")).unwrap()).unwrap();
    let files = expected.as_object().unwrap();
    assert_eq!(files.len(), 15, "the zoo holds 15 formats");
    let mut types_seen = std::collections::BTreeSet::new();
    let mut checked = 0;
    for (file_name, tensors) in files {
        let f = GgufFile::open(zoo.join(file_name)).unwrap_or_else(|e| panic!("{file_name}: {e}"));
        let hp = HyperParams::from_file(&f).unwrap_or_else(|e| panic!("{file_name}: {e}"));
        assert_eq!(
            (
                hp.n_layer,
                hp.n_embd,
                hp.n_head,
                hp.n_head_kv,
                hp.head_dim,
                hp.n_ff,
                hp.n_vocab
            ),
            (2, 256, 4, 2, 64, 512, 512)
        );
        assert!(!hp.tied_output);
        let tensors = tensors.as_object().unwrap();
        assert_eq!(
            tensors.len(),
            f.tensors().len(),
            "{file_name}: tensor count"
        );
        for (name, exp) in tensors {
            let view = f
                .tensor(name)
                .unwrap_or_else(|| panic!("{file_name}: no tensor {name}"));
            let ty = GgmlType::from_name(exp["type"].as_str().unwrap()).unwrap();
            assert_eq!(view.info.ty, ty, "{file_name}/{name}: type");
            types_seen.insert(ty);
            let shape: Vec<u64> = exp["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            assert_eq!(view.info.shape, shape, "{file_name}/{name}: shape");
            let values = view.to_f32().unwrap();
            assert_eq!(values.len() as u64, exp["n"].as_u64().unwrap());
            for (i, (h, &got)) in exp["head"]
                .as_array()
                .unwrap()
                .iter()
                .zip(&values)
                .enumerate()
            {
                let want = h.as_f64().unwrap() as f32;
                assert!(
                    ulps(got, want) <= 1,
                    "{file_name}/{name}[{i}]: got {got:e}, want {want:e}"
                );
            }
            let sum: f64 = values.iter().map(|&v| v as f64).sum();
            let sum_sq: f64 = values.iter().map(|&v| (v as f64) * (v as f64)).sum();
            for (what, got, want) in [
                ("sum", sum, exp["sum"].as_f64().unwrap()),
                ("sum_sq", sum_sq, exp["sum_sq"].as_f64().unwrap()),
            ] {
                let rel = (got - want).abs() / want.abs().max(1e-30);
                assert!(
                    rel <= 1e-9,
                    "{file_name}/{name}: {what} {got} vs {want} (rel {rel:e})"
                );
            }
            checked += 1;
        }
    }
    // MXFP4 is not in the zoo: tests/mxfp4.rs checks it against ggml.
    for ty in GgmlType::SUPPORTED
        .iter()
        .filter(|t| **t != GgmlType::MXFP4)
    {
        assert!(types_seen.contains(ty), "zoo did not exercise {ty}");
    }
    eprintln!("checked {checked} tensors");
}

#[test]
fn our_quantizers_reproduce_llama_quantize_byte_for_byte() {
    // The zoo files were made by `llama-quantize --pure` from zoo-F32.gguf,
    // which for these formats runs ggml's reference quantizers.
    let Some(td) = common::testdata() else { return };
    let zoo = td.join("quant-zoo");
    let src = GgufFile::open(zoo.join("zoo-F32.gguf")).unwrap();
    // Every format we quantize to, F32 being the source (the zoo has no
    // MXFP4 file: tests/mxfp4.rs checks that one).
    for &ty in GgmlType::QUANTIZABLE
        .iter()
        .filter(|t| !matches!(t, GgmlType::F32 | GgmlType::MXFP4))
    {
        // `--pure` Q4_K_S stores every matrix as Q4_K.
        let file = match ty {
            GgmlType::Q4_K => "Q4_K_S".to_string(),
            _ => ty.to_string(),
        };
        let dst = GgufFile::open(zoo.join(format!("zoo-{file}.gguf"))).unwrap();
        let mut compared = 0;
        for info in src.tensors() {
            let theirs = dst.tensor(&info.name).unwrap();
            if theirs.info.ty != ty {
                continue; // norm weights stay F32
            }
            let x = src.view(info).to_f32().unwrap();
            let ours = m40_gguf::quant::quantize_to_vec(ty, &x).unwrap();
            let diff = ours.iter().zip(theirs.data).filter(|(a, b)| a != b).count();
            assert_eq!(
                diff,
                0,
                "{ty} {}: {diff} of {} bytes differ",
                info.name,
                ours.len()
            );
            compared += 1;
        }
        assert!(compared >= 10, "{ty}: only {compared} tensors compared");
    }
}

#[test]
fn every_vocab_file_opens_with_its_tokenizer_metadata() {
    let Some(td) = common::testdata() else { return };
    let mut n = 0;
    for entry in std::fs::read_dir(td.join("vocab")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "gguf") {
            continue;
        }
        let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let md = f.metadata();
        let tokens = md.opt_str_array("tokenizer.ggml.tokens").unwrap().unwrap();
        assert!(tokens.len() > 1000, "{}", path.display());
        let model = md.str("tokenizer.ggml.model").unwrap();
        assert!(model == "llama" || model == "gpt2", "{model}");
        if let Some(types) = md.opt_int_array("tokenizer.ggml.token_type").unwrap() {
            assert_eq!(types.len(), tokens.len());
        }
        n += 1;
    }
    assert_eq!(n, 8);
}
