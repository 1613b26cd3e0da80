//! Flame graph SVG, rendered in-process with inferno from the folded stacks
//! of [`super::folded`].

use super::folded::{self, Profile};
use crate::recording::Recording;

#[derive(Debug, thiserror::Error)]
pub enum SvgError {
    /// The recording has no stacks for this profile (sampling off, nothing
    /// ran, or everything was filtered out).
    #[error("no stacks to draw for this profile")]
    Empty,
    #[error("cannot render the flame graph: {0}")]
    Render(#[from] std::io::Error),
}

/// A flame graph of `rec` for `profile`, as an SVG document.
pub fn render(rec: &Recording, profile: Profile) -> Result<String, SvgError> {
    let folded = folded::render(rec, profile);
    if folded.is_empty() {
        return Err(SvgError::Empty);
    }
    let mut opt = inferno::flamegraph::Options::default();
    opt.title = format!("infertrace {}", profile.title());
    opt.subtitle = Some(match profile {
        Profile::Cpu if rec.sample_hz > 0 => format!("CPU samples at {} Hz", rec.sample_hz),
        Profile::Cpu => "CPU samples".to_owned(),
        Profile::OffCpu => "time blocked off CPU, microseconds".to_owned(),
        Profile::Wall => "on-CPU and off-CPU time, microseconds".to_owned(),
        Profile::Memory => format!(
            "resident memory growth, bytes (a stack sampled per {} grown)",
            crate::report::fmt::fmt_bytes(rec.memory.as_ref().map_or(0, |m| m.growth_sample_bytes))
        ),
    });
    opt.count_name = profile.unit().to_owned();
    // Java semantics: `_[k]` kernel frames orange, `::` (C++/Rust) yellow.
    opt.colors = inferno::flamegraph::Palette::Multi(inferno::flamegraph::color::MultiPalette::Java);
    // Same input, same colors.
    opt.deterministic = true;
    let mut out = Vec::new();
    inferno::flamegraph::from_lines(&mut opt, folded.lines(), &mut out)?;
    String::from_utf8(out).map_err(|e| SvgError::Render(std::io::Error::other(e)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::folded::tests::stacks_sample;

    #[test]
    fn flame_graph_svg() {
        let rec = stacks_sample();
        let svg = render(&rec, Profile::Cpu).unwrap();
        assert!(svg.contains("<svg"));
        assert!(svg.contains("infertrace on-CPU"));
        assert!(svg.contains("ksys_read"));
        assert!(!svg.contains("ksys_read_[k]"), "annotation stripped");
        assert!(svg.contains("main"));
        assert!(svg.contains("demo"));
        let wall = render(&rec, Profile::Wall).unwrap();
        assert!(wall.contains("[off-cpu: io]"));
        assert!(wall.contains("clock_nanosleep"));
    }

    #[test]
    fn hostile_names_are_escaped() {
        let mut rec = stacks_sample();
        rec.stacks[0].frames[0].function = "<script>alert(1)</script>&\x1b]0;PWNED\x07\u{9b}2J".into();
        rec.targets[0].comm = "\"demo\n\x00".into();
        let svg = render(&rec, Profile::Cpu).unwrap();
        assert!(!svg.contains("<script>"), "markup passed through");
        assert!(svg.contains("&lt;script&gt;alert(1)&lt;/script&gt;&amp;\\x1b]0:PWNED\\x07\\u{9b}2J"), "{svg}");
        let bad: Vec<char> = svg.chars().filter(|c| c.is_control() && !matches!(c, '\n' | '\t' | '\r')).collect();
        assert!(bad.is_empty(), "control characters in the SVG: {bad:?}");
    }

    #[test]
    fn empty_is_an_error() {
        let mut rec = stacks_sample();
        rec.stacks.clear();
        assert!(matches!(render(&rec, Profile::OffCpu), Err(SvgError::Empty)));
    }
}
