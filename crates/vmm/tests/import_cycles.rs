//! The files of each crate import one another as a DAG: no file reaches, through `use`
//! lines and `crate::` paths (comments and test modules aside), a file that reaches it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path (`vcpu::state`, "" for the crate root) -> file.
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().map(Result::unwrap) {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(src).unwrap().with_extension("");
                let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
                if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                    parts.pop();
                }
                if parts.first().is_some_and(|p| p == "bin") {
                    continue; // each binary is a crate of its own
                }
                found.insert(parts.join("::"), path);
            }
        }
    }
    found
}

/// The source without comments and without the test module at its end.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
    text.lines().map(|l| l.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n")
}

/// Every module path a file names: `crate::a::b`, `super::c`, and `use` groups `{x, y::z}`.
fn named_paths(module: &str, code: &str) -> Vec<String> {
    let here: Vec<&str> = if module.is_empty() { vec![] } else { module.split("::").collect() };
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    for start in ["crate::", "super::"] {
        let mut at = 0;
        while let Some(i) = code[at..].find(start).map(|i| i + at) {
            at = i + start.len();
            if i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_') {
                continue;
            }
            let mut end = i;
            while end < code.len() && (bytes[end].is_ascii_alphanumeric() || b"_:".contains(&bytes[end])) {
                end += 1;
            }
            let path = code[i..end].trim_end_matches(':');
            let mut parts: Vec<&str> = path.split("::").collect();
            let base: Vec<&str> = if parts[0] == "crate" {
                parts.remove(0);
                vec![]
            } else {
                let ups = parts.iter().take_while(|p| **p == "super").count();
                parts.drain(..ups);
                here[..here.len().saturating_sub(ups)].to_vec()
            };
            let prefix: Vec<&str> = base.into_iter().chain(parts).collect();
            out.push(prefix.join("::"));
            // A group after the path: each member names a path below it.
            if code[end..].starts_with('{') {
                let close = code[end..].find('}').map_or(code.len(), |c| c + end);
                for member in code[end + 1..close].split(',') {
                    let member = member.split(" as ").next().unwrap_or_default().trim();
                    let member = member.split('{').next().unwrap_or_default().trim_end_matches(':');
                    if !member.is_empty() && member != "self" {
                        out.push(format!("{}::{member}", prefix.join("::")));
                    }
                }
            }
        }
    }
    out
}

/// The file a path lands in: its longest prefix that is a module of the crate.
fn resolve<'a>(mods: &'a BTreeMap<String, PathBuf>, path: &str) -> Option<&'a str> {
    let parts: Vec<&str> = path.split("::").collect();
    (1..=parts.len()).rev().map(|n| parts[..n].join("::")).find_map(|m| mods.get_key_value(&m).map(|(k, _)| k.as_str()))
}

fn cycle(edges: &BTreeMap<&str, BTreeSet<&str>>) -> Option<Vec<String>> {
    // Depth-first search with colours; the stack when a grey node is met again is the cycle.
    fn visit<'a>(
        n: &'a str,
        edges: &BTreeMap<&'a str, BTreeSet<&'a str>>,
        colour: &mut BTreeMap<&'a str, u8>,
        stack: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        colour.insert(n, 1);
        stack.push(n);
        for &m in edges.get(n).into_iter().flatten() {
            match colour.get(m).copied().unwrap_or(0) {
                1 => {
                    let from = stack.iter().position(|s| *s == m).unwrap_or(0);
                    return Some(stack[from..].iter().chain([&m]).map(|s| s.to_string()).collect());
                }
                0 => {
                    if let Some(c) = visit(m, edges, colour, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        colour.insert(n, 2);
        None
    }
    let mut colour = BTreeMap::new();
    for &n in edges.keys() {
        if colour.get(n).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(n, edges, &mut colour, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn no_file_imports_a_file_that_imports_it() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for name in ["vmm", "cli", "lab", "payloads"] {
        let mods = modules(&crates.join(name).join("src"));
        let codes: BTreeMap<&str, String> = mods.iter().map(|(m, p)| (m.as_str(), code(p))).collect();
        let mut edges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (&m, text) in &codes {
            let targets = named_paths(m, text).into_iter().filter_map(|p| resolve(&mods, &p)).filter(|t| *t != m);
            edges.entry(m).or_default().extend(targets);
        }
        // The crate root declares every module; it imports none of them back.
        edges.remove("");
        assert!(edges.len() > 3 || name == "payloads", "{name}: too few modules found: {edges:?}");
        if let Some(c) = cycle(&edges) {
            panic!("crates/{name}: an import circle: {}", c.join(" -> "));
        }
    }
}

#[test]
fn a_circle_is_found() {
    let mut edges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    edges.entry("a").or_default().insert("b");
    edges.entry("b").or_default().insert("c");
    assert_eq!(cycle(&edges), None);
    edges.entry("c").or_default().insert("a");
    assert_eq!(cycle(&edges).unwrap(), ["a", "b", "c", "a"]);
    let paths = named_paths("x::y", "use super::{z, w::v as q};\nlet _ = crate::p::Q;");
    assert_eq!(paths, ["p::Q", "x", "x::z", "x::w::v"]);
}
