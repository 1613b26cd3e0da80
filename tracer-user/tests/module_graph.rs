//! The architecture's rules (docs/architecture.md), checked on the source:
//! no import cycles between sibling modules (at every level of the module
//! tree); the recording model imports only itself; the report reads only
//! the model (and `system`'s names); a probe family never imports the
//! report, the command line, the engine's internals or another family;
//! `lib.rs` declares at most 8 top-level modules.
//!
//! Imports are read from the source text: `use crate::…`, `use super::…`
//! (brace groups expanded) and paths written inline (`crate::a::b`). An
//! import between a module and one of its ancestors is not an edge (a parent
//! declares its children); an import between two modules is charged to
//! their ancestors that are siblings.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

type ModPath = Vec<String>;

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every module file of the library and its module path.
fn modules() -> BTreeMap<ModPath, PathBuf> {
    fn walk(dir: &Path, prefix: &[String], out: &mut BTreeMap<ModPath, PathBuf>) {
        let Ok(entries) = fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let p = e.path();
            let name = p.file_stem().and_then(|s| s.to_str()).unwrap_or("").to_owned();
            if p.is_dir() {
                let mut sub = prefix.to_vec();
                sub.push(name.clone());
                walk(&p, &sub, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                if prefix.is_empty() && name == "main" {
                    continue; // the binary: imports the library by name
                }
                let mut path = prefix.to_vec();
                if name != "mod" && !(prefix.is_empty() && name == "lib") {
                    path.push(name);
                }
                out.insert(path, p);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(&src_dir(), &[], &mut out);
    out
}

/// Expands one use tree (`a::{b, c::{d, e}}`) into paths.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let t = tree.split(" as ").next().unwrap_or(tree).trim();
        return if t.is_empty() { vec![] } else { vec![t.to_owned()] };
    };
    let prefix = tree[..open].trim_end_matches("::");
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .flat_map(expand)
        .map(|p| if p == "self" { prefix.to_owned() } else if prefix.is_empty() { p } else { format!("{prefix}::{p}") })
        .collect()
}

/// The paths a file refers to, as `crate::…` or `super::…` strings.
fn references(text: &str) -> Vec<String> {
    // Drop line comments (doc comments name modules in prose).
    let code: String = text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
    let mut out = Vec::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("use ") {
        let after = &rest[i + 4..];
        let end = after.find(';').unwrap_or(after.len());
        let stmt: String = after[..end].split_whitespace().collect::<Vec<_>>().join(" ");
        if stmt.starts_with("crate::") || stmt.starts_with("super::") || stmt.starts_with("crate ::") {
            out.extend(expand(&stmt));
        }
        rest = &after[end.min(after.len())..];
    }
    let bytes = code.as_bytes();
    for kw in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(kw) {
            let at = from + i;
            let boundary = at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_' || bytes[at - 1] == b':');
            let len = code[at..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(code.len() - at);
            if boundary {
                out.push(code[at..at + len].trim_end_matches(':').to_owned());
            }
            from = at + len.max(1);
        }
    }
    out
}

/// Resolves a reference made in `module` to the longest known module path.
fn resolve(module: &ModPath, r: &str, known: &BTreeSet<ModPath>) -> Option<ModPath> {
    let mut segs: Vec<&str> = r.split("::").filter(|s| !s.is_empty()).collect();
    let mut base: ModPath = match segs.first() {
        Some(&"crate") => {
            segs.remove(0);
            Vec::new()
        }
        Some(&"super") => {
            // `super` is the parent module, for `mod.rs` and file modules alike.
            let mut b = module.clone();
            while segs.first() == Some(&"super") {
                segs.remove(0);
                b.pop();
            }
            b
        }
        _ => return None,
    };
    // The base itself (`super::Item`) is a target; the crate root is not.
    let mut best = (!base.is_empty()).then(|| base.clone());
    for s in segs {
        base.push(s.to_owned());
        if known.contains(&base) {
            best = Some(base.clone());
        } else {
            break;
        }
    }
    best
}

fn graph() -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let mods = modules();
    let known: BTreeSet<ModPath> = mods.keys().cloned().collect();
    let mut g: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (m, file) in &mods {
        let text = fs::read_to_string(file).unwrap_or_default();
        // `#[cfg(test)]` modules may use anything: drop the tail from there.
        let text = text.split("#[cfg(test)]").next().unwrap_or("");
        for r in references(text) {
            if let Some(t) = resolve(m, &r, &known) {
                g.entry(m.clone()).or_default().insert(t);
            }
        }
    }
    g
}

/// Edges between siblings: for an import `a -> b`, the children of their
/// common ancestor that contain them (none when one contains the other).
fn sibling_edges(g: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> BTreeSet<(ModPath, ModPath)> {
    let mut out = BTreeSet::new();
    for (a, targets) in g {
        for b in targets {
            let common = a.iter().zip(b.iter()).take_while(|(x, y)| x == y).count();
            if common == a.len() || common == b.len() {
                continue;
            }
            out.insert((a[..=common].to_vec(), b[..=common].to_vec()));
        }
    }
    out
}

fn find_cycle(edges: &BTreeSet<(ModPath, ModPath)>) -> Option<Vec<ModPath>> {
    let mut adj: BTreeMap<&ModPath, Vec<&ModPath>> = BTreeMap::new();
    for (a, b) in edges {
        adj.entry(a).or_default().push(b);
    }
    fn dfs<'a>(
        n: &'a ModPath,
        adj: &BTreeMap<&'a ModPath, Vec<&'a ModPath>>,
        state: &mut BTreeMap<&'a ModPath, u8>,
        stack: &mut Vec<&'a ModPath>,
    ) -> Option<Vec<ModPath>> {
        state.insert(n, 1);
        stack.push(n);
        for &m in adj.get(n).map(Vec::as_slice).unwrap_or(&[]) {
            match state.get(m).copied().unwrap_or(0) {
                1 => {
                    let from = stack.iter().position(|x| *x == m).unwrap_or(0);
                    let mut cyc: Vec<ModPath> = stack[from..].iter().map(|x| (*x).clone()).collect();
                    cyc.push(m.clone());
                    return Some(cyc);
                }
                0 => {
                    if let Some(c) = dfs(m, adj, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n, 2);
        None
    }
    let mut state = BTreeMap::new();
    let nodes: Vec<&ModPath> = adj.keys().copied().collect();
    for n in nodes {
        if state.get(n).copied().unwrap_or(0) == 0 {
            let mut stack = Vec::new();
            if let Some(c) = dfs(n, &adj, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

fn show(p: &[ModPath]) -> String {
    p.iter().map(|m| m.join("::")).collect::<Vec<_>>().join(" -> ")
}

#[test]
fn the_graph_is_read() {
    // Guards the parser: known edges must be found.
    let g = graph();
    let has = |a: &[&str], b: &[&str]| {
        let a: ModPath = a.iter().map(|s| s.to_string()).collect();
        let b: ModPath = b.iter().map(|s| s.to_string()).collect();
        g.get(&a).is_some_and(|t| t.contains(&b))
    };
    assert!(has(&["cli", "record"], &["engine", "session"]), "{g:?}");
    assert!(has(&["families", "syscalls"], &["engine"]), "{g:?}");
    assert!(has(&["report", "json"], &["recording"]) || has(&["report"], &["recording"]), "{g:?}");
    assert_eq!(expand("a::{b, c::{d, e as f}, self}"), ["a::b", "a::c::d", "a::c::e", "a"]);
}

#[test]
fn no_import_cycles_between_sibling_modules() {
    let edges = sibling_edges(&graph());
    if let Some(c) = find_cycle(&edges) {
        panic!("import cycle: {}", show(&c));
    }
}

#[test]
fn the_recording_model_imports_no_collector() {
    let g = graph();
    let model: Vec<(&ModPath, &BTreeSet<ModPath>)> = g.iter().filter(|(m, _)| m.first().is_some_and(|s| s == "recording")).collect();
    assert!(!model.is_empty());
    for (m, targets) in model {
        for t in targets {
            let top = t.first().map(String::as_str).unwrap_or("");
            assert!(top == "recording", "{} imports {}: the model may import only itself", m.join("::"), t.join("::"));
        }
    }
}

fn top(p: &ModPath) -> &str {
    p.first().map(String::as_str).unwrap_or("")
}

#[test]
fn the_report_reads_only_the_model() {
    let g = graph();
    let mut bad = Vec::new();
    for (m, targets) in g.iter().filter(|(m, _)| top(m) == "report") {
        for t in targets {
            if !["report", "recording", "system"].contains(&top(t)) {
                bad.push(format!("{} imports {}", m.join("::"), t.join("::")));
            }
        }
    }
    assert!(bad.is_empty(), "the report may import only recording/ and system/:\n{}", bad.join("\n"));
}

/// The engine's modules a family may not use: the loop and what drives it.
const ENGINE_INTERNALS: [&str; 4] = ["session", "checkpoint", "run", "record"];

#[test]
fn families_import_no_report_cli_engine_internals_or_other_family() {
    let g = graph();
    let mut bad = Vec::new();
    for (m, targets) in g.iter().filter(|(m, _)| top(m) == "families" && m.len() >= 2) {
        for t in targets {
            let why = match top(t) {
                "report" | "cli" => Some("the report and the command line sit above the families"),
                "engine" if t.get(1).is_some_and(|s| ENGINE_INTERNALS.contains(&s.as_str())) => {
                    Some("the engine's loop drives the families, not the other way")
                }
                // `families` itself (the list) and another family's folder.
                "families" if t.len() < 2 || t[1] != m[1] => {
                    Some("families exchange data only through the recording, in the order their declarations give")
                }
                _ => None,
            };
            if let Some(why) = why {
                bad.push(format!("{} imports {}: {why}", m.join("::"), t.join("::")));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_library_has_at_most_eight_top_level_modules() {
    let lib = fs::read_to_string(src_dir().join("lib.rs")).expect("lib.rs");
    let mods: Vec<&str> = lib.lines().map(str::trim).filter(|l| l.starts_with("pub mod ") || l.starts_with("mod ")).collect();
    assert!(mods.len() <= 8, "{} top-level modules: {mods:?}", mods.len());
    // Every collector lives under families/.
    for (m, file) in modules() {
        let text = fs::read_to_string(&file).unwrap_or_default();
        let text = text.split("#[cfg(test)]").next().unwrap_or("");
        if text.contains("impl Collector for") || text.contains("impl crate::engine::Collector for") {
            assert!(top(&m) == "families", "{} implements a collector outside families/", file.display());
        }
    }
}

/// Functions longer than this are split (tests and `cargo xtask` aside).
const MAX_FN_LINES: usize = 120;

/// `(lines, file, function)` of every function in `text` longer than
/// `max`: from its `fn` line to the closing brace at its indentation.
fn long_functions(text: &str, file: &str, max: usize) -> Vec<(usize, String, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_start();
        let indent = &l[..l.len() - t.len()];
        let is_fn = ["fn ", "pub fn ", "pub(crate) fn ", "pub(super) fn ", "async fn ", "pub async fn ", "pub(crate) async fn "]
            .iter()
            .any(|p| t.starts_with(p));
        if !is_fn {
            continue;
        }
        let name = t.split("fn ").nth(1).unwrap_or("").split(['(', '<']).next().unwrap_or("").to_owned();
        // The body opens on the signature's last line; a declaration ends with `;`.
        let Some(open) = (i..lines.len()).find(|&j| lines[j].trim_end().ends_with('{') || lines[j].trim_end().ends_with(';')) else { continue };
        if lines[open].trim_end().ends_with(';') {
            continue;
        }
        let close = format!("{indent}}}");
        if let Some(end) = (open + 1..lines.len()).find(|&j| lines[j].trim_end() == close) {
            if end - i + 1 > max {
                out.push((end - i + 1, file.to_owned(), name));
            }
        }
    }
    out
}

#[test]
fn no_function_is_longer_than_120_lines() {
    assert_eq!(long_functions("fn a() {\n    x;\n    y;\n}\n", "t.rs", 3), [(4, "t.rs".to_owned(), "a".to_owned())]);
    let mut long = Vec::new();
    for file in modules().values() {
        let text = fs::read_to_string(file).unwrap_or_default();
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        long.extend(long_functions(code, &file.display().to_string(), MAX_FN_LINES));
    }
    let list: Vec<String> = long.iter().map(|(n, f, name)| format!("{f}: {name} is {n} lines")).collect();
    assert!(list.is_empty(), "split these (at most {MAX_FN_LINES} lines):\n{}", list.join("\n"));
}
