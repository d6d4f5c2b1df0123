//! The shape of the code (ARCHITECTURE.md, "Invariants"): no source file
//! over 800 lines, no import cycle between the modules of a crate, and the
//! crates layered in one order.

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

/// The top-level modules of the crate whose sources are `src`, each with
/// the other top-level modules it names (`crate::m`, `use crate::{m, ..}`).
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let top = |p: &Path| -> String {
        let rel = p.strip_prefix(src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        first.trim_end_matches(".rs").to_string()
    };
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let m = top(f);
        if m == "lib" || m == "main" {
            continue;
        }
        let c = code(f);
        let uses = graph.entry(m).or_default();
        let mut rest = c.as_str();
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + 7..];
            if let Some(group) = rest.strip_prefix('{') {
                // use crate::{a, b::c, d::{..}}: the first name of each path.
                let (mut depth, mut piece) = (0, String::new());
                let mut pieces = Vec::new();
                for ch in group.chars() {
                    match ch {
                        '}' if depth == 0 => break,
                        ',' if depth == 0 => pieces.push(std::mem::take(&mut piece)),
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        c => piece.push(c),
                    }
                }
                pieces.push(piece);
                for p in pieces {
                    let name: String = p
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    uses.insert(name);
                }
            } else {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                uses.insert(name);
            }
        }
    }
    let names: BTreeSet<String> = graph.keys().cloned().collect();
    for (m, uses) in graph.iter_mut() {
        uses.retain(|u| names.contains(u) && u != m);
    }
    graph
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
        let g = module_graph(&src);
        assert!(!g.is_empty(), "{}: no modules", src.display());
        if let Some(c) = find_cycle(&g) {
            panic!(
                "{}: modules import each other: {}",
                src.display(),
                c.join(" -> ")
            );
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
