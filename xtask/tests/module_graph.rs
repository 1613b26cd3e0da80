//! The modules of xtask/src (one file each) must not import each other in a
//! cycle. An edge A -> B is a `crate::B` path (also inside
//! `use crate::{..}` groups) or a `super::B` path in A's file; comments and
//! string literals are ignored.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// `src` with comments and the insides of string and char literals blanked
/// out, so that only code is searched.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let rest = &src[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            let mut depth = 0;
            while i < b.len() {
                if src[i..].starts_with("/*") {
                    depth += 1;
                    i += 2;
                } else if src[i..].starts_with("*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if let Some(hashes) = raw_string_start(rest) {
            let close = format!("\"{}", "#".repeat(hashes));
            let body = i + 2 + hashes;
            i = src[body..]
                .find(&close)
                .map_or(b.len(), |e| body + e + close.len());
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && (b.get(i + 1) == Some(&b'\\') || b.get(i + 2) == Some(&b'\'')) {
            // A char literal (a lifetime has no closing quote).
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("' '");
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The number of `#`s when `s` starts a raw string (`r"`, `r#"`, `br"`, ...).
fn raw_string_start(s: &str) -> Option<usize> {
    let s = s.strip_prefix('b').unwrap_or(s).strip_prefix('r')?;
    let hashes = s.len() - s.trim_start_matches('#').len();
    s[hashes..].starts_with('"').then_some(hashes)
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The first path segment of each item of a `{..}` group that starts `s`.
fn group_heads(s: &str) -> Vec<&str> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut item_start = 1;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' | ',' if depth == 1 => {
                heads.push(ident_at(s[item_start..i].trim_start()));
                item_start = i + 1;
                if c == '}' {
                    break;
                }
            }
            '}' => depth -= 1,
            _ => {}
        }
    }
    heads
}

/// Modules that `code` (of one module) refers to, among `modules`.
fn references(code: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for prefix in ["crate", "super"] {
        let pat = format!("{prefix}::");
        for (at, _) in code.match_indices(&pat) {
            // A whole word: not `foo_crate::`.
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let rest = code[at + pat.len()..].trim_start();
            let heads = if rest.starts_with('{') {
                group_heads(rest)
            } else {
                vec![ident_at(rest)]
            };
            found.extend(
                heads
                    .into_iter()
                    .filter(|h| modules.contains(*h))
                    .map(str::to_owned),
            );
        }
    }
    found
}

/// Module name -> the modules it refers to. `main` is the crate root.
fn graph(files: &[(String, String)]) -> Graph {
    let modules: BTreeSet<String> = files
        .iter()
        .map(|(n, _)| n.clone())
        .filter(|n| n != "main")
        .collect();
    files
        .iter()
        .map(|(name, src)| {
            let mut refs = references(&code_only(src), &modules);
            refs.remove(name);
            (name.clone(), refs)
        })
        .collect()
}

/// A cycle of `g` as a path `a -> b -> .. -> a`, if there is one.
fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        New,
        Open,
        Done,
    }
    fn visit<'a>(
        n: &'a str,
        g: &'a Graph,
        state: &mut BTreeMap<&'a str, State>,
        path: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        state.insert(n, State::Open);
        path.push(n);
        for m in g.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(State::New) {
                State::Open => {
                    let start = path.iter().position(|p| p == m).unwrap();
                    let mut cycle: Vec<String> =
                        path[start..].iter().map(|s| s.to_string()).collect();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                State::New => {
                    if let Some(c) = visit(m, g, state, path) {
                        return Some(c);
                    }
                }
                State::Done => {}
            }
        }
        path.pop();
        state.insert(n, State::Done);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.keys() {
        if state.get(n.as_str()).copied().unwrap_or(State::New) == State::New {
            if let Some(c) = visit(n, g, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

fn read_src(dir: &Path) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            (name, fs::read_to_string(&p).unwrap())
        })
        .collect();
    files.sort();
    files
}

#[test]
fn xtask_modules_are_acyclic() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = graph(&read_src(&dir));
    assert!(g.len() > 1, "no modules found in {}", dir.display());
    if let Some(cycle) = find_cycle(&g) {
        panic!(
            "xtask/src modules import each other in a cycle: {}\nall edges: {g:#?}",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn finds_the_edges_and_a_cycle() {
    let f = |n: &str, s: &str| (n.to_owned(), s.to_owned());
    let files = [
        f("main", "mod a; mod b; mod c; fn main() { a::go() }"),
        f("a", "use crate::{\n    b::{self, X},\n    c,\n};\n// crate::d\nfn s() -> &'static str { \"crate::d\" }"),
        f("b", "use crate::util::x; fn f() { let _ = r#\"super::a\"#; let _ = '\"'; super::c::f() }"),
        f("c", "#[cfg(test)]\nmod tests { use super::*; }\nfn f() { crate::a::go() }"),
        f("d", ""),
    ];
    let g = graph(&files);
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(g["a"], set(&["b", "c"]));
    assert_eq!(g["b"], set(&["c"]));
    assert_eq!(g["c"], set(&["a"]));
    assert_eq!(g["main"], set(&[]));
    assert_eq!(find_cycle(&g).unwrap(), ["a", "b", "c", "a"]);

    let mut acyclic = g.clone();
    acyclic.get_mut("c").unwrap().clear();
    assert_eq!(find_cycle(&acyclic), None);
}
