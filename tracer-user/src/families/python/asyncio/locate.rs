//! Finding `_Py_AsyncioModuleDebugOffsets` in a process: the
//! `.AsyncioDebug` section of the `_asyncio` module, which is either built
//! into the interpreter (its executable or `libpython`) or a mapped
//! `_asyncio.cpython-3XX-*.so` (loaded by `import asyncio`).

use std::{fs::File, path::PathBuf};

use super::offsets::SECTION;
use crate::{
    os::procfs::MapsLine,
    families::python::{elf::ElfInfo, proc},
};

/// Where the section is mapped in the process, and the file it came from.
#[derive(Clone, Debug)]
pub struct Located {
    pub address: u64,
    pub file: PathBuf,
}

/// The candidates, in the order they are tried: the interpreter's own
/// binary (`binary`, as the process maps it), then any mapped file whose
/// name starts with `_asyncio`.
pub fn find_section(pid: u32, binary: &std::path::Path) -> Result<Option<Located>, crate::families::python::PythonError> {
    let maps = proc::read_maps(pid)?;
    let mut groups: Vec<(u64, &str, Vec<&MapsLine>)> = Vec::new();
    for m in maps.iter().filter(|m| m.is_file()) {
        let wanted = std::path::Path::new(m.path()) == binary || m.basename().starts_with("_asyncio");
        if !wanted {
            continue;
        }
        match groups.iter_mut().find(|g| g.0 == m.inode && g.1 == m.path()) {
            Some(g) => g.2.push(m),
            None => groups.push((m.inode, m.path(), vec![m])),
        }
    }
    // The interpreter first (3.15 builds `_asyncio` in).
    groups.sort_by_key(|g| std::path::Path::new(g.1) != binary);
    for (_, _, mappings) in &groups {
        let Ok((file, shown)) = proc::open_mapped(pid, mappings[0]) else { continue };
        let Some((section, loads)) = section_and_loads(&file, &shown.display().to_string()) else { continue };
        let info = ElfInfo { loads, ..ElfInfo::default() };
        let Some(bias) = info.load_bias(mappings) else { continue };
        return Ok(Some(Located { address: bias.wrapping_add(section), file: shown }));
    }
    Ok(None)
}

/// The section's link-time address and the file's PT_LOAD segments
/// (file offset, address); `None` when the file has no such section. Read
/// with the bounds of `crate::os::elf` (a target's file).
fn section_and_loads(file: &File, shown: &str) -> Option<(u64, Vec<(u64, u64)>)> {
    let (section, found) = crate::os::elf::section_and_segments(file, shown, SECTION).ok()?;
    let loads = found.segments.iter().map(|&(vaddr, _, off)| (off, vaddr)).collect();
    Some((section?, loads))
}
