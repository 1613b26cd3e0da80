//! `# @name` markers in workload sources: the lines tests look for.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

/// `# @name` / `/* @name */` markers of a source file -> line (1-based).
pub fn markers_of(source: &Path) -> BTreeMap<String, u64> {
    let text = fs::read_to_string(source).unwrap_or_else(|e| panic!("{}: {e}", source.display()));
    text.lines()
        .enumerate()
        .filter_map(|(i, l)| {
            let (_, m) = l.rsplit_once("# @").or_else(|| l.rsplit_once("/* @"))?;
            Some((m.trim_end_matches("*/").trim().to_string(), i as u64 + 1))
        })
        .collect()
}

/// The Python function (`def NAME(`, the last one above) holding `marker`
/// in `source`.
pub fn function_of(source: &Path, marker: &str) -> String {
    let text = fs::read_to_string(source).unwrap_or_else(|e| panic!("{}: {e}", source.display()));
    let mut current = String::new();
    for line in text.lines() {
        if let Some(rest) = line.trim_start().strip_prefix("def ") {
            current = rest.split('(').next().unwrap_or("").to_owned();
        }
        if line.trim_end().ends_with(&format!("# @{marker}")) {
            return current;
        }
    }
    panic!("no marker @{marker} in {}", source.display());
}
