//! Multi-uprobe links (`BPF_TRACE_UPROBE_MULTI`, Linux 6.6+): one link
//! attaches a program to many offsets of one file, each with its cookie,
//! and releasing it waits for one uprobe synchronization for all of them.
//!
//! Why: a perf-event uprobe (what aya 0.14 attaches, one per function and
//! kind) waits for its own synchronizations when released, under the
//! kernel's global `event_mutex`: ~0.1 s each here, 12.8 s for the 124
//! probes of 66 CUDA functions, closed from one thread or from many alike.
//! A multi-uprobe link costs ~50-80 ms to release, and links released from
//! several threads at once share that wait (16 links: ~50 ms in parallel,
//! ~1 s one after another).
//!
//! aya 0.14 can neither load a program for such links (the kernel wants
//! the expected attach type at load time) nor create them, so this module
//! does both through the `bpf` syscall: it parses the embedded object
//! again with aya-obj, relocates the programs it is asked for against the
//! maps aya created (duplicates of their descriptors, [`MapFds`]), and
//! loads them itself.

use std::{
    collections::{BTreeMap, HashMap},
    ffi::CString,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    os::unix::ffi::OsStrExt,
    path::Path,
    sync::OnceLock,
};

use aya::{maps::Map, Ebpf};
use aya_obj::generated::{
    bpf_attach_type::BPF_TRACE_UPROBE_MULTI, bpf_attr, bpf_cmd, bpf_insn, bpf_prog_type::BPF_PROG_TYPE_KPROBE,
    BPF_F_UPROBE_MULTI_RETURN,
};

/// Set (to anything) by tests to take the perf-event path a kernel without
/// multi-uprobe links takes. Not a user setting.
pub const DISABLE_ENV: &str = "INFERTRACE_TEST_NO_UPROBE_MULTI";

#[derive(Debug, thiserror::Error)]
pub enum MultiError {
    #[error("parsing the eBPF object again: {0}")]
    Parse(String),
    #[error("relocating the eBPF object: {0}")]
    Relocate(String),
    #[error("eBPF program `{0}` missing from the object")]
    MissingProgram(&'static str),
    #[error("loading the object's BTF: {0}")]
    Btf(String),
    #[error("loading eBPF program `{name}` for multi-uprobe links failed: {detail}")]
    Load { name: &'static str, detail: String },
    #[error("path {0:?} contains a NUL byte")]
    BadPath(std::path::PathBuf),
    #[error("{0} offsets and {1} cookies")]
    Mismatch(usize, usize),
    #[error("{0}")]
    Attach(std::io::Error),
}

/// Duplicates of the descriptors of the object's maps, by name, taken right
/// after aya loaded it (before any family takes its map out of the
/// [`Ebpf`]): what [`load_programs`] relocates against.
#[derive(Default)]
pub struct MapFds(BTreeMap<String, OwnedFd>);

impl MapFds {
    /// Every map of `ebpf` whose descriptor could be duplicated (one that
    /// could not makes [`load_programs`] fail, and the caller fall back).
    pub fn capture(ebpf: &Ebpf) -> Self {
        let fds = ebpf
            .maps()
            .filter_map(|(name, map)| Some((name.to_owned(), map_fd(map).try_clone_to_owned().ok()?)))
            .collect();
        MapFds(fds)
    }

    /// Duplicates of every descriptor (for a thread of their own).
    pub fn try_clone(&self) -> std::io::Result<Self> {
        self.0.iter().map(|(n, fd)| Ok((n.clone(), fd.try_clone()?))).collect::<std::io::Result<_>>().map(MapFds)
    }

    /// The descriptor of the map `name`.
    pub fn get(&self, name: &str) -> Option<BorrowedFd<'_>> {
        self.0.get(name).map(|fd| fd.as_fd())
    }
}

/// The descriptor of any map (every variant holds its `MapData`).
#[allow(deprecated)]
fn map_fd(map: &Map) -> BorrowedFd<'_> {
    let data = match map {
        Map::Array(d)
        | Map::ArrayOfMaps(d)
        | Map::BloomFilter(d)
        | Map::CgroupArray(d)
        | Map::CgroupStorage(d)
        | Map::CgrpStorage(d)
        | Map::CpuMap(d)
        | Map::DevMap(d)
        | Map::DevMapHash(d)
        | Map::HashMap(d)
        | Map::HashOfMaps(d)
        | Map::InodeStorage(d)
        | Map::LpmTrie(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuCgroupStorage(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuLruHashMap(d)
        | Map::PerfEventArray(d)
        | Map::ProgramArray(d)
        | Map::Queue(d)
        | Map::ReusePortSockArray(d)
        | Map::RingBuf(d)
        | Map::SockHash(d)
        | Map::SockMap(d)
        | Map::SkStorage(d)
        | Map::Stack(d)
        | Map::StackTraceMap(d)
        | Map::Unsupported(d)
        | Map::XskMap(d) => d,
    };
    data.fd().as_fd()
}

fn sys_bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is a valid, zero-initialized bpf_attr of the size
    // passed; the pointers it holds outlive the call.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd as libc::c_long, attr as *mut bpf_attr, std::mem::size_of::<bpf_attr>()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

fn zeroed_attr() -> bpf_attr {
    // SAFETY: bpf_attr is plain old data; all zeroes is its neutral value.
    unsafe { std::mem::zeroed() }
}

/// What [`prog_load`] loads: instructions and, when the object has BTF, the
/// function and line records of the program (bytes as the kernel wants
/// them) with the BTF they refer to.
struct ProgImage<'a> {
    insns: &'a [bpf_insn],
    license: &'a CString,
    btf: Option<(BorrowedFd<'a>, &'a aya_obj::Function)>,
}

/// Loads a KPROBE-type program for multi-uprobe links.
fn prog_load(name: &str, image: &ProgImage<'_>, log: Option<&mut [u8]>) -> std::io::Result<OwnedFd> {
    let ProgImage { insns, license, btf } = image;
    let func_info = btf.map(|(_, f)| f.func_info.func_info_bytes()).unwrap_or_default();
    let line_info = btf.map(|(_, f)| f.line_info.line_info_bytes()).unwrap_or_default();
    let mut attr = zeroed_attr();
    // SAFETY: writing the BPF_PROG_LOAD member of the zeroed union.
    let u = unsafe { &mut attr.__bindgen_anon_3 };
    u.prog_type = BPF_PROG_TYPE_KPROBE as u32;
    u.expected_attach_type = BPF_TRACE_UPROBE_MULTI as u32;
    u.insns = insns.as_ptr() as u64;
    u.insn_cnt = insns.len() as u32;
    u.license = license.as_ptr() as u64;
    // The kernel keeps 15 bytes and a NUL (what aya does too).
    for (dst, src) in u.prog_name.iter_mut().zip(name.bytes().take(15)) {
        *dst = src as libc::c_char;
    }
    if let Some((btf_fd, function)) = btf {
        u.prog_btf_fd = btf_fd.as_raw_fd() as u32;
        if function.func_info_rec_size > 0 {
            u.func_info = func_info.as_ptr() as u64;
            u.func_info_cnt = function.func_info.func_info.len() as u32;
            u.func_info_rec_size = function.func_info_rec_size as u32;
        }
        if function.line_info_rec_size > 0 {
            u.line_info = line_info.as_ptr() as u64;
            u.line_info_cnt = function.line_info.line_info.len() as u32;
            u.line_info_rec_size = function.line_info_rec_size as u32;
        }
    }
    if let Some(buf) = log {
        u.log_level = 1;
        u.log_buf = buf.as_mut_ptr() as u64;
        u.log_size = buf.len() as u32;
    }
    sys_bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr)
}

/// Whether this kernel creates multi-uprobe links (what libbpf checks: a
/// link on `/` fails with EBADF where they exist, EINVAL where not).
/// Tested once per process; false when [`DISABLE_ENV`] is set.
pub fn supported() -> bool {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        if std::env::var_os(DISABLE_ENV).is_some() {
            return false;
        }
        // r0 = 0; exit
        let insns = [
            bpf_insn { code: 0xb7, _bitfield_align_1: [], _bitfield_1: bpf_insn::new_bitfield_1(0, 0), off: 0, imm: 0 },
            bpf_insn { code: 0x95, _bitfield_align_1: [], _bitfield_1: bpf_insn::new_bitfield_1(0, 0), off: 0, imm: 0 },
        ];
        let Ok(license) = CString::new("GPL") else { return false };
        let image = ProgImage { insns: &insns, license: &license, btf: None };
        let Ok(prog) = prog_load("infertrace_prb", &image, None) else { return false };
        match link_create(prog.as_fd(), c"/", &[0], &[0], false) {
            Ok(_) => true,
            Err(e) => e.raw_os_error() == Some(libc::EBADF),
        }
    })
}

/// Loads the object's BTF into the kernel, fixed up as aya does for a
/// kernel that has every BTF feature (any kernel with multi-uprobe links).
fn load_btf(obj: &mut aya_obj::Object) -> Result<Option<OwnedFd>, MultiError> {
    let features = aya_obj::btf::BtfFeatures::new(true, true, true, true, true, true, true, true);
    let Some(btf) = obj.fixup_and_sanitize_btf(&features).map_err(|e| MultiError::Btf(e.to_string()))? else {
        return Ok(None);
    };
    let raw = btf.to_bytes();
    let mut attr = zeroed_attr();
    // SAFETY: writing the BPF_BTF_LOAD member of the zeroed union.
    let u = unsafe { &mut attr.__bindgen_anon_7 };
    u.btf = raw.as_ptr() as u64;
    u.btf_size = raw.len() as u32;
    sys_bpf(bpf_cmd::BPF_BTF_LOAD, &mut attr).map(Some).map_err(|e| MultiError::Btf(e.to_string()))
}

/// Loads `names` from the embedded object for multi-uprobe links,
/// relocated against `maps` (CO-RE against `btf`), with the object's BTF
/// (the verifier wants the function records of programs that pass
/// callbacks).
pub fn load_programs(
    names: &[&'static str],
    maps: &MapFds,
    btf: &aya::Btf,
) -> Result<HashMap<&'static str, OwnedFd>, MultiError> {
    let mut obj = aya_obj::Object::parse(crate::os::probe::object_bytes()).map_err(|e| MultiError::Parse(e.to_string()))?;
    let obj_btf = load_btf(&mut obj)?;
    if obj.has_btf_relocations() {
        obj.relocate_btf(btf).map_err(|e| MultiError::Relocate(e.to_string()))?;
    }
    let obj_maps: Vec<(String, aya_obj::Map)> = obj.maps.drain().collect();
    let mut with_fds = Vec::with_capacity(obj_maps.len());
    for (name, map) in &obj_maps {
        let fd = maps.0.get(name).ok_or_else(|| MultiError::Relocate(format!("no descriptor for map `{name}`")))?;
        with_fds.push((name.as_str(), fd.as_raw_fd(), map));
    }
    let text_sections = obj.functions.keys().map(|(section, _)| *section).collect();
    obj.relocate_maps(with_fds.into_iter(), &text_sections).map_err(|e| MultiError::Relocate(e.to_string()))?;
    obj.relocate_calls(&text_sections).map_err(|e| MultiError::Relocate(e.to_string()))?;
    let mut loaded = HashMap::new();
    for &name in names {
        let prog = obj.programs.get(name).ok_or(MultiError::MissingProgram(name))?;
        let function = obj.functions.get(&prog.function_key()).ok_or(MultiError::MissingProgram(name))?;
        let image = ProgImage {
            insns: &function.instructions,
            license: &prog.license,
            btf: obj_btf.as_ref().map(|fd| (fd.as_fd(), function)),
        };
        let fd = match prog_load(name, &image, None) {
            Ok(fd) => fd,
            Err(first) => {
                // Again with the verifier's log, of which the end says why
                // (the kernel keeps the end when the buffer is too small).
                let mut log = vec![0u8; 1 << 20];
                let detail = match prog_load(name, &image, Some(&mut log)) {
                    Ok(fd) => {
                        loaded.insert(name, fd);
                        continue;
                    }
                    Err(_) => {
                        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                        let text = String::from_utf8_lossy(&log[..end]).replace('\n', " ");
                        let tail: String = text.chars().rev().take(600).collect::<Vec<_>>().into_iter().rev().collect();
                        format!("{first}; verifier: {}", tail.trim())
                    }
                };
                return Err(MultiError::Load { name, detail });
            }
        };
        loaded.insert(name, fd);
    }
    Ok(loaded)
}

fn link_create(prog: BorrowedFd<'_>, path: &std::ffi::CStr, offsets: &[u64], cookies: &[u64], ret: bool) -> std::io::Result<OwnedFd> {
    link_create_for(prog, path, offsets, cookies, ret, 0, &[])
}

/// `pid` 0: every process; else only that process (the kernel installs the
/// breakpoints in its memory only: other processes do not trap).
fn link_create_for(
    prog: BorrowedFd<'_>,
    path: &std::ffi::CStr,
    offsets: &[u64],
    cookies: &[u64],
    ret: bool,
    pid: u32,
    ref_ctr_offsets: &[u64],
) -> std::io::Result<OwnedFd> {
    let mut attr = zeroed_attr();
    // SAFETY: writing the BPF_LINK_CREATE member of the zeroed union.
    let l = unsafe { &mut attr.link_create };
    l.__bindgen_anon_1.prog_fd = prog.as_raw_fd() as u32;
    l.attach_type = BPF_TRACE_UPROBE_MULTI as u32;
    l.__bindgen_anon_3.uprobe_multi.path = path.as_ptr() as u64;
    l.__bindgen_anon_3.uprobe_multi.offsets = offsets.as_ptr() as u64;
    l.__bindgen_anon_3.uprobe_multi.cookies = cookies.as_ptr() as u64;
    l.__bindgen_anon_3.uprobe_multi.cnt = offsets.len() as u32;
    l.__bindgen_anon_3.uprobe_multi.flags = if ret { BPF_F_UPROBE_MULTI_RETURN } else { 0 };
    l.__bindgen_anon_3.uprobe_multi.pid = pid;
    if !ref_ctr_offsets.is_empty() {
        l.__bindgen_anon_3.uprobe_multi.ref_ctr_offsets = ref_ctr_offsets.as_ptr() as u64;
    }
    sys_bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr)
}

/// Attaches `prog` (from [`load_programs`]) at the file `offsets` of
/// `path`, on entry or (`ret`) on return, in every process, each offset
/// with its cookie. The probes stay until the returned link is closed.
pub fn attach(prog: BorrowedFd<'_>, path: &Path, offsets: &[u64], cookies: &[u64], ret: bool) -> Result<OwnedFd, MultiError> {
    if offsets.len() != cookies.len() {
        return Err(MultiError::Mismatch(offsets.len(), cookies.len()));
    }
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| MultiError::BadPath(path.to_owned()))?;
    link_create(prog, &c_path, offsets, cookies, ret).map_err(MultiError::Attach)
}

/// [`attach`], for process `pid` only (its threads, also after an exec).
pub fn attach_pid(
    prog: BorrowedFd<'_>,
    path: &Path,
    offsets: &[u64],
    cookies: &[u64],
    ret: bool,
    pid: u32,
) -> Result<OwnedFd, MultiError> {
    if offsets.len() != cookies.len() {
        return Err(MultiError::Mismatch(offsets.len(), cookies.len()));
    }
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| MultiError::BadPath(path.to_owned()))?;
    link_create_for(prog, &c_path, offsets, cookies, ret, pid, &[]).map_err(MultiError::Attach)
}

/// [`attach`] for USDT probe sites, in every process: each offset with its
/// cookie and its reference counter (the file offset of the probe's
/// semaphore, 0 for none), which the kernel raises in every process that
/// maps the file while the link lives (and lowers after), so that the
/// probe's arguments are computed.
pub fn attach_usdt(prog: BorrowedFd<'_>, path: &Path, offsets: &[u64], cookies: &[u64], ref_ctrs: &[u64]) -> Result<OwnedFd, MultiError> {
    if offsets.len() != cookies.len() || offsets.len() != ref_ctrs.len() {
        return Err(MultiError::Mismatch(offsets.len(), cookies.len().min(ref_ctrs.len())));
    }
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| MultiError::BadPath(path.to_owned()))?;
    link_create_for(prog, &c_path, offsets, cookies, false, 0, ref_ctrs).map_err(MultiError::Attach)
}
