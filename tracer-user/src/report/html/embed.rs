//! Data for the page's scripts, embedded as JSON in a
//! `<script type="application/json">` element: the one place where text
//! from the recording meets a script context. `<`, `>` and `&` are written
//! as `\u003c` ... so that no name (`</script>`, `<!--`) can end the element,
//! and U+2028/U+2029 so that the text is valid in any JavaScript parser.

use serde::Serialize;

/// `value` as JSON that is inert inside a `<script>` element.
pub fn script_json(value: &impl Serialize) -> String {
    let json = serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"error\":{:?}}}", e.to_string()));
    let mut out = String::with_capacity(json.len() + 64);
    for c in json.chars() {
        match c {
            // Only ever inside JSON strings: outside them JSON has none of these.
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_can_close_the_script_element() {
        let hostile = vec!["</script><script>alert(1)</script>", "<!--", "a&b", "\u{2028}", "\"quoted\""];
        let s = script_json(&hostile);
        assert!(!s.contains('<') && !s.contains('>') && !s.contains('&'), "{s}");
        let back: Vec<String> = serde_json::from_str(&s).unwrap();
        assert_eq!(back, hostile);
    }
}
