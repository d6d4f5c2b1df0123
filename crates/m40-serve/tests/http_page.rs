//! The chat page at `/` (issue 59 point 5): served to browsers, Ollama's
//! health text to everything else, and driven in a real browser
//! (tests/python/check_page.py: headless Chromium through Selenium).

mod common;

use common::*;

fn get_with(base: &str, accept: Option<&str>) -> (u16, String, String, String) {
    let mut req = agent().get(&format!("{base}/"));
    if let Some(a) = accept {
        req = req.header("accept", a);
    }
    let mut r = req.call().unwrap();
    let h = |n: &str| {
        r.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let (ct, csp) = (h("content-type"), h("content-security-policy"));
    (
        r.status().as_u16(),
        ct,
        csp,
        r.body_mut().read_to_string().unwrap(),
    )
}

#[test]
fn browsers_get_the_page_and_probes_get_ollamas_text() {
    let base = server();
    // curl, health probes, Ollama's clients: the text, word for word.
    for accept in [None, Some("*/*"), Some("application/json")] {
        let (s, _, _, body) = get_with(base, accept);
        assert_eq!((s, body.as_str()), (200, "Ollama is running"), "{accept:?}");
    }
    // A browser's navigation.
    let (s, ct, csp, page) = get_with(
        base,
        Some("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"),
    );
    assert_eq!(s, 200);
    assert!(ct.starts_with("text/html"), "{ct}");
    assert!(page.contains("<title>m40-llm</title>"));
    // Self-contained: nothing fetched from elsewhere, the API its only peer.
    assert!(
        csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"),
        "{csp}"
    );
    for outside in ["http://", "https://", "//cdn", "<script src", "<link"] {
        let hits: Vec<&str> = page
            .lines()
            .filter(|l| l.contains(outside) && !l.contains("https?:"))
            .collect();
        assert!(hits.is_empty(), "{outside}: {hits:?}");
    }
    for route in ["/api/tags", "/api/ps", "/api/chat"] {
        assert!(page.contains(route), "{route}");
    }
}

/// The page in headless Chromium: lists the model, streams an answer,
/// stops one. Needs Debian's chromium and chromium-driver and Selenium in
/// `M40_PY_CLIENTS` (CI installs them; `M40_REQUIRE_BROWSER=1` there).
#[test]
fn the_page_chats_in_a_real_browser() {
    let chromium = std::env::var("M40_CHROMIUM").unwrap_or("/usr/bin/chromium".into());
    let driver = std::env::var("M40_CHROMEDRIVER").unwrap_or("/usr/bin/chromedriver".into());
    let pydir = std::env::var_os("M40_PY_CLIENTS");
    let have = pydir.is_some()
        && std::path::Path::new(&chromium).is_file()
        && std::path::Path::new(&driver).is_file();
    if !have {
        assert!(
            std::env::var("M40_REQUIRE_BROWSER").as_deref() != Ok("1"),
            "M40_REQUIRE_BROWSER=1 but Chromium ({chromium}), ChromeDriver ({driver}) or \
             M40_PY_CLIENTS (with selenium) is missing"
        );
        eprintln!("skipped: needs chromium, chromedriver and selenium (as .ci/run installs)");
        return;
    }
    // A created model whose answers are short ("brief"), and the default
    // model, whose answers run long enough to stop one.
    let (base, _store) = store_server();
    let body = serde_json::json!({"model": "brief", "from": NAME, "stream": false,
                                  "parameters": {"num_predict": 24, "temperature": 0}});
    let (s, text) = post_raw_at(&base, "/api/create", &body.to_string());
    assert_eq!(s, 200, "{text}");
    run_python(
        "check_page.py",
        &pydir.unwrap(),
        &[base.as_str(), "brief", NAME, &chromium, &driver],
    );
}
