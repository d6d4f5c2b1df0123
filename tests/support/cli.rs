//! Helpers for the tests that drive the `m40-llm` binary.

use std::process::{Command, Output};

/// The binary, pointed at no server (port 9 answers nothing) unless a test
/// says otherwise.
pub fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_m40-llm"));
    c.env("M40_HOST", "127.0.0.1:9");
    c
}

/// Run `cmd` with `input` on stdin; collect its output.
pub fn with_stdin(mut cmd: Command, input: &[u8]) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// Write the `tiny` synthetic model in `ty` to `path`.
pub fn synth_tiny(path: &std::path::Path, ty: &str) {
    ok(bin()
        .args(["synth", "--shape", "tiny", "--type", ty])
        .arg(path)
        .output()
        .unwrap());
}

pub fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Kills the server when the test ends, however it ends.
pub struct Child(pub std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `m40-llm serve MODEL --cpu` with `extra` flags on a free port, started;
/// the server and its host:port.
pub fn serve(model: &std::path::Path, store: &std::path::Path, extra: &[&str]) -> (Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let host = format!("127.0.0.1:{port}");
    let server = Child(
        bin()
            .env("M40_MODELS", store)
            .env_remove("M40_API_KEY")
            .arg("serve")
            .arg(model)
            .args(["--cpu", "--port", &port.to_string()])
            .args(extra)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let t0 = std::time::Instant::now();
    while std::net::TcpStream::connect(&host).is_err() {
        assert!(t0.elapsed().as_secs() < 60, "the server did not start");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    (server, host)
}
