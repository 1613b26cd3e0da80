//! Address ranges of a few kernel functions, from `/proc/kallsyms`: a
//! function runs from its address to the next symbol's above it (kallsyms
//! has no sizes). Read once per process, for the names asked on the first
//! call (`ranges`).

use std::collections::HashMap;

/// [start, end) of a kernel function.
pub type Range = (u64, u64);

/// The ranges of `names` found in kallsyms text `text`. A name absent, or
/// every address 0 (symbols hidden from this user: `kptr_restrict`), has
/// none.
pub fn ranges_in(text: &str, names: &[&str]) -> HashMap<String, Range> {
    let mut starts: HashMap<String, u64> = HashMap::new();
    let mut addrs: Vec<u64> = Vec::new();
    for line in text.lines() {
        let mut it = line.split_ascii_whitespace();
        let (Some(addr), Some(_kind), Some(name)) = (it.next(), it.next(), it.next()) else { continue };
        let Ok(addr) = u64::from_str_radix(addr, 16) else { continue };
        if addr == 0 {
            continue;
        }
        addrs.push(addr);
        if names.contains(&name) {
            starts.entry(name.to_owned()).or_insert(addr);
        }
    }
    addrs.sort_unstable();
    addrs.dedup();
    starts
        .into_iter()
        .filter_map(|(name, start)| {
            let i = addrs.partition_point(|a| *a <= start);
            addrs.get(i).map(|end| (name, (start, *end)))
        })
        .collect()
}

/// `ranges_in` over this machine's `/proc/kallsyms` (empty when unreadable).
pub fn ranges(names: &[&str]) -> HashMap<String, Range> {
    std::fs::read_to_string("/proc/kallsyms").map(|t| ranges_in(&t, names)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_function_ends_at_the_next_symbol() {
        let text = "ffffffff81000c90 T asm_int80_emulation\nffffffff81000c60 T asm_exc_page_fault\n\
                    ffffffff82241080 T exc_page_fault\nffffffff822417f0 T __pfx_get_cpu_entry_area\n\
                    ffffffffc0000000 t helper\t[mod]\n";
        let r = ranges_in(text, &["asm_exc_page_fault", "exc_page_fault", "helper", "absent"]);
        assert_eq!(r.get("asm_exc_page_fault"), Some(&(0xffffffff81000c60, 0xffffffff81000c90)));
        assert_eq!(r.get("exc_page_fault"), Some(&(0xffffffff82241080, 0xffffffff822417f0)));
        // The last symbol has no end: no range.
        assert_eq!(r.get("helper"), None);
        assert_eq!(r.get("absent"), None);
        let hidden = "0000000000000000 T asm_exc_page_fault\n0000000000000000 T exc_page_fault\n";
        assert!(ranges_in(hidden, &["asm_exc_page_fault"]).is_empty());
    }

    #[test]
    fn this_kernel_has_its_page_fault_entry() {
        let r = ranges(&["handle_mm_fault"]);
        let Some((s, e)) = r.get("handle_mm_fault").copied() else {
            infertrace_e2e::skip("this_kernel_has_its_page_fault_entry", "kernel addresses in /proc/kallsyms (hidden: not root, or kptr_restrict)");
            return;
        };
        assert!(s < e && e - s < 1 << 20, "{s:#x}..{e:#x}");
    }
}
