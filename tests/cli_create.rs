//! `m40-llm create NAME -f Modelfile` and `cp`: a customised model in the
//! store, run in this process with its instructions (SYSTEM, PARAMETERs)
//! beneath the flags, as a server applies them.

mod support;

use serde_json::Value;
use support::cli::{bin, ok, synth_tiny};

/// The `--json` line's token ids.
fn token_ids(out: &str) -> Vec<u64> {
    let last = out.lines().last().unwrap();
    let v: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {out}"));
    v["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

#[test]
fn a_created_model_runs_with_its_instructions() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let model = dir.path().join("Tiny-Q8.gguf");
    synth_tiny(&model, "Q8_0");
    let run = |args: &[&str]| {
        let mut c = bin();
        c.env("M40_MODELS", &store).args(args);
        c.output().unwrap()
    };
    ok(run(&["pull", model.to_str().unwrap()]));
    let mf = dir.path().join("Modelfile");
    std::fs::write(
        &mf,
        "FROM tiny-q8\nSYSTEM Be brief.\nPARAMETER temperature 0\nPARAMETER num_predict 3\n",
    )
    .unwrap();
    let out = ok(run(&["create", "mini", "-f", mf.to_str().unwrap()]));
    assert_eq!(out.trim(), "created 'mini' from tiny-q8");
    // Its SYSTEM and PARAMETERs: as the base model with them as flags.
    let own = token_ids(&ok(run(&["run", "mini", "hey", "--json"])));
    assert_eq!(own.len(), 3);
    let spelled = token_ids(&ok(run(&[
        "run",
        "tiny-q8",
        "hey",
        "--system",
        "Be brief.",
        "--temp",
        "0",
        "-n",
        "3",
        "--json",
    ])));
    assert_eq!(own, spelled);
    // A flag wins over its PARAMETER.
    let longer = token_ids(&ok(run(&["run", "mini", "hey", "-n", "5", "--json"])));
    assert_eq!(longer.len(), 5);
    assert_eq!(&longer[..3], &own[..], "greedy: the same start");
    // A copy runs alike; both listed.
    let out = ok(run(&["cp", "mini", "mini2"]));
    assert_eq!(out.trim(), "copied 'mini' to 'mini2'");
    assert_eq!(token_ids(&ok(run(&["run", "mini2", "hey", "--json"]))), own);
    let list = ok(run(&["list"]));
    assert!(list.contains("mini ") && list.contains("mini2 "), "{list}");
    // Mistakes are clear errors.
    std::fs::write(&mf, "FROM tiny-q8\nTEMPLATE {{ .Prompt }}\n").unwrap();
    let o = run(&["create", "bad", "-f", mf.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("Go template"));
    let o = run(&["create", "bad", "-f", "/no/such/Modelfile"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("reading /no/such/Modelfile"));
    std::fs::write(&mf, "FROM nothing-here\n").unwrap();
    let o = run(&["create", "bad", "-f", mf.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("nothing-here"));
    let o = run(&["cp", "nope", "x"]);
    assert!(!o.status.success());
}
