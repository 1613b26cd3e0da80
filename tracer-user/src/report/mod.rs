//! Rendering a recording, one module per output format: [`text`] (the
//! human report, one module per section), [`json`], [`folded`] (flame graph
//! input), [`svg`] (the flame graph itself) and [`dump`] (the `infertrace
//! dump` command's text and JSON). [`rows`] shapes the data the formats
//! share (per-process syscall tables); [`fmt`] holds the formatting helpers
//! (durations, bytes, rates, histograms). [`speedscope`] and [`pprof`] write
//! the profile formats of those tools, [`perfetto`] the timeline as a Perfetto trace.

pub mod async_dump;
pub mod diff;
pub mod dump;
pub mod findings;
pub mod fmt;
pub mod folded;
#[cfg(test)]
mod fuzz;
pub mod html;
pub mod json;
pub mod perfetto;
pub mod pprof;
pub mod rows;
pub mod speedscope;
pub mod svg;
pub mod text;
pub mod timeline_summary;
pub mod verdict;

/// Version of the JSON report schema (docs/report-schema.md). Additive
/// changes keep it; a breaking change bumps it.
pub const SCHEMA_VERSION: u32 = 1;
