//! Bytecode offset -> source line, for the three line table formats of
//! CPython 3.8 .. 3.13 (`Objects/lnotab_notes.txt`, `Objects/locations.md`
//! and `PyCode_Addr2Line` in each version's `Objects/codeobject.c`).
//!
//! All functions take the byte offset of an instruction in the code
//! (`co_code` / `co_code_adaptive`), the code object's `co_firstlineno` and
//! the raw bytes of its table, and return the line CPython itself reports
//! for that instruction (`None` where CPython says -1: no line).

/// Which table a code object carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineFormat {
    /// 3.8, 3.9 `co_lnotab`: (byte offset increment u8, line increment i8) pairs.
    Lnotab,
    /// 3.10 `co_linetable`: (byte range length u8, line delta i8) pairs,
    /// -128 = no line.
    Linetable310,
    /// 3.11+ location table: variable-length entries, one per run of code units.
    Locations,
}

/// The line of the instruction at byte offset `addr` (negative: the frame
/// has not started yet, CPython answers `co_firstlineno`).
pub fn line_for(format: LineFormat, table: &[u8], firstlineno: i32, addr: i64) -> Option<u32> {
    if addr < 0 {
        return u32::try_from(firstlineno).ok();
    }
    let line = match format {
        LineFormat::Lnotab => lnotab(table, firstlineno, addr),
        LineFormat::Linetable310 => linetable310(table, firstlineno, addr),
        LineFormat::Locations => locations(table, firstlineno, addr),
    }?;
    u32::try_from(line).ok()
}

/// `line_for` over the first bytes of a table (a copy that cut it): `None`
/// for an instruction past what those bytes cover, rather than a guess.
pub fn line_for_prefix(format: LineFormat, table: &[u8], firstlineno: i32, addr: i64) -> Option<u32> {
    if addr < 0 {
        return line_for(format, table, firstlineno, addr);
    }
    let table = match format {
        // Pairs: drop a lone last byte; an address at or past the sum of
        // the increments may belong to a pair that was cut.
        LineFormat::Lnotab => {
            let t = &table[..table.len() & !1];
            let covered: i64 = t.chunks_exact(2).map(|p| i64::from(p[0])).sum();
            if addr >= covered {
                return None;
            }
            t
        }
        LineFormat::Linetable310 => &table[..table.len() & !1],
        // Entries: drop the last one (its varints may be cut).
        LineFormat::Locations => match table.iter().rposition(|b| b & 0x80 != 0) {
            Some(last) => &table[..last],
            None => &[][..],
        },
    };
    line_for(format, table, firstlineno, addr)
}

/// 3.8/3.9 `PyCode_Addr2Line`: walk the pairs while the accumulated address
/// stays <= `addr`.
fn lnotab(table: &[u8], firstlineno: i32, addr: i64) -> Option<i32> {
    let mut line = firstlineno;
    let mut a: i64 = 0;
    for pair in table.chunks_exact(2) {
        a += i64::from(pair[0]);
        if a > addr {
            break;
        }
        line += i32::from(pair[1] as i8);
    }
    Some(line)
}

/// 3.10 `_PyCode_CheckLineNumber` over `co_linetable`: each pair is one
/// address range [start, start + len) with the line moved by the delta
/// (-128: the range has no line, the running line does not move).
fn linetable310(table: &[u8], firstlineno: i32, addr: i64) -> Option<i32> {
    let mut computed = firstlineno;
    let mut end: i64 = 0;
    for pair in table.chunks_exact(2) {
        let start = end;
        end += i64::from(pair[0]);
        let delta = pair[1] as i8;
        let line = if delta == -128 {
            None
        } else {
            computed += i32::from(delta);
            Some(computed)
        };
        if start <= addr && addr < end {
            return line;
        }
    }
    None
}

/// 3.11+ location table: an entry starts with a byte whose top bit is set;
/// bits 3-6 are the code, bits 0-2 the length - 1 in code units (2 bytes).
fn locations(table: &[u8], firstlineno: i32, addr: i64) -> Option<i32> {
    let mut computed = firstlineno;
    let mut end: i64 = 0;
    let mut i = 0;
    while i < table.len() {
        let first = table[i];
        if first & 0x80 == 0 {
            // Not at an entry start: the table is corrupt (or a torn read).
            return None;
        }
        let code = (first >> 3) & 0x0f;
        let start = end;
        end += (i64::from(first & 7) + 1) * 2;
        let delta = match code {
            // PY_CODE_LOCATION_INFO_NONE
            15 => 0,
            // _LONG and _NO_COLUMNS: a signed varint follows.
            13 | 14 => read_svarint(table, i + 1).unwrap_or(0),
            // _ONE_LINE0.._ONE_LINE2
            10..=12 => i32::from(code - 10),
            // short forms: same line
            _ => 0,
        };
        computed += delta;
        let line = if code == 15 { None } else { Some(computed) };
        if start <= addr && addr < end {
            return line;
        }
        // Skip to the next entry start.
        i += 1;
        while i < table.len() && table[i] & 0x80 == 0 {
            i += 1;
        }
    }
    None
}

fn read_varint(table: &[u8], mut i: usize) -> Option<u32> {
    let mut b = *table.get(i)?;
    let mut val = u32::from(b & 63);
    let mut shift = 0;
    while b & 64 != 0 {
        i += 1;
        b = *table.get(i)?;
        shift += 6;
        if shift >= 32 {
            return None;
        }
        val |= u32::from(b & 63) << shift;
    }
    Some(val)
}

fn read_svarint(table: &[u8], i: usize) -> Option<i32> {
    let u = read_varint(table, i)?;
    Some(if u & 1 != 0 { -((u >> 1) as i32) } else { (u >> 1) as i32 })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tables and per-instruction lines produced by the real interpreters
    /// (`co_lines()` on 3.10+, `dis.findlinestarts` on 3.8/3.9) for a sample
    /// with a 300-line gap, a loop, try/except, a one-line expression longer
    /// than 255 bytes of bytecode and a multi-line return.
    const VECTORS: &str = include_str!("testdata/linetables.json");

    #[test]
    fn matches_cpython_for_every_instruction() {
        let all: serde_json::Value = serde_json::from_str(VECTORS).unwrap();
        let mut checked = 0;
        for version in all.as_array().unwrap() {
            let v = version["version"].as_str().unwrap();
            let format = match v {
                "3.8" | "3.9" => LineFormat::Lnotab,
                "3.10" => LineFormat::Linetable310,
                _ => LineFormat::Locations,
            };
            for code in version["codes"].as_array().unwrap() {
                let table = hex(code["table"].as_str().unwrap());
                let first = code["firstlineno"].as_i64().unwrap() as i32;
                for (unit, want) in code["lines"].as_array().unwrap().iter().enumerate() {
                    let want = want.as_u64().map(|l| l as u32);
                    let got = line_for(format, &table, first, unit as i64 * 2);
                    assert_eq!(got, want, "{v} {} offset {}", code["name"], unit * 2);
                    checked += 1;
                }
            }
        }
        assert!(checked > 3000, "only {checked} instructions checked");
    }

    #[test]
    fn a_cut_table_answers_only_what_it_covers() {
        // 3.11+ entries: one-line forms of 2 code units each (4 bytes), lines +1 each.
        let full = [0x80 | (11 << 3) | 1, 0x80 | (11 << 3) | 1, 0x80 | (11 << 3) | 1];
        assert_eq!(line_for(LineFormat::Locations, &full, 10, 9), Some(13));
        assert_eq!(line_for_prefix(LineFormat::Locations, &full, 10, 0), Some(11));
        assert_eq!(line_for_prefix(LineFormat::Locations, &full, 10, 4), Some(12));
        assert_eq!(line_for_prefix(LineFormat::Locations, &full, 10, 9), None, "the last entry may be cut");
        // lnotab: (addr incr, line incr) pairs; past the covered bytes: unknown.
        let lnotab = [4, 1, 4, 1, 4];
        assert_eq!(line_for_prefix(LineFormat::Lnotab, &lnotab, 10, 5), Some(11));
        assert_eq!(line_for_prefix(LineFormat::Lnotab, &lnotab, 10, 8), None);
        assert_eq!(line_for_prefix(LineFormat::Lnotab, &lnotab, 10, -2), Some(10));
    }

    #[test]
    fn not_started_frame_is_first_line() {
        assert_eq!(line_for(LineFormat::Locations, &[], 12, -2), Some(12));
        assert_eq!(line_for(LineFormat::Linetable310, &[], 7, -2), Some(7));
    }

    #[test]
    fn garbage_does_not_panic() {
        let junk: Vec<u8> = (0..=255u8).collect();
        for f in [LineFormat::Lnotab, LineFormat::Linetable310, LineFormat::Locations] {
            for addr in [0, 2, 100, 10_000] {
                let _ = line_for(f, &junk, 1, addr);
                let _ = line_for(f, &[0xff, 0x7f, 0x7f], 1, addr);
            }
        }
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }
}
