//! A process's resident memory from `/proc/PID/status` (`RssAnon`,
//! `RssFile`, `RssShmem`, `VmSwap`, `VmHWM`, in kB).

use crate::recording::memory::MemPoint;

pub struct Status {
    pub point: MemPoint,
    pub hwm: u64,
}

/// None when the process is gone or the file lacks the fields.
pub fn read(pid: u32) -> Option<Status> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse(&text)
}

fn parse(text: &str) -> Option<Status> {
    let field = |name: &str| -> Option<u64> {
        text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()).map(|kb| kb * 1024)
    };
    let (anon, file, shmem) = (field("RssAnon")?, field("RssFile")?, field("RssShmem")?);
    let point = MemPoint { t_ns: 0, rss: anon + file + shmem, anon, file, shmem, swap: field("VmSwap").unwrap_or(0) };
    Some(Status { point, hwm: field("VmHWM").unwrap_or(0) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_fields() {
        let s = parse("Name:\tpython3\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\nRssAnon:\t    6144 kB\nRssFile:\t    4000 kB\nRssShmem:\t      96 kB\nVmSwap:\t       8 kB\n").unwrap();
        assert_eq!((s.point.rss, s.point.anon, s.point.file, s.point.shmem, s.point.swap, s.hwm), (10240 << 10, 6144 << 10, 4000 << 10, 96 << 10, 8 << 10, 20480 << 10));
        assert!(parse("Name:\tkthreadd\n").is_none());
        assert!(read(std::process::id()).is_some());
    }
}
