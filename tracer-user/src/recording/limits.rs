//! What reading a recording may cost. A recording is gzip-compressed JSON
//! that anyone can craft: a 1 MB file can inflate to a 1 GiB string, or to
//! a gigabyte of whitespace. [`Guard`] sits between the decompressor and
//! the JSON parser (which streams: it never holds the inflated text, only
//! what it builds) and stops the read, with the reason, when:
//! - the inflated data passes [`ReadLimits::max_inflated`]
//!   ([`DEFAULT_MAX_INFLATED`]; `report --max-inflated` sets it);
//! - past [`DEFAULT_RATIO_FLOOR`], the data inflates more than
//!   [`DEFAULT_MAX_RATIO`] times the compressed bytes read (recordings
//!   compress 5 to 30 times; a gzip bomb about 1000 times): a 1 MB bomb
//!   stops at 100 MB, whatever it holds. An explicit `--max-inflated`
//!   lifts this bound (the user vouches for the file);
//! - one JSON string passes [`MAX_STRING`] bytes (names, paths and
//!   arguments are far shorter: the kernel caps an argument at 128 KiB);
//! - [`MAX_BARE_RUN`] bytes pass outside strings without a `{}[],:`
//!   (whitespace, or a number thousands of digits long: the recorder writes
//!   neither).
//!
//! Nesting depth is bounded by the JSON parser itself (128 levels).

use std::{
    cell::Cell,
    io::{self, Read},
    rc::Rc,
};

/// Default most inflated bytes `report` reads (`--max-inflated`).
pub const DEFAULT_MAX_INFLATED: u64 = 1 << 30;
/// Default most inflated bytes per compressed byte, past the floor.
pub const DEFAULT_MAX_RATIO: u64 = 100;
/// Inflated bytes read before the ratio applies.
pub const DEFAULT_RATIO_FLOOR: u64 = 64 << 20;
/// Longest JSON string (escaped bytes) a recording may hold.
pub const MAX_STRING: u64 = 16 << 20;
/// Longest run of bytes outside strings between two structural characters.
pub const MAX_BARE_RUN: u64 = 64 << 10;

/// Bounds on what reading one recording may inflate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadLimits {
    /// Most bytes of JSON the compressed stream may inflate to.
    pub max_inflated: u64,
    /// Past `ratio_floor` inflated bytes, at most this many per compressed
    /// byte read (None: no such bound).
    pub max_ratio: Option<u64>,
    pub ratio_floor: u64,
}

impl Default for ReadLimits {
    fn default() -> Self {
        ReadLimits { max_inflated: DEFAULT_MAX_INFLATED, max_ratio: Some(DEFAULT_MAX_RATIO), ratio_floor: DEFAULT_RATIO_FLOOR }
    }
}

impl ReadLimits {
    /// A plain bound on the inflated size, no ratio bound (`--max-inflated`).
    pub fn plain(max_inflated: u64) -> Self {
        ReadLimits { max_inflated, max_ratio: None, ratio_floor: 0 }
    }
}

/// Counts the compressed bytes read through it, for [`Guard`]'s ratio.
pub struct Counted<R> {
    inner: R,
    count: Rc<Cell<u64>>,
}

impl<R: Read> Counted<R> {
    /// The reader, and the count it keeps.
    pub fn new(inner: R, already: u64) -> (Self, Rc<Cell<u64>>) {
        let count = Rc::new(Cell::new(already));
        (Counted { inner, count: Rc::clone(&count) }, count)
    }
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.set(self.count.get() + n as u64);
        Ok(n)
    }
}

/// Which bound a read passed, and where (offset in the inflated data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitHit {
    Inflated { limit: u64 },
    /// Inflated `inflated` bytes from `compressed`.
    Ratio { inflated: u64, compressed: u64 },
    String { at: u64 },
    BareRun { at: u64 },
}

/// A [`Read`] that passes the inflated JSON through, counting it and
/// following its lexical structure (inside or outside a string, and how
/// long the current string or bare run is), and fails once a bound is
/// passed. The failure reaches the caller through the parser as an I/O
/// error; [`Guard::hit`] says which bound it was.
pub struct Guard<R> {
    inner: R,
    limits: ReadLimits,
    /// Compressed bytes read so far (None: no ratio bound).
    compressed: Option<Rc<Cell<u64>>>,
    /// Inflated bytes passed through so far.
    offset: u64,
    in_string: bool,
    escaped: bool,
    /// Length of the current string, or of the current bare run.
    run: u64,
    hit: Option<LimitHit>,
}

impl<R: Read> Guard<R> {
    /// `compressed`: the count of compressed bytes read (from [`Counted`]),
    /// for the ratio bound.
    pub fn new(inner: R, limits: ReadLimits, compressed: Option<Rc<Cell<u64>>>) -> Self {
        Guard { inner, limits, compressed, offset: 0, in_string: false, escaped: false, run: 0, hit: None }
    }

    /// The bound that stopped the read, if one did.
    pub fn hit(&self) -> Option<LimitHit> {
        self.hit
    }

    /// Follows `bytes` (which start at `self.offset`); the first bound
    /// passed, if any.
    fn scan(&mut self, bytes: &[u8]) -> Option<LimitHit> {
        for (i, &b) in bytes.iter().enumerate() {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                    self.run = 0;
                    continue;
                }
                self.run += 1;
                if self.run > MAX_STRING {
                    return Some(LimitHit::String { at: self.offset + i as u64 });
                }
            } else {
                match b {
                    b'"' => {
                        self.in_string = true;
                        self.run = 0;
                    }
                    b'{' | b'}' | b'[' | b']' | b',' | b':' => self.run = 0,
                    _ => {
                        self.run += 1;
                        if self.run > MAX_BARE_RUN {
                            return Some(LimitHit::BareRun { at: self.offset + i as u64 });
                        }
                    }
                }
            }
        }
        None
    }
}

impl<R: Read> Read for Guard<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.hit.is_some() {
            return Err(io::Error::other("reading limit passed"));
        }
        // Never ask for more than the limit leaves, plus one byte to see
        // whether the data goes on past it.
        let left = self.limits.max_inflated.saturating_sub(self.offset).saturating_add(1);
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        let end = self.offset + n as u64;
        let compressed = self.compressed.as_ref().map(|c| c.get());
        if end > self.limits.max_inflated {
            self.hit = Some(LimitHit::Inflated { limit: self.limits.max_inflated });
        } else if let (Some(ratio), Some(compressed)) = (self.limits.max_ratio, compressed) {
            if end > self.limits.ratio_floor && end / compressed.max(1) > ratio {
                self.hit = Some(LimitHit::Ratio { inflated: end, compressed });
            }
        }
        if self.hit.is_none() {
            self.hit = self.scan(&buf[..n]);
        }
        self.offset = end;
        match self.hit {
            Some(_) => Err(io::Error::other("reading limit passed")),
            None => Ok(n),
        }
    }
}

/// `1.0 GiB`, `512 MiB`, `64 KiB`, `100 B`: sizes in the limits' messages.
pub fn fmt_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if bytes >= size {
            return if bytes.is_multiple_of(size) {
                format!("{} {unit}", bytes / size)
            } else {
                format!("{:.1} {unit}", bytes as f64 / size as f64)
            };
        }
    }
    format!("{bytes} B")
}

/// Parses a size: a number of bytes with an optional binary unit, `K`,
/// `M`, `G` or `T` (also written `KiB`, `MB`...: all binary), e.g. `512M`,
/// `4GiB`, `1000000`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: u64 = num.parse().map_err(|_| format!("invalid size `{s}` (examples: 512MiB, 4GiB)"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("invalid size unit in `{s}` (use K, M, G or T, e.g. 4GiB)")),
    };
    value.checked_mul(1 << shift).ok_or_else(|| format!("size `{s}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(data: &[u8], max: u64) -> (io::Result<Vec<u8>>, Option<LimitHit>) {
        let mut g = Guard::new(data, ReadLimits::plain(max), None);
        let mut out = Vec::new();
        let r = g.read_to_end(&mut out).map(|_| out);
        (r, g.hit())
    }

    #[test]
    fn passes_json_through_within_bounds() {
        let json = br#"{"a": "x\"y,{", "b": [1, 2.5e3, true, null]}"#;
        let (r, hit) = read_all(json, json.len() as u64);
        assert_eq!(r.unwrap(), json);
        assert_eq!(hit, None);
    }

    #[test]
    fn stops_at_each_bound() {
        let (r, hit) = read_all(&[b' '; 100], 99);
        assert!(r.is_err());
        assert_eq!(hit, Some(LimitHit::Inflated { limit: 99 }));

        let mut long = b"[\"".to_vec();
        long.resize(long.len() + MAX_STRING as usize + 10, b'a');
        let (r, hit) = read_all(&long, u64::MAX);
        assert!(r.is_err());
        assert_eq!(hit, Some(LimitHit::String { at: 2 + MAX_STRING }));

        // An escaped quote does not end the string.
        let mut escaped = b"[\"".to_vec();
        for _ in 0..MAX_STRING {
            escaped.extend_from_slice(b"\\\"");
        }
        assert!(matches!(read_all(&escaped, u64::MAX).1, Some(LimitHit::String { .. })));

        let spaces = vec![b' '; MAX_BARE_RUN as usize + 1];
        assert_eq!(read_all(&spaces, u64::MAX).1, Some(LimitHit::BareRun { at: MAX_BARE_RUN }));

        // Past the floor, no more than `max_ratio` times what was read.
        let limits = ReadLimits { max_inflated: u64::MAX, max_ratio: Some(10), ratio_floor: 1000 };
        let data = b"[1,2],".repeat(1000);
        let compressed = [b'x'; 100];
        let (mut counted, count) = Counted::new(&compressed[..], 0);
        let _ = counted.read_to_end(&mut Vec::new());
        let mut g = Guard::new(&data[..], limits, Some(count));
        assert!(g.read_to_end(&mut Vec::new()).is_err());
        assert!(matches!(g.hit(), Some(LimitHit::Ratio { inflated, compressed: 100 }) if inflated > 1000), "{:?}", g.hit());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size("100"), Ok(100));
        assert_eq!(parse_size("2 kb"), Ok(2048));
        assert!(parse_size("-1").is_err());
        assert!(parse_size("1.5G").is_err());
        assert!(parse_size("4X").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(fmt_size(1 << 30), "1 GiB");
        assert_eq!(fmt_size(1536 << 20), "1.5 GiB");
        assert_eq!(fmt_size(100), "100 B");
    }
}
