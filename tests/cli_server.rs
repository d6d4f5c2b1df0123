//! The `m40-llm` binary against a running `m40-llm serve`: `run` and the
//! chat through it, `ps`, `stop`, an API key.

mod support;

use support::cli::{bin, ok, serve, synth_tiny, with_stdin};

#[test]
fn run_uses_a_server_that_has_the_model_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    synth_tiny(&model, "Q4_0");
    let (_server, host) = serve(&model, &dir.path().join("store"), &[]);
    let args = ["hello", "--raw", "--temp", "0", "-n", "10"];
    let remote = bin()
        .env("M40_HOST", &host)
        .arg("run")
        .arg(&model)
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&remote.stderr);
    assert!(remote.status.success(), "{err}");
    assert!(
        err.contains(&format!("using the server at http://{host}")),
        "{err}"
    );
    assert!(err.contains("10 generated"), "{err}");
    let local = bin()
        .env("M40_HOST", &host)
        .arg("run")
        .arg(&model)
        .args(args)
        .arg("--local")
        .output()
        .unwrap();
    let local_err = String::from_utf8_lossy(&local.stderr);
    assert!(!local_err.contains("using the server"), "{local_err}");
    assert_eq!(
        String::from_utf8_lossy(&remote.stdout),
        String::from_utf8_lossy(&local.stdout),
        "greedy output is the same through the server"
    );
    // A chat through the server; another model runs in this process.
    let mut cmd = bin();
    cmd.env("M40_HOST", &host)
        .arg("run")
        .arg(&model)
        .args(["--chat", "--temp", "0", "-n", "4"]);
    let o = with_stdin(cmd, b"Hi\nAgain\n/exit\n");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && err.contains("using the server"),
        "{err}"
    );
    assert_eq!(err.matches("4 generated").count(), 2, "{err}");
    let other = dir.path().join("other.gguf");
    synth_tiny(&other, "Q8_0");
    let o = bin()
        .env("M40_HOST", &host)
        .arg("run")
        .arg(&other)
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && err.contains("does not serve"),
        "{err}"
    );
    let out = ok(bin().env("M40_HOST", &host).arg("ps").output().unwrap());
    assert!(out.contains(model.to_str().unwrap()), "{out}");
    // `stop` unloads it (ps lists nothing); the next run loads it again.
    ok(bin()
        .env("M40_HOST", &host)
        .arg("stop")
        .arg(&model)
        .output()
        .unwrap());
    let o = bin().env("M40_HOST", &host).arg("ps").output().unwrap();
    assert!(!String::from_utf8_lossy(&o.stdout).contains(model.to_str().unwrap()));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no model loaded"));
    let again = bin()
        .env("M40_HOST", &host)
        .arg("run")
        .arg(&model)
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("using the server"), "{err}");
    assert_eq!(
        String::from_utf8_lossy(&again.stdout),
        String::from_utf8_lossy(&local.stdout)
    );
    let out = ok(bin().env("M40_HOST", &host).arg("ps").output().unwrap());
    assert!(out.contains(model.to_str().unwrap()), "loaded again: {out}");
    let o = bin()
        .env("M40_HOST", &host)
        .arg("stop")
        .arg(&other)
        .output()
        .unwrap();
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("does not have"));
}

#[test]
fn a_server_with_an_api_key_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    synth_tiny(&model, "Q4_0");
    let (_server, host) = serve(&model, &dir.path().join("store"), &["--api-key", "k3y"]);
    let o = bin()
        .env("M40_HOST", &host)
        .env_remove("M40_API_KEY")
        .arg("ps")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("needs an API key") && err.contains("M40_API_KEY"),
        "{err}"
    );
    let o = bin()
        .env("M40_HOST", &host)
        .env("M40_API_KEY", "nope")
        .arg("ps")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("refused the API key"),
        "{err}"
    );
    let out = ok(bin()
        .env("M40_HOST", &host)
        .env("M40_API_KEY", "k3y")
        .arg("ps")
        .output()
        .unwrap());
    assert!(out.contains(model.to_str().unwrap()), "{out}");
    // run says why it does not use the server, then runs here.
    let o = bin()
        .env("M40_HOST", &host)
        .env_remove("M40_API_KEY")
        .arg("run")
        .arg(&model)
        .args(["hi", "--raw", "--temp", "0", "-n", "2"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success()
            && err.contains("needs an API key")
            && err.contains("running in this process"),
        "{err}"
    );
}

/// The first Ctrl-C lets requests in flight finish; a second stops the
/// server at once (exit status 130).
#[cfg(unix)]
#[test]
fn a_second_ctrl_c_stops_the_server_at_once() {
    use std::io::Write;
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let model = slow_model(dir.path());
    let (mut server, host) = serve(&model, &dir.path().join("store"), &["--ctx", "8192"]);
    // A streamed request whose client never reads: it stays in flight.
    let mut client = std::net::TcpStream::connect(&host).unwrap();
    let body = r#"{"model": "x", "prompt": "hi", "options": {"num_predict": 100000}}"#;
    let body = body.replace("\"x\"", &format!("{:?}", model.display().to_string()));
    write!(
        client,
        "POST /api/generate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let pid = server.0.id() as i32;
    // SAFETY: sends a signal to the child this test started.
    unsafe { libc::kill(pid, libc::SIGINT) };
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        server.0.try_wait().unwrap().is_none(),
        "the first Ctrl-C waits for the request"
    );
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGINT) };
    assert_eq!(
        exit_status(&mut server.0, 10),
        Some(130),
        "the second Ctrl-C stops it"
    );
    drop(client);
}

/// An interrupted one-shot `run` exits non-zero (130, as a shell reports
/// SIGINT), having printed what it had.
#[cfg(unix)]
#[test]
fn an_interrupted_run_exits_130() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let model = slow_model(dir.path());
    let mut run = bin()
        .arg("run")
        .arg(&model)
        .args([
            "Tell me a long story.",
            "--cpu",
            "--ctx",
            "8192",
            "-n",
            "8000",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: sends a signal to the child this test started.
    unsafe { libc::kill(run.id() as i32, libc::SIGINT) };
    assert_eq!(exit_status(&mut run, 20), Some(130));
}

/// A random-weight model of SmolLM2's shape in `dir`: slow enough on the
/// CPU that a long answer outlasts a test.
fn slow_model(dir: &std::path::Path) -> std::path::PathBuf {
    let model = dir.join("small.gguf");
    ok(bin()
        .args(["synth", "--shape", "smollm2-135m", "--type", "Q4_0"])
        .arg(&model)
        .output()
        .unwrap());
    model
}

/// The exit code of `child`, which must exit within `secs` seconds.
fn exit_status(child: &mut std::process::Child, secs: u64) -> Option<i32> {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code();
        }
        assert!(
            t0.elapsed().as_secs() < secs,
            "it did not exit within {secs} s"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
