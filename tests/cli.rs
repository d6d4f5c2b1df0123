//! The `m40-llm` binary end to end: `show` on every zoo file, `synth` output,
//! and clear errors on bad input.

mod support;

use serde_json::Value;
use support::cli::{bin, ok, synth_tiny, with_stdin};
use support::testdata;

fn show_json(path: &std::path::Path) -> Value {
    serde_json::from_str(&ok(bin()
        .arg("show")
        .arg(path)
        .arg("--json")
        .output()
        .unwrap()))
    .unwrap()
}

#[test]
fn show_reports_every_zoo_file() {
    let Some(td) = testdata() else { return };
    let expected: Value =
        serde_json::from_slice(&std::fs::read(td.join("quant-zoo/expected.json")).unwrap())
            .unwrap();
    for (file, tensors) in expected.as_object().unwrap() {
        let j = show_json(&td.join("quant-zoo").join(file));
        assert_eq!(j["architecture"], "llama", "{file}");
        for (k, v) in [
            ("n_layer", 2),
            ("n_embd", 256),
            ("n_head", 4),
            ("n_head_kv", 2),
            ("n_ff", 512),
            ("n_vocab", 512),
            ("n_ctx_train", 2048),
        ] {
            assert_eq!(j[k], v, "{file}: {k}");
        }
        assert_eq!(j["check"], "ok", "{file}");
        let tensors = tensors.as_object().unwrap();
        assert_eq!(j["n_tensors"], tensors.len(), "{file}");
        let n_params: u64 = tensors.values().map(|t| t["n"].as_u64().unwrap()).sum();
        assert_eq!(j["n_params"], n_params, "{file}");
        let mut types = serde_json::Map::new();
        for t in tensors.values() {
            let e = types
                .entry(t["type"].as_str().unwrap())
                .or_insert(Value::from(0));
            *e = Value::from(e.as_u64().unwrap() + 1);
        }
        assert_eq!(j["tensor_types"], Value::Object(types), "{file}");
    }
    // The human-readable form names the same things.
    let text = ok(bin()
        .arg("show")
        .arg(td.join("quant-zoo/zoo-Q6_K.gguf"))
        .output()
        .unwrap());
    for needle in [
        "architecture  llama",
        "layers        2",
        "Q6_K x",
        "all present",
    ] {
        assert!(text.contains(needle), "missing `{needle}` in:\n{text}");
    }
}

#[test]
fn show_works_on_tokenizer_only_files() {
    let Some(td) = testdata() else { return };
    let j = show_json(&td.join("vocab/ggml-vocab-llama-bpe.gguf"));
    assert_eq!(j["n_tensors"], 0);
    assert!(
        j["tokenizer"].as_str().unwrap().contains("llama-bpe"),
        "{j}"
    );
    assert!(
        j["check"].as_str().unwrap().contains("token_embd.weight"),
        "{j}"
    );
}

/// `m40-llm show M | head -1` where head is gone before show writes: the
/// command ends without a panic's message (println! panicked on the
/// closed pipe).
#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    synth_tiny(&model, "Q8_0");
    let mut child = bin()
        .arg("show")
        .arg(&model)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reading end closes while the command is still opening the model.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn synth_output_opens_shows_and_dequantizes() {
    let dir = tempfile::tempdir().unwrap();
    for ty in ["F16", "Q8_0", "Q4_0", "Q4_1", "BF16"] {
        let path = dir.path().join(format!("tiny-{ty}.gguf"));
        ok(bin()
            .args(["synth", "--shape", "tiny", "--type", ty])
            .arg(&path)
            .output()
            .unwrap());
        let j = show_json(&path);
        assert_eq!(j["check"], "ok");
        assert_eq!(j["n_layer"], 2);
        assert_eq!(j["tensor_types"][ty], 16, "{j}");
        assert_eq!(j["tensor_types"]["F32"], 5, "{j}");
        let f = m40_gguf::GgufFile::open(&path).unwrap();
        for t in f.tensors() {
            assert!(f.view(t).to_f32().unwrap().iter().all(|v| v.is_finite()));
        }
    }
    let path = dir.path().join("smol.gguf");
    ok(bin()
        .args([
            "synth",
            "--shape",
            "smollm2-135m",
            "--type",
            "q4_1",
            "--seed",
            "5",
        ])
        .arg(&path)
        .output()
        .unwrap());
    let j = show_json(&path);
    assert_eq!(
        (
            j["n_layer"].as_u64(),
            j["n_embd"].as_u64(),
            j["n_vocab"].as_u64()
        ),
        (Some(30), Some(576), Some(49152))
    );
    assert_eq!(j["tied_output"], true);
}

#[test]
fn bad_input_is_a_clear_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "synth".into(),
                "--shape".into(),
                "huge".into(),
                "x.gguf".into(),
            ],
            "unknown shape `huge`",
        ),
        (
            vec![
                "synth".into(),
                "--shape".into(),
                "tiny".into(),
                "--type".into(),
                "IQ2_XXS".into(),
                "x.gguf".into(),
            ],
            "cannot write type `IQ2_XXS`",
        ),
        (
            vec!["show".into(), "/nonexistent/model.gguf".into()],
            "`/nonexistent/model.gguf` is not a model reference: no such file",
        ),
    ];
    for (args, msg) in cases {
        let out = bin()
            .args(&args)
            .current_dir(dir.path())
            .env("M40_MODELS", dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(msg),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    let junk = dir.path().join("junk.gguf");
    std::fs::write(
        &junk,
        b"GGUF\x03\0\0\0\xff\xff\xff\xff\xff\xff\xff\x7f\0\0\0\0\0\0\0\0 padding past the header",
    )
    .unwrap();
    let out = bin().arg("show").arg(&junk).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("tensor count") && !err.contains("panicked"),
        "{err}"
    );
}

#[test]
fn tokenize_stdin_jsonl_reproduces_a_vocab_file() {
    let Some(td) = testdata() else { return };
    let inp = std::fs::read_to_string(td.join("vocab/ggml-vocab-llama-bpe.gguf.inp")).unwrap();
    let sep = "\n__ggml_vocab_test__\n";
    let mut strings: Vec<&str> = inp.split(sep).collect();
    if inp.ends_with(sep) {
        strings.pop();
    }
    let out = std::fs::read_to_string(td.join("vocab/ggml-vocab-llama-bpe.gguf.out")).unwrap();
    let input: String = strings
        .iter()
        .map(|s| serde_json::to_string(s).unwrap() + "\n")
        .collect();
    let mut cmd = bin();
    cmd.args(["tokenize", "--stdin-jsonl", "--no-parse-special"])
        .arg(td.join("vocab/ggml-vocab-llama-bpe.gguf"));
    let got = ok(with_stdin(cmd, input.as_bytes()));
    let got: Vec<&str> = got.lines().collect();
    assert_eq!(got.len(), strings.len());
    for ((line, want), s) in got.iter().zip(out.split('\n')).zip(&strings) {
        let ids: Vec<u64> = serde_json::from_str(line).unwrap();
        let want: Vec<u64> = want
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        assert_eq!(ids, want, "{s:?}");
    }
    // Bad JSON on a line is an error naming the line.
    let mut cmd = bin();
    cmd.args(["tokenize", "--stdin-jsonl"])
        .arg(td.join("vocab/ggml-vocab-gpt-2.gguf"));
    let o = with_stdin(cmd, b"\"ok\"\nnot json\n");
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("line 2"));
}

#[test]
fn tokenize_flags() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    synth_tiny(&model, "Q8_0");
    // Byte-level SentencePiece: "hi" is ▁ (3 bytes) + h + i, after BOS with --add-bos.
    let ids: Vec<u32> = serde_json::from_str(&ok(bin()
        .arg("tokenize")
        .arg(&model)
        .arg("hi")
        .arg("--add-bos")
        .output()
        .unwrap()))
    .unwrap();
    assert_eq!(
        ids,
        vec![
            1,
            0xE2 + 3,
            0x96 + 3,
            0x81 + 3,
            b'h' as u32 + 3,
            b'i' as u32 + 3
        ]
    );
    let pieces: Value = serde_json::from_str(&ok(bin()
        .arg("tokenize")
        .arg(&model)
        .arg("</s>")
        .arg("--pieces")
        .output()
        .unwrap()))
    .unwrap();
    assert_eq!(
        pieces[pieces.as_array().unwrap().len() - 1],
        serde_json::json!([2, "</s>"])
    );
    let literal: Vec<u32> = serde_json::from_str(&ok(bin()
        .arg("tokenize")
        .arg(&model)
        .arg("</s>")
        .arg("--no-parse-special")
        .output()
        .unwrap()))
    .unwrap();
    assert!(literal.len() > 3 && !literal.contains(&2));
}

#[test]
fn template_command() {
    let Some(td) = testdata() else { return };
    let dir = tempfile::tempdir().unwrap();
    let msgs = dir.path().join("m.json");
    std::fs::write(
        &msgs,
        r#"[{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]"#,
    )
    .unwrap();
    let t = td.join("templates/meta-llama-Llama-3.2-3B-Instruct.jinja");
    let out = ok(bin()
        .arg("template")
        .arg("--template")
        .arg(&t)
        .arg("--messages")
        .arg(&msgs)
        .args(["--bos", "<|begin_of_text|>"])
        .output()
        .unwrap());
    assert!(
        out.starts_with("<|begin_of_text|><|start_header_id|>system<|end_header_id|>"),
        "{out}"
    );
    assert!(
        out.ends_with("<|start_header_id|>assistant<|end_header_id|>\n\n"),
        "{out}"
    );
    let out = ok(bin()
        .arg("template")
        .arg("--template")
        .arg(&t)
        .arg("--messages")
        .arg(&msgs)
        .arg("--no-generation-prompt")
        .output()
        .unwrap());
    assert!(out.ends_with("Hi<|eot_id|>"), "{out}");
    // The template's own refusal goes to stderr with a non-zero exit.
    let o = bin()
        .arg("template")
        .arg("--template")
        .arg(td.join("templates/google-gemma-2-2b-it.jinja"))
        .arg("--messages")
        .arg(&msgs)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("System role not supported"));
    // A model without a template gets ChatML.
    let model = dir.path().join("tiny.gguf");
    synth_tiny(&model, "F16");
    let out = ok(bin()
        .arg("template")
        .arg(&model)
        .arg("--messages")
        .arg(&msgs)
        .output()
        .unwrap());
    assert_eq!(out, "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    // Malformed messages.
    std::fs::write(&msgs, "{").unwrap();
    let o = bin()
        .arg("template")
        .arg(&model)
        .arg("--messages")
        .arg(&msgs)
        .output()
        .unwrap();
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("not valid JSON"));
}

#[test]
fn perplexity_command() {
    let Some(td) = testdata() else { return };
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    synth_tiny(&model, "Q8_0");
    let text = td.join("smollm2/eval-gpl3.txt");
    let j: Value = serde_json::from_str(&ok(bin()
        .arg("perplexity")
        .arg(&model)
        .arg(&text)
        .args(["--ctx", "64", "--json"])
        .output()
        .unwrap()))
    .unwrap();
    // llama-perplexity's protocol by default: 64 - 32 - 1 = 31 scored a chunk.
    let n_chunks = j["n_chunks"].as_u64().unwrap();
    assert!(n_chunks > 10);
    assert_eq!(j["scoring"], "second-half");
    assert_eq!(j["scored_tokens"].as_u64().unwrap(), n_chunks * 31);
    assert_eq!(j["argmax"].as_array().unwrap().len() as u64, n_chunks);
    assert_eq!(j["argmax"][0].as_array().unwrap().len(), 31);
    assert_eq!(j["running"].as_array().unwrap().len() as u64, n_chunks);
    assert!(j["ppl_err"].as_f64().unwrap() > 0.0);
    // --score all: every position of every chunk.
    let all: Value = serde_json::from_str(&ok(bin()
        .arg("perplexity")
        .arg(&model)
        .arg(&text)
        .args(["--ctx", "64", "--json", "--score", "all"])
        .output()
        .unwrap()))
    .unwrap();
    assert_eq!(all["scoring"], "all");
    let all_chunks = all["n_chunks"].as_u64().unwrap();
    assert_eq!(all["scored_tokens"].as_u64().unwrap(), all_chunks * 63);
    // The text lines llama-perplexity prints.
    let out = ok(bin()
        .arg("perplexity")
        .arg(&model)
        .arg(&text)
        .args(["--ctx", "64"])
        .output()
        .unwrap());
    assert!(
        out.starts_with("[1]") && out.contains(&format!("[{n_chunks}]")),
        "{out}"
    );
    let last = out.lines().last().unwrap();
    assert!(
        last.starts_with("Final estimate: PPL = ") && last.contains(" +/- "),
        "{last}"
    );
    let printed: f64 = last["Final estimate: PPL = ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((printed - j["ppl"].as_f64().unwrap()).abs() < 1e-4 * printed);
    let (ppl, nll) = (j["ppl"].as_f64().unwrap(), j["mean_nll"].as_f64().unwrap());
    assert!((ppl - nll.exp()).abs() < 1e-6 * ppl && ppl > 1.0 && ppl.is_finite());
    // A random model is close to uniform over its 512 tokens, not better than it by much.
    assert!(ppl > 50.0, "{ppl}");
    let o = bin()
        .arg("perplexity")
        .arg(&model)
        .arg(&text)
        .args(["--ctx", "1"])
        .output()
        .unwrap();
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--ctx"));
    let short = dir.path().join("short.txt");
    std::fs::write(&short, "too short").unwrap();
    let o = bin()
        .arg("perplexity")
        .arg(&model)
        .arg(&short)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("two chunks"), "{err}");
}

#[test]
fn run_one_shot_and_interactive() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    synth_tiny(&model, "Q4_0");
    // One shot, raw, greedy, JSON on the last line.
    let out = ok(bin()
        .arg("run")
        .arg(&model)
        .arg("hello")
        .args(["--raw", "--temp", "0", "-n", "12", "--json"])
        .output()
        .unwrap());
    let last: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(last["token_ids"].as_array().unwrap().len(), 12);
    assert_eq!(last["finish_reason"], "length");
    assert!(last["timings"]["generation_ms"].as_f64().unwrap() > 0.0);
    let text = last["text"].as_str().unwrap();
    assert!(out.starts_with(text), "streamed text comes first");
    // Same seed, same text; sampling flags are accepted.
    let args = [
        "--raw",
        "--temp",
        "1.2",
        "--top-k",
        "50",
        "--top-p",
        "0.9",
        "--min-p",
        "0.01",
        "--repeat-penalty",
        "1.1",
        "--seed",
        "9",
        "-n",
        "10",
        "--json",
    ];
    let ids = |out: String| -> Value {
        serde_json::from_str::<Value>(out.lines().last().unwrap()).unwrap()["token_ids"].clone()
    };
    let a = ids(ok(bin()
        .arg("run")
        .arg(&model)
        .arg("hi")
        .args(args)
        .output()
        .unwrap()));
    let b = ids(ok(bin()
        .arg("run")
        .arg(&model)
        .arg("hi")
        .args(args)
        .output()
        .unwrap()));
    assert_eq!(a, b);
    assert_eq!(a.as_array().unwrap().len(), 10);
    // A prompt longer than the context is a clear error.
    let o = bin()
        .arg("run")
        .arg(&model)
        .arg("x".repeat(100))
        .args(["--raw", "--ctx", "32", "-n", "4"])
        .output()
        .unwrap();
    assert!(
        !o.status.success()
            && String::from_utf8_lossy(&o.stderr).contains("exceeds the context of 32")
    );
    // No prompt: a chat on stdin; /reset and /exit work, each answer reports tokens/s.
    let mut cmd = bin();
    cmd.arg("run")
        .arg(&model)
        .args(["--chat", "--temp", "0", "-n", "5"]);
    let o = with_stdin(cmd, b"Hi\n/reset\nAgain\n/exit\nnever read\n");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(err.matches(" generated").count(), 2, "{err}");
    assert!(err.contains("(conversation cleared)"), "{err}");
    // `"""` begins and ends one message of several lines; /set quiet
    // drops the figures.
    let mut cmd = bin();
    cmd.arg("run")
        .arg(&model)
        .args(["--chat", "--temp", "0", "-n", "3"]);
    let o = with_stdin(
        cmd,
        b"\"\"\"first line\nsecond line\nthird\"\"\"\n/set quiet\nHi\n/bye\n",
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(err.matches(" generated").count(), 1, "{err}");
    assert_eq!(
        err.matches("... ").count(),
        2,
        "two continuation lines: {err}"
    );
}

#[test]
fn pull_list_rm_a_path_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let model = dir.path().join("Tiny-Q8.gguf");
    synth_tiny(&model, "Q8_0");
    let with_store = |args: &[&str]| {
        let mut c = bin();
        c.env("M40_MODELS", &store).args(args);
        c.output().unwrap()
    };
    let out = ok(with_store(&["pull", model.to_str().unwrap()]));
    assert!(out.starts_with("tiny-q8\t"), "{out}");
    let out = ok(with_store(&["list"]));
    assert!(
        out.lines()
            .any(|l| l.starts_with("tiny-q8 ") && l.contains("file:")),
        "{out}"
    );
    // Runs by its store name.
    let out = ok(with_store(&[
        "run", "tiny-q8", "hi", "--raw", "--temp", "0", "-n", "3", "--json",
    ]));
    assert!(out.contains("\"finish_reason\""), "{out}");
    let out = ok(with_store(&["rm", "tiny-q8"]));
    assert_eq!(out.trim(), "deleted 'tiny-q8'");
    assert!(model.is_file(), "a model named in place stays on disk");
    let o = with_store(&["rm", "tiny-q8"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no model named `tiny-q8`"));
    let o = with_store(&["pull", "hf.co/just-an-owner"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("hf.co/OWNER/REPO"));
    let o = with_store(&["ps"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr)
        .contains("no m40-llm server answers at http://127.0.0.1:9"));
}

#[test]
fn impossible_limits_and_nonsense_settings_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    synth_tiny(&model, "Q4_0");
    // The tiny shape is made for 2048 tokens.
    for cmd in ["run", "serve"] {
        let mut c = bin();
        c.env("M40_MODELS", dir.path().join("store"))
            .arg(cmd)
            .arg(&model);
        if cmd == "run" {
            c.arg("hi");
        } else {
            c.args(["--port", "0"]);
        }
        let o = c.args(["--cpu", "--ctx", "99999999"]).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{cmd}: {err}");
        assert!(
            err.contains("99999999") && err.contains("2048 this model was made for"),
            "{cmd}: {err}"
        );
        assert!(
            !err.contains("panicked") && !err.contains("memory allocation"),
            "{err}"
        );
    }
    // 0 is the whole trained context.
    let out = ok(bin()
        .arg("run")
        .arg(&model)
        .args([
            "hi", "--raw", "--temp", "0", "-n", "2", "--ctx", "0", "--json", "--cpu",
        ])
        .output()
        .unwrap());
    assert!(out.contains("\"finish_reason\""), "{out}");
    // Sampling flags are checked as the APIs check them, before loading.
    for (flag, value, says) in [
        (
            "--temp",
            "-1",
            "--temp: temperature must be between 0 and 2",
        ),
        ("--top-p", "5", "--top-p: top_p must be between 0 and 1"),
        ("--min-p", "2", "--min-p: min_p"),
        (
            "--repeat-penalty",
            "0",
            "--repeat-penalty: repeat_penalty must be above 0",
        ),
        ("--presence-penalty", "9", "--presence-penalty"),
    ] {
        // `--temp=-1` and `--temp -1` alike (a negative value after a
        // space is a value, not clap's `-- -1` tip).
        for args in [
            vec![format!("{flag}={value}")],
            vec![flag.into(), value.into()],
        ] {
            let o = bin()
                .arg("run")
                .arg(&model)
                .arg("hi")
                .args(&args)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(!o.status.success() && err.contains(says), "{args:?}: {err}");
        }
    }
    // Piped input comes before the prompt, all of it one prompt (more
    // prompt tokens than the prompt alone); a piped chat is one prompt too.
    let prompt_tokens = |o: std::process::Output| -> u64 {
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(o.status.success(), "{err}");
        let at = err.find(" prompt tokens").expect("a stats line");
        err[..at]
            .rsplit('[')
            .next()
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let run = || {
        let mut c = bin();
        c.arg("run")
            .arg(&model)
            .args(["--temp", "0", "-n", "2", "--cpu"]);
        c
    };
    let alone = prompt_tokens(with_stdin(
        {
            let mut c = run();
            c.arg("summarize");
            c
        },
        b"",
    ));
    let piped = prompt_tokens(with_stdin(
        {
            let mut c = run();
            c.arg("summarize");
            c
        },
        b"first line\nsecond line\n",
    ));
    assert!(piped > alone + 4, "{piped} vs {alone}");
    let whole = prompt_tokens(with_stdin(run(), b"first line\nsecond line\n"));
    assert!(whole > 4);
    // A directory, a file a byte short: the fact and the size.
    let o = bin().arg("show").arg(dir.path()).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("a directory"), "{err}");
}

#[test]
fn ollama_habits_in_the_cli_and_the_chat() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let model = dir.path().join("tiny.gguf");
    synth_tiny(&model, "Q4_0");
    let o = bin().env("M40_MODELS", &store).arg("ls").output().unwrap();
    assert!(ok(o).starts_with("NAME"));
    let mut cmd = bin();
    cmd.arg("run")
        .arg(&model)
        .args(["--chat", "--temp", "0", "-n", "3", "--cpu"]);
    let o = with_stdin(
        cmd,
        b"/?\n/set parameter temperature 0.5\n/set parameter top_p 7\n/show parameters\n/show info\n/nonsense\nHi\n/clear\n/bye\nnever read\n",
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.starts_with("running on the CPU"), "{err}");
    assert!(err.contains("/set parameter NAME VALUE"), "{err}");
    assert!(
        err.contains("set parameter 'temperature' to '0.5'"),
        "{err}"
    );
    assert!(
        err.contains("error: top_p must be between 0 and 1 (1 keeps every token), not 7"),
        "{err}"
    );
    assert!(err.contains("temperature 0.5\ntop_k"), "{err}");
    assert!(
        err.contains("context: ") && err.contains("tiny.gguf"),
        "{err}"
    );
    assert!(err.contains("unknown command `/nonsense`"), "{err}");
    // Only "Hi" reached the model.
    assert_eq!(err.matches(" generated").count(), 1, "{err}");
    assert!(err.contains("(conversation cleared)"), "{err}");
}

#[test]
fn embed_prints_vectors_and_an_encoder_does_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bert.gguf");
    ok(bin()
        .args(["synth", "--shape", "bert-tiny", "--type", "F16"])
        .arg(&path)
        .output()
        .unwrap());
    assert_eq!(show_json(&path)["architecture"], "bert");
    let out = bin()
        .args(["embed", "--cpu"])
        .arg(&path)
        .args(["a cat", "a dog"])
        .output()
        .unwrap();
    let j: Value = serde_json::from_str(&ok(out)).unwrap();
    let e = j["embeddings"].as_array().unwrap();
    assert_eq!((e.len(), e[0].as_array().unwrap().len()), (2, 128));
    assert!(j["prompt_eval_count"].as_u64().unwrap() >= 6);
    // Each line of stdin is a text; --dimensions keeps the first N.
    let mut cmd = bin();
    cmd.args(["embed", "--cpu", "--dimensions", "16"])
        .arg(&path);
    let j: Value = serde_json::from_str(&ok(with_stdin(cmd, b"one\ntwo\nthree\n"))).unwrap();
    let e = j["embeddings"].as_array().unwrap();
    assert_eq!((e.len(), e[2].as_array().unwrap().len()), (3, 16));
    // An embedding model does not generate: a clear error.
    let out = bin()
        .args(["run", "--cpu", "--local"])
        .arg(&path)
        .arg("hi")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("embedding model"), "{err}");
}
