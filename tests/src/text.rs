//! Checks of the text report.

use std::collections::BTreeMap;

use crate::parse_strace_table;

/// Whether `text` contains `word` (case-insensitive) as a whole word.
pub fn mentions_word(text: &str, word: &str) -> bool {
    let t = text.to_lowercase();
    let w = word.to_lowercase();
    let is_word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    t.match_indices(&w).any(|(i, _)| {
        !is_word(t[..i].chars().next_back()) && !is_word(t[i + w.len()..].chars().next())
    })
}

/// (calls, errors) per syscall from a strace-like text table printed by
/// `infertrace report` (same layout as `strace -c`).
pub fn parse_text_table(text: &str) -> BTreeMap<String, (u64, u64)> {
    parse_strace_table(text)
}

/// The strace `-c` header line infertrace's text report reproduces.
pub const TEXT_HEADER: &str = "% time     seconds  usecs/call     calls    errors syscall";
