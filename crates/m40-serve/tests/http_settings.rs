//! The server's settings over HTTP: which browser origins may call it
//! (CORS, `--origins`).

mod common;

use common::*;
use m40_serve::ServerConfig;

/// CORS as Ollama decides it: pages of this machine (any port) and app
/// webviews may read answers, others only when `origins` lists them
/// (`*` patterns); a preflight is answered before the API key is asked.
#[test]
fn browsers_of_allowed_origins_only() {
    let base = start(ServerConfig {
        origins: vec!["https://*.example.com".into()],
        api_key: Some("k".into()),
        ..Default::default()
    });
    let acao = |origin: &str| -> Option<String> {
        let r = agent()
            .get(&format!("{base}/api/version"))
            .header("Origin", origin)
            .header("Authorization", "Bearer k")
            .call()
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        r.headers()
            .get("access-control-allow-origin")
            .map(|v| v.to_str().unwrap().to_string())
    };
    for ok in [
        "http://localhost:3000",
        "http://127.0.0.1:8080",
        "https://chat.example.com",
        "app://obsidian.md",
    ] {
        assert_eq!(acao(ok).as_deref(), Some(ok), "{ok}");
    }
    for no in [
        "http://evil.test",
        "https://example.org",
        "http://localhost.evil.test",
    ] {
        assert_eq!(acao(no), None, "{no}");
    }
    // The preflight of a keyed POST from an allowed page: no key needed.
    let r = agent()
        .options(&format!("{base}/api/chat"))
        .header("Origin", "http://localhost:5173")
        .header("Access-Control-Request-Method", "POST")
        .header(
            "Access-Control-Request-Headers",
            "authorization,content-type",
        )
        .call()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let h = r.headers();
    assert_eq!(h["access-control-allow-origin"], "http://localhost:5173");
    assert!(h["access-control-allow-methods"]
        .to_str()
        .unwrap()
        .contains("POST"));
}
