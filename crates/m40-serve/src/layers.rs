//! What wraps every route: CORS (which browser pages may call the server,
//! as Ollama decides it) and, at debug level, a line per request.

use std::time::Instant;

use axum::extract::Request;
use axum::http::{HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;
use tower_http::cors::{AllowOrigin, Any, CorsLayer};

/// The origins Ollama allows without `OLLAMA_ORIGINS`: pages served from
/// this machine (any port), and desktop and editor webviews.
pub const DEFAULT_ORIGINS: &[&str] = &[
    "http://localhost",
    "https://localhost",
    "http://localhost:*",
    "https://localhost:*",
    "http://127.0.0.1",
    "https://127.0.0.1",
    "http://127.0.0.1:*",
    "https://127.0.0.1:*",
    "http://0.0.0.0",
    "https://0.0.0.0",
    "http://0.0.0.0:*",
    "https://0.0.0.0:*",
    "app://*",
    "file://*",
    "tauri://*",
    "vscode-webview://*",
    "vscode-file://*",
];

/// Whether `origin` matches `pattern`, where each `*` stands for any run
/// of characters (`*` alone: every origin).
pub fn origin_matches(pattern: &str, origin: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = origin.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty(); // no `*`: the whole origin
    };
    for p in middle {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// CORS for the default origins and `extra` (`--origins`, `M40_ORIGINS`):
/// a browser page of any other origin cannot read the answers. Preflights
/// are answered before the API key is checked (browsers send none).
pub fn cors(extra: &[String]) -> CorsLayer {
    let patterns: Vec<String> = DEFAULT_ORIGINS
        .iter()
        .map(|s| s.to_string())
        .chain(extra.iter().map(|s| s.trim().to_string()))
        .filter(|s| !s.is_empty())
        .collect();
    CorsLayer::new()
        .allow_origin(AllowOrigin::predicate(
            move |origin: &HeaderValue, _parts: &axum::http::request::Parts| {
                let Ok(o) = origin.to_str() else {
                    return false;
                };
                patterns.iter().any(|p| origin_matches(p, o))
            },
        ))
        .allow_methods([
            Method::GET,
            Method::POST,
            Method::DELETE,
            Method::HEAD,
            Method::OPTIONS,
        ])
        .allow_headers(Any)
}

/// At debug level (`--debug`, `M40_DEBUG`), one line per request: method,
/// path, status and time to the answer's head.
pub async fn access_log(req: Request, next: Next) -> Response {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return next.run(req).await;
    }
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let t = Instant::now();
    let r = next.run(req).await;
    tracing::debug!(
        "{method} {path} {} in {:.1} ms",
        r.status().as_u16(),
        t.elapsed().as_secs_f64() * 1e3
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_match_as_ollama_lists_them() {
        let any = |o: &str| DEFAULT_ORIGINS.iter().any(|p| origin_matches(p, o));
        for ok in [
            "http://localhost",
            "http://localhost:3000",
            "https://127.0.0.1:8080",
            "app://obsidian.md",
            "vscode-webview://abc",
        ] {
            assert!(any(ok), "{ok}");
        }
        for no in [
            "http://example.com",
            "http://localhost.evil.com",
            "http://127.0.0.1.nip.io",
            "https://192.168.1.5:3000",
            "null",
        ] {
            assert!(!any(no), "{no}");
        }
        assert!(origin_matches("*", "http://anything"));
        assert!(origin_matches(
            "https://*.example.com",
            "https://chat.example.com"
        ));
        assert!(!origin_matches(
            "https://*.example.com",
            "https://example.org"
        ));
        assert!(origin_matches("http://a*b*c", "http://aXbYc"));
        assert!(!origin_matches("http://a*b*c", "http://aXcYb"));
        assert!(origin_matches("http://host", "http://host"));
        assert!(!origin_matches("http://host", "http://host:1"));
    }
}
