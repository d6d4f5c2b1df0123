//! The shape of the code (ARCHITECTURE.md, "Invariants"): no source file
//! over 800 lines, no import cycle between the modules of a crate, the
//! crates layered in one order, and `unsafe` only where it is said to be.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_source_file_is_over_800_lines() {
    let mut files = Vec::new();
    for dir in ["crates", "src", "xtask", "tests", "benches", "examples"] {
        rust_files(&root().join(dir), &mut files);
    }
    assert!(files.len() > 50, "found only {} files", files.len());
    let long: Vec<String> = files
        .iter()
        .map(|p| (p, std::fs::read_to_string(p).unwrap().lines().count()))
        .filter(|(_, n)| *n > 800)
        .map(|(p, n)| format!("{} ({n} lines)", p.strip_prefix(root()).unwrap().display()))
        .collect();
    assert!(long.is_empty(), "over 800 lines: {long:?}");
}

/// The code of a file without comments and without its unit tests (a
/// `#[cfg(test)] mod tests` at the end may use anything of its crate).
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap();
    text.lines()
        .map(|l| l.split("//").next().unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

/// A file's module path under `src` (`gpu/mod.rs` and `gpu.rs`: ["gpu"];
/// `lib.rs`, `main.rs`: []).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| {
            c.as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string()
        })
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The paths a file's code names after `crate::` or `super::` (each
/// piece of a `{..}` group its own path), resolved from module `m`:
/// absolute module paths, possibly running on into items.
fn named_paths(code: &str, m: &[String]) -> Vec<Vec<String>> {
    fn ident(s: &str) -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    }
    /// `a::b::{c, d::e}` (the text after a prefix) as paths.
    fn expand(text: &str) -> Vec<Vec<String>> {
        let text = text.trim_start();
        if let Some(group) = text.strip_prefix('{') {
            let (mut depth, mut piece, mut out) = (0, String::new(), Vec::new());
            for ch in group.chars() {
                match ch {
                    '}' if depth == 0 => break,
                    ',' if depth == 0 => out.extend(expand(&std::mem::take(&mut piece))),
                    '{' => {
                        depth += 1;
                        piece.push(ch)
                    }
                    '}' => {
                        depth -= 1;
                        piece.push(ch)
                    }
                    c => piece.push(c),
                }
            }
            out.extend(expand(&piece));
            return out;
        }
        let name = ident(text);
        if name.is_empty() {
            return vec![Vec::new()];
        }
        match text[name.len()..].strip_prefix("::") {
            Some(rest) => expand(rest)
                .into_iter()
                .map(|mut p| {
                    p.insert(0, name.clone());
                    p
                })
                .collect(),
            None => vec![vec![name]],
        }
    }
    let mut out = Vec::new();
    for prefix in ["crate::", "super::"] {
        let mut rest = code;
        while let Some(at) = rest.find(prefix) {
            // Not the tail of a longer name (`my_crate::`, `super::super::`).
            let before = code.len() - rest.len() + at;
            let ok = !code[..before]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
            rest = &rest[at + prefix.len()..];
            if !ok {
                continue;
            }
            let mut base = Vec::new();
            if prefix == "super::" {
                // A module's parent (a directory module's, from its mod.rs,
                // likewise), once more for each further `super::`.
                base = m.to_vec();
                base.pop();
                while let Some(r) = rest.strip_prefix("super::") {
                    base.pop();
                    rest = r;
                }
            }
            for p in expand(rest) {
                let mut full = base.clone();
                full.extend(p);
                out.push(full);
            }
        }
    }
    out
}

/// For each module with submodules (by its path, "" the crate root), its
/// children, each with the siblings it imports: an import from a child (or
/// anything inside it) of something inside another child is an edge
/// between those two children. Imports of a module's own ancestors (a
/// child's `super::Type`) make no edge.
fn module_graphs(src: &Path) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(src, f)).collect();
    let mut graphs: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for m in modules.iter().filter(|m| !m.is_empty()) {
        let parent = m[..m.len() - 1].join("::");
        graphs
            .entry(parent)
            .or_default()
            .entry(m[m.len() - 1].clone())
            .or_default();
    }
    for f in &files {
        let from = module_of(src, f);
        for path in named_paths(&code(f), &from) {
            // The longest prefix that is a module.
            let Some(to) = (1..=path.len())
                .rev()
                .map(|n| path[..n].to_vec())
                .find(|p| modules.contains(p))
            else {
                continue;
            };
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common == from.len() || common == to.len() {
                continue; // one holds the other
            }
            let parent = from[..common].join("::");
            graphs
                .entry(parent)
                .or_default()
                .entry(from[common].clone())
                .or_default()
                .insert(to[common].clone());
        }
    }
    graphs
}

/// The top-level modules of the crate whose sources are `src`, each with
/// the other top-level modules it names.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    module_graphs(src).remove("").unwrap_or_default()
}

/// A cycle of `graph`, if it has one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        g: &BTreeMap<String, BTreeSet<String>>,
        m: &str,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(m.to_string(), 1);
        path.push(m.to_string());
        for u in &g[m] {
            match state.get(u) {
                Some(1) => {
                    let at = path.iter().position(|p| p == u).unwrap();
                    let mut cycle = path[at..].to_vec();
                    cycle.push(u.clone());
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(g, u, state, path) {
                        return Some(c);
                    }
                }
            }
        }
        path.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in graph.keys() {
        if !state.contains_key(m) {
            if let Some(c) = visit(graph, m, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn no_module_imports_form_a_cycle() {
    let mut srcs = vec![root().join("src"), root().join("xtask/src")];
    for e in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        srcs.push(e.path().join("src"));
    }
    assert!(srcs.len() >= 9);
    for src in srcs {
        let graphs = module_graphs(&src);
        assert!(graphs.contains_key(""), "{}: no modules", src.display());
        for (parent, g) in &graphs {
            if let Some(c) = find_cycle(g) {
                panic!(
                    "{}: modules of `{}` import each other: {}",
                    src.display(),
                    if parent.is_empty() { "crate" } else { parent },
                    c.join(" -> ")
                );
            }
        }
    }
}

#[test]
fn the_cycle_check_sees_cycles() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::write(src.join("lib.rs"), "mod a; mod b; mod c;").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::{b::X, c};\n// crate::c\n").unwrap();
    std::fs::write(src.join("b.rs"), "fn f() { crate::c::g() }").unwrap();
    std::fs::write(
        src.join("c.rs"),
        "pub fn g() {}\n#[cfg(test)]\nmod tests { use crate::a; }",
    )
    .unwrap();
    let g = module_graph(src);
    assert_eq!(g["a"], ["b", "c"].map(String::from).into());
    assert_eq!(g["b"], ["c"].map(String::from).into());
    assert!(g["c"].is_empty());
    assert_eq!(find_cycle(&g), None);
    std::fs::write(src.join("c.rs"), "use crate::a::Y;").unwrap();
    let cycle = find_cycle(&module_graph(src)).expect("a -> b -> c -> a");
    assert_eq!(cycle.first(), cycle.last());
    // Nested: siblings inside `n` through `super::` (and a child naming its
    // parent's items, which is no edge), and a grandchild's import.
    std::fs::write(src.join("c.rs"), "pub fn g() {}").unwrap();
    std::fs::create_dir_all(src.join("n/deep")).unwrap();
    std::fs::write(src.join("n.rs"), "mod p; mod q; mod deep; pub struct S;").unwrap();
    std::fs::write(src.join("n/p.rs"), "use super::{q::T, S};").unwrap();
    std::fs::write(src.join("n/q.rs"), "use super::S; pub struct T;").unwrap();
    std::fs::write(src.join("n/deep/mod.rs"), "mod r;").unwrap();
    std::fs::write(src.join("n/deep/r.rs"), "fn f() { super::super::p::f() }").unwrap();
    let gs = module_graphs(src);
    assert_eq!(gs["n"]["p"], ["q"].map(String::from).into());
    assert!(gs["n"]["q"].is_empty());
    assert_eq!(gs["n"]["deep"], ["p"].map(String::from).into());
    assert_eq!(find_cycle(&gs["n"]), None);
    std::fs::write(src.join("n/q.rs"), "use crate::n::deep::X; pub struct T;").unwrap();
    let gs = module_graphs(src);
    let cycle = find_cycle(&gs["n"]).expect("p -> q -> deep -> p");
    assert_eq!(cycle.len(), 4, "{cycle:?}");
}

/// The crates in ARCHITECTURE.md's order: each depends only on earlier
/// ones.
const LAYERS: [&str; 9] = [
    "m40-gguf",
    "m40-tokenizer",
    "m40-chat",
    "m40-device",
    "m40-kernels",
    "m40-model",
    "m40-sched",
    "m40-runtime",
    "m40-serve",
];

#[test]
fn crates_depend_only_on_the_layers_above() {
    for (i, name) in LAYERS.iter().enumerate() {
        let manifest =
            std::fs::read_to_string(root().join("crates").join(name).join("Cargo.toml")).unwrap();
        let deps = manifest
            .split("\n[dependencies]\n")
            .nth(1)
            .expect("a [dependencies] table")
            .split("\n[")
            .next()
            .unwrap();
        for line in deps.lines() {
            let dep = line.split(['=', '.', ' ']).next().unwrap().trim();
            if let Some(j) = LAYERS.iter().position(|l| *l == dep) {
                assert!(j < i, "{name} depends on {dep}, a layer below it");
            }
        }
    }
}

/// Where `unsafe` may be, outside m40-device (the door to CUDA), and why
/// (ARCHITECTURE.md, "Invariants"): a path prefix and its kind.
const UNSAFE_PLACES: &[(&str, &str)] = &[
    ("crates/m40-kernels/", "kernel launches and graph replays"),
    ("crates/m40-model/src/gpu/graphs.rs", "graph replays"),
    (
        "crates/m40-model/src/cpu/",
        "x86 SIMD intrinsics behind a run-time feature check",
    ),
    ("crates/m40-gguf/src/file.rs", "the GGUF file's memory map"),
    ("src/main.rs", "a POSIX signal's default action"),
    (
        "tests/cli_server.rs",
        "a POSIX signal to a child the test started",
    ),
    ("xtask/src/ptx.rs", "NVRTC's C API, loaded with libloading"),
];

/// Every `unsafe` outside m40-device is in one of [`UNSAFE_PLACES`], and
/// every one (an `unsafe` block, fn or impl) has a `SAFETY:` comment or a
/// `# Safety` doc on its line or in the comments right above it.
#[test]
fn unsafe_is_only_where_the_architecture_says_and_always_explained() {
    let mut files = Vec::new();
    for dir in ["crates", "src", "xtask", "tests", "benches", "examples"] {
        rust_files(&root().join(dir), &mut files);
    }
    let (mut misplaced, mut unexplained) = (Vec::new(), Vec::new());
    for f in &files {
        let rel = f
            .strip_prefix(root())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if rel.starts_with("crates/m40-device/") || rel == "tests/tidy.rs" {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            // Blocks and declarations (not `unsafe fn(..)` pointer types).
            let is_unsafe = ["unsafe {", "unsafe fn ", "unsafe impl"]
                .iter()
                .any(|u| code.contains(u));
            if !is_unsafe {
                continue;
            }
            if !UNSAFE_PLACES.iter().any(|(p, _)| rel.starts_with(p)) {
                misplaced.push(format!("{rel}:{}", i + 1));
            }
            // Its line, and the comments and attributes right above it.
            let above = lines[..i].iter().rev().take_while(|l| {
                let t = l.trim_start();
                t.starts_with("//") || t.starts_with("#[")
            });
            let explained = std::iter::once(line)
                .chain(above)
                .any(|l| l.contains("SAFETY:") || l.contains("# Safety"));
            if !explained {
                unexplained.push(format!("{rel}:{}", i + 1));
            }
        }
    }
    assert!(
        misplaced.is_empty(),
        "unsafe outside its places: {misplaced:?}"
    );
    assert!(
        unexplained.is_empty(),
        "unsafe without SAFETY: {unexplained:?}"
    );
}

/// Every path ARCHITECTURE.md's code map names exists.
#[test]
fn the_code_map_names_paths_that_exist() {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let map = text
        .split("## Code map")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("ARCHITECTURE.md has a code map");
    let paths: Vec<&str> = map
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|p| p.contains('/') && !p.contains(' ') && !p.contains('*'))
        .collect();
    assert!(paths.len() >= 10, "{paths:?}");
    let missing: Vec<&&str> = paths
        .iter()
        .filter(|p| !root().join(p.trim_end_matches('/')).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "the code map names missing paths: {missing:?}"
    );
}
