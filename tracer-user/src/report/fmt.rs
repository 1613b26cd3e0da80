//! Formatting helpers shared by the text report's sections and by the CUDA
//! detector's finding messages: durations (two styles, see below), byte
//! counts, throughputs, and bpftrace-style rows of log2 histograms.
//!
//! Two duration styles coexist because the report's sections have always
//! printed them differently: [`fmt_duration`] (`10.50 ms`, `4.5 us`) in the
//! syscall, wall-time and Python sections, [`fmt_ns`] (`10.5 ms`, `4.5 µs`)
//! in the CUDA and GPU sections and in findings.
//!
//! [`printable`] is the one escaping rule for text printed to a terminal:
//! every name, path and argument a text renderer prints (they come from the
//! traced processes, or from a recording file that anyone can craft) goes
//! through it, so that a thread named `"\x1b]0;PWNED\x07"` cannot retitle
//! or clear the reader's terminal, nor a `\n` in a name forge a line.
//!
//! Values come from a recording file, which may be hostile or inconsistent
//! (a part larger than its whole, `u64::MAX`): [`share`], [`fmt_share`] and
//! [`bar_cells`] are the one place that turns a part of a whole into a
//! percentage or a bar length, clamped to the whole and flagged when it
//! exceeded it; [`saturating_sum`] adds without overflowing. Every text
//! section uses them, so no value can make a renderer allocate, panic or
//! print more than its column.

use std::{borrow::Cow, fmt::Write as _};

/// Width of the bar of a histogram row, in characters.
const BAR_WIDTH: u64 = 40;

/// `850 ns`, `4.5 us`, `10.50 ms`, `1.234 s`.
pub fn fmt_duration(ns: u64) -> String {
    match ns {
        n if n < 1_000 => format!("{n} ns"),
        n if n < 1_000_000 => format!("{:.1} us", n as f64 / 1e3),
        n if n < 1_000_000_000 => format!("{:.2} ms", n as f64 / 1e6),
        n => format!("{:.3} s", n as f64 / 1e9),
    }
}

/// `850 ns`, `4.5 µs`, `10.5 ms`, `1.23 s`.
pub fn fmt_ns(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        format!("{:.2} s", ns as f64 / 1e9)
    } else if ns >= 1_000_000 {
        format!("{:.1} ms", ns as f64 / 1e6)
    } else if ns >= 1_000 {
        format!("{:.1} µs", ns as f64 / 1e3)
    } else {
        format!("{ns} ns")
    }
}

/// `512ns`, `16us`, `8ms`, `2s` for power-of-two bucket edges.
pub fn fmt_ns_short(ns: u64) -> String {
    match ns {
        n if n < 1_000 => format!("{n}ns"),
        n if n < 1_000_000 => format!("{}us", n / 1_000),
        n if n < 1_000_000_000 => format!("{}ms", n / 1_000_000),
        n => format!("{}s", n / 1_000_000_000),
    }
}

/// Bytes in binary units: `1000 B`, `4.0 KiB`, `1.9 GiB`.
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Bytes per second in decimal units (like GB/s elsewhere in the report).
pub fn fmt_rate(bytes_per_s: f64) -> String {
    const UNITS: [&str; 4] = ["kB/s", "MB/s", "GB/s", "TB/s"];
    if !bytes_per_s.is_finite() || bytes_per_s < 1000.0 {
        return format!("{:.0} B/s", bytes_per_s.max(0.0));
    }
    let mut v = bytes_per_s / 1000.0;
    let mut u = 0;
    while v >= 1000.0 && u < UNITS.len() - 1 {
        v /= 1000.0;
        u += 1;
    }
    format!("{v:.2} {}", UNITS[u])
}

/// Throughput of `bytes` moved in `ns`, in GB/s (bytes per ns) with two
/// decimals; `-` when either is 0.
pub fn gbps(bytes: u64, ns: u64) -> String {
    if ns == 0 || bytes == 0 {
        "-".into()
    } else {
        format!("{:.2}", bytes as f64 / ns as f64)
    }
}

/// Characters a terminal may act on rather than print: C0 controls (and
/// DEL), C1 controls (U+0080-U+009F: U+009B is CSI on some terminals), and
/// the Unicode bidirectional overrides that reorder what is shown.
fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn push_escaped(out: &mut String, c: char) {
    let _ = match c {
        '\n' => write!(out, "\\n"),
        '\r' => write!(out, "\\r"),
        '\t' => write!(out, "\\t"),
        c if (c as u32) < 0x80 => write!(out, "\\x{:02x}", c as u32),
        c => write!(out, "\\u{{{:x}}}", c as u32),
    };
}

/// `s` safe to print on a terminal: control characters (line breaks
/// included) and bidirectional overrides written as escapes (`\n`, `\t`,
/// `\x1b`, `\u{9b}`, `\u{202e}`), everything else unchanged. Borrows when
/// there is nothing to escape.
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if needs_escape(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A whole rendered text, made safe for a terminal: [`printable`] on every
/// line, the line breaks kept. The text renderers escape each name where
/// they print it; this is the last pass over their output, so that a field
/// they forgot cannot reach the terminal raw either.
pub fn printable_text(text: String) -> String {
    if !text.chars().any(|c| c != '\n' && needs_escape(c)) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&printable(line));
    }
    out
}

/// JSON text made safe for a terminal without changing what it says: the
/// characters [`printable`] escapes that JSON leaves raw (DEL, C1 controls,
/// bidirectional overrides; JSON escapes the C0 controls itself) written as
/// `\uXXXX`. Outside strings JSON is plain ASCII, so they only occur inside
/// strings, where the escape decodes to the same character.
pub fn printable_json(json: String) -> String {
    if !json.chars().any(needs_escape) {
        return json;
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if needs_escape(c) && !matches!(c, '\n' | '\r' | '\t') {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    out
}

/// [`printable_json`] as a writer: JSON streamed through it comes out
/// escaped the same way, without the whole text in memory (the agent's
/// `/report/latest` of a busy window is tens of MB). A character split
/// across two writes is held until its last byte arrives.
pub struct PrintableJsonWriter<W: std::io::Write> {
    inner: W,
    /// The start of a UTF-8 sequence whose end has not been written yet.
    pending: Vec<u8>,
}

impl<W: std::io::Write> PrintableJsonWriter<W> {
    pub fn new(inner: W) -> Self {
        PrintableJsonWriter { inner, pending: Vec::new() }
    }

    /// The inner writer, after what was held back is written as it is.
    pub fn into_inner(mut self) -> std::io::Result<W> {
        let rest = std::mem::take(&mut self.pending);
        self.inner.write_all(&rest)?;
        Ok(self.inner)
    }

    fn put(&mut self, text: &str) -> std::io::Result<()> {
        if !text.chars().any(needs_escape) {
            return self.inner.write_all(text.as_bytes());
        }
        let mut run = 0;
        for (i, c) in text.char_indices() {
            if needs_escape(c) && !matches!(c, '\n' | '\r' | '\t') {
                self.inner.write_all(&text.as_bytes()[run..i])?;
                write!(self.inner, "\\u{:04x}", c as u32)?;
                run = i + c.len_utf8();
            }
        }
        self.inner.write_all(&text.as_bytes()[run..])
    }
}

impl<W: std::io::Write> std::io::Write for PrintableJsonWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let joined;
        let bytes: &[u8] = if self.pending.is_empty() {
            buf
        } else {
            joined = [std::mem::take(&mut self.pending).as_slice(), buf].concat();
            &joined
        };
        let mut at = 0;
        while at < bytes.len() {
            match std::str::from_utf8(&bytes[at..]) {
                Ok(text) => {
                    self.put(text)?;
                    at = bytes.len();
                }
                Err(e) => {
                    let valid = at + e.valid_up_to();
                    // The first `valid_up_to` bytes are UTF-8 by definition.
                    self.put(std::str::from_utf8(&bytes[at..valid]).unwrap_or_default())?;
                    match e.error_len() {
                        // Not UTF-8 (never from serde_json): passed on as is.
                        Some(n) => {
                            self.inner.write_all(&bytes[valid..valid + n])?;
                            at = valid + n;
                        }
                        // A character cut at the end of this write.
                        None => {
                            self.pending.extend_from_slice(&bytes[valid..]);
                            at = bytes.len();
                        }
                    }
                }
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A part of a whole, as a share for display.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Share {
    /// Percent of the whole, clamped to 0..=100 (0 when the whole is 0 and the part too).
    pub percent: f64,
    /// The part exceeded the whole (or the whole was 0 and the part was not):
    /// `percent` was clamped, the values are inconsistent.
    pub over: bool,
}

/// `part` as a share of `whole`, clamped to 100% and flagged beyond it.
pub fn share(part: u64, whole: u64) -> Share {
    if part > whole {
        return Share { percent: 100.0, over: true };
    }
    if whole == 0 {
        return Share { percent: 0.0, over: false };
    }
    Share { percent: (part as f64 * 100.0 / whole as f64).clamp(0.0, 100.0), over: false }
}

/// `part` of `whole` as `" 42.0%"` (6 characters, like `{:5.1}%`); a part
/// beyond the whole prints `"100.0%!"`: clamped and flagged.
pub fn fmt_share(part: u64, whole: u64) -> String {
    let s = share(part, whole);
    format!("{:5.1}%{}", s.percent, if s.over { "!" } else { "" })
}

/// Cells of a bar `width` wide that `part` of `whole` fills (rounded to the
/// nearest cell): never more than `width`, whatever the values.
pub fn bar_cells(part: u64, whole: u64, width: usize) -> usize {
    let part = part.min(whole);
    if whole == 0 {
        return 0;
    }
    let cells = (u128::from(part) * width as u128 + u128::from(whole) / 2) / u128::from(whole);
    usize::try_from(cells).unwrap_or(width).min(width)
}

/// The sum of `values`, saturating at `u64::MAX` instead of overflowing.
pub fn saturating_sum(values: impl IntoIterator<Item = u64>) -> u64 {
    values.into_iter().fold(0u64, u64::saturating_add)
}

/// bpftrace-style rows of a log2 ns histogram, from the first to the last
/// non-empty bucket.
pub fn histogram_rows(out: &mut String, hist: &[u64]) {
    let first = hist.iter().position(|&c| c > 0);
    let last = hist.iter().rposition(|&c| c > 0);
    let (Some(first), Some(last)) = (first, last) else { return };
    let peak = hist.iter().copied().max().unwrap_or(1).max(1);
    // Recordings from elsewhere may hold more buckets than 64: the edges
    // saturate rather than overflow the shift.
    let edge = |i: usize| 1u64.checked_shl(i as u32).unwrap_or(u64::MAX);
    for (i, &c) in hist.iter().enumerate().take(last + 1).skip(first) {
        let lo = if i == 0 { 0 } else { edge(i) };
        let hi = edge(i + 1);
        let cells = (u128::from(c) * u128::from(BAR_WIDTH)).div_ceil(u128::from(peak)).min(u128::from(BAR_WIDTH));
        let bar = "@".repeat(cells as usize);
        let _ = writeln!(out, "  [{:>7}, {:>7}) {:>9} |{:<40}|", fmt_ns_short(lo), fmt_ns_short(hi), c, bar);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_json_writer_escapes_like_printable_json_across_any_split() {
        use std::io::Write as _;
        let json = "{\"a\": \"x\u{202e}y\u{7f}z\u{85}\u{e9}\",\n  \"b\": \"\u{2069}\"}\n".to_owned();
        let want = printable_json(json.clone());
        assert_ne!(want, json, "the sample must need escapes");
        let bytes = json.as_bytes();
        // Every split point, also inside a multi-byte character.
        for cut in 0..=bytes.len() {
            let mut w = PrintableJsonWriter::new(Vec::new());
            w.write_all(&bytes[..cut]).unwrap();
            w.write_all(&bytes[cut..]).unwrap();
            assert_eq!(String::from_utf8(w.into_inner().unwrap()).unwrap(), want, "split at {cut}");
        }
        // One byte at a time.
        let mut w = PrintableJsonWriter::new(Vec::new());
        for b in bytes {
            w.write_all(std::slice::from_ref(b)).unwrap();
        }
        assert_eq!(String::from_utf8(w.into_inner().unwrap()).unwrap(), want);
    }

    use super::*;

    #[test]
    fn durations() {
        assert_eq!(fmt_duration(10_500_000), "10.50 ms");
        assert_eq!(fmt_ns_short(8_388_608), "8ms");
    }

    #[test]
    fn printable_escapes_what_a_terminal_acts_on() {
        assert!(matches!(printable("python3 worker-1 /srv/app.py µs"), Cow::Borrowed(_)));
        assert_eq!(printable("\x1b]0;PWNED\x07\x1b[2J"), "\\x1b]0;PWNED\\x07\\x1b[2J");
        assert_eq!(printable("a\nb\tc\rd\x7f"), "a\\nb\\tc\\rd\\x7f");
        assert_eq!(printable("csi\u{9b}2J rtl\u{202e}txt"), "csi\\u{9b}2J rtl\\u{202e}txt");
        let text = printable_text("line \x1b[2J one\nline two\n".to_owned());
        assert_eq!(text, "line \\x1b[2J one\nline two\n");
        assert_eq!(printable_text("plain\n".to_owned()), "plain\n");
        let json = serde_json::to_string_pretty(&serde_json::json!({"comm": "a\u{9b}b\u{7f}\u{202e}\x1b\n"})).unwrap();
        let safe = printable_json(json);
        assert!(!safe.chars().any(|c| c != '\n' && needs_escape(c)), "{safe}");
        assert!(safe.contains(r#""a\u009bb\u007f\u202e\u001b\n""#), "{safe}");
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back["comm"], "a\u{9b}b\u{7f}\u{202e}\x1b\n");
    }

    #[test]
    fn rates() {
        assert_eq!(fmt_rate(0.0), "0 B/s");
        assert_eq!(fmt_rate(999.0), "999 B/s");
        assert_eq!(fmt_rate(1_024_000.0), "1.02 MB/s");
        assert_eq!(fmt_rate(2_048_000.0), "2.05 MB/s");
        assert_eq!(fmt_rate(12_500.0), "12.50 kB/s");
        assert_eq!(fmt_rate(3.1e9), "3.10 GB/s");
        assert_eq!(fmt_rate(f64::NAN), "0 B/s");
    }

    #[test]
    fn shares_and_bars_are_clamped_and_flagged() {
        assert_eq!(fmt_share(1, 4), " 25.0%");
        assert_eq!(fmt_share(0, 0), "  0.0%");
        assert_eq!(fmt_share(2_000_000_000, 1), "100.0%!");
        assert_eq!(fmt_share(u64::MAX, 0), "100.0%!");
        assert_eq!(fmt_share(u64::MAX, u64::MAX), "100.0%");
        assert!(share(5, 0).over && !share(5, 5).over);
        assert_eq!(bar_cells(1, 2, 50), 25);
        assert_eq!(bar_cells(2_000_000_000, 1, 50), 50);
        assert_eq!(bar_cells(u64::MAX, u64::MAX, 50), 50);
        assert_eq!(bar_cells(u64::MAX, 0, 50), 0);
        assert_eq!(saturating_sum([u64::MAX, 1, 2]), u64::MAX);
    }

    #[test]
    fn histogram_rows_are_bounded() {
        let mut out = String::new();
        let mut hist = vec![0u64; 70];
        hist[1] = u64::MAX;
        hist[2] = u64::MAX / 3;
        hist[69] = 1;
        histogram_rows(&mut out, &hist);
        assert!(out.lines().all(|l| l.matches('@').count() <= BAR_WIDTH as usize), "{out}");
        assert_eq!(out.lines().count(), 69);
    }
}
