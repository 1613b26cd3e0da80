//! Hostile files and bounds for tests of the tracer against roots it must
//! not trust: a sparse ELF file whose symbol table claims gigabytes, a
//! FIFO, and a memory cgroup to run the tracer under (so that a test
//! fails on memory growth rather than taking the machine down).

use std::ffi::CString;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Writes at `path` an ELF64 shared object whose `.dynsym` claims
/// `claimed` bytes (its string table right after it), the file extended
/// (sparse, no blocks) to hold both: a reader that believes the header
/// allocates and reads `claimed` bytes of zeros.
pub fn sparse_elf(path: &Path, claimed: u64) -> std::io::Result<()> {
    let mut h = Vec::with_capacity(64 + 3 * 64);
    h.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
    h.extend_from_slice(&[0; 8]);
    h.extend_from_slice(&3u16.to_le_bytes()); // e_type: ET_DYN
    h.extend_from_slice(&62u16.to_le_bytes()); // e_machine: x86-64
    h.extend_from_slice(&1u32.to_le_bytes()); // e_version
    h.extend_from_slice(&0u64.to_le_bytes()); // e_entry
    h.extend_from_slice(&0u64.to_le_bytes()); // e_phoff
    h.extend_from_slice(&64u64.to_le_bytes()); // e_shoff
    h.extend_from_slice(&0u32.to_le_bytes()); // e_flags
    h.extend_from_slice(&64u16.to_le_bytes()); // e_ehsize
    h.extend_from_slice(&56u16.to_le_bytes()); // e_phentsize
    h.extend_from_slice(&0u16.to_le_bytes()); // e_phnum
    h.extend_from_slice(&64u16.to_le_bytes()); // e_shentsize
    h.extend_from_slice(&3u16.to_le_bytes()); // e_shnum
    h.extend_from_slice(&2u16.to_le_bytes()); // e_shstrndx: the string table
    let section = |h: &mut Vec<u8>, kind: u32, offset: u64, size: u64, link: u32, entsize: u64| {
        h.extend_from_slice(&0u32.to_le_bytes()); // sh_name
        h.extend_from_slice(&kind.to_le_bytes());
        h.extend_from_slice(&2u64.to_le_bytes()); // sh_flags: SHF_ALLOC
        h.extend_from_slice(&0u64.to_le_bytes()); // sh_addr
        h.extend_from_slice(&offset.to_le_bytes());
        h.extend_from_slice(&size.to_le_bytes());
        h.extend_from_slice(&link.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes()); // sh_info
        h.extend_from_slice(&8u64.to_le_bytes()); // sh_addralign
        h.extend_from_slice(&entsize.to_le_bytes());
    };
    h.extend_from_slice(&[0; 64]); // the null section
    let table = 4096u64;
    section(&mut h, 11, table, claimed, 2, 24); // SHT_DYNSYM
    section(&mut h, 3, table + claimed, 4096, 0, 0); // SHT_STRTAB
    let mut f = fs::File::create(path)?;
    f.write_all(&h)?;
    f.set_len(table + claimed + 4096)
}

/// Makes a FIFO at `path`.
pub fn mkfifo(path: &Path) -> Result<(), String> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: NUL-terminated path.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o666) } != 0 {
        return Err(format!("mkfifo {}: {}", path.display(), std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Whether some process has the FIFO at `path` open for reading (or is
/// blocked opening it): a non-blocking open for writing succeeds only then.
pub fn fifo_has_reader(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_WRONLY | libc::O_NONBLOCK | libc::O_CLOEXEC) };
    if fd >= 0 {
        // SAFETY: our own descriptor.
        unsafe { libc::close(fd) };
        return true;
    }
    false
}

/// A memory cgroup of its own (v2 where the memory controller is there,
/// else v1's `memory` hierarchy), removed on drop: what runs in it is
/// bounded by `limit` bytes and its peak is read back.
pub struct MemCgroup {
    dir: PathBuf,
    v2: bool,
}

impl MemCgroup {
    pub fn new(tag: &str, limit: u64) -> Result<MemCgroup, String> {
        let name = format!("infertrace-e2e-{tag}-{}", std::process::id());
        let own = fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("/proc/self/cgroup: {e}"))?;
        let v2_controllers = fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").unwrap_or_default();
        let (dir, v2) = if v2_controllers.split_whitespace().any(|c| c == "memory") {
            let rel = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap_or("/");
            // A v2 cgroup with processes cannot have children with
            // controllers: use the root's level when ours is not empty.
            let parent = Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/'));
            let parent = if fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap_or_default().contains("memory") {
                parent
            } else {
                PathBuf::from("/sys/fs/cgroup")
            };
            (parent.join(&name), true)
        } else if Path::new("/sys/fs/cgroup/memory/cgroup.procs").exists() {
            let rel = own
                .lines()
                .find_map(|l| {
                    let mut f = l.splitn(3, ':');
                    let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
                    ctl.split(',').any(|c| c == "memory").then(|| path.to_owned())
                })
                .unwrap_or_else(|| "/".into());
            let parent = Path::new("/sys/fs/cgroup/memory").join(rel.trim_start_matches('/'));
            let parent = if parent.is_dir() { parent } else { PathBuf::from("/sys/fs/cgroup/memory") };
            (parent.join(&name), false)
        } else {
            return Err("no memory cgroup controller (neither cgroup v2's nor v1's /sys/fs/cgroup/memory)".into());
        };
        let _ = fs::remove_dir(&dir);
        fs::create_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let cg = MemCgroup { dir, v2 };
        let (file, value) = if v2 { ("memory.max", limit.to_string()) } else { ("memory.limit_in_bytes", limit.to_string()) };
        fs::write(cg.dir.join(file), value).map_err(|e| format!("writing {}: {e}", cg.dir.join(file).display()))?;
        if v2 {
            let _ = fs::write(cg.dir.join("memory.swap.max"), "0");
        } else {
            let _ = fs::write(cg.dir.join("memory.memsw.limit_in_bytes"), limit.to_string());
        }
        Ok(cg)
    }

    /// `cmd` run inside the cgroup: a shell moves itself in, then execs it.
    pub fn command(&self, program: &Path, args: &[&std::ffi::OsStr]) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c").arg(r#"echo $$ > "$0" && exec "$@""#).arg(self.dir.join("cgroup.procs")).arg(program).args(args);
        c
    }

    /// The most memory used at once, in bytes.
    pub fn peak(&self) -> Option<u64> {
        let file = if self.v2 { "memory.peak" } else { "memory.max_usage_in_bytes" };
        fs::read_to_string(self.dir.join(file)).ok()?.trim().parse().ok()
    }

    /// How many processes the kernel killed here for memory.
    pub fn oom_kills(&self) -> u64 {
        let (file, key) = if self.v2 { ("memory.events", "oom_kill") } else { ("memory.oom_control", "oom_kill") };
        fs::read_to_string(self.dir.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}
