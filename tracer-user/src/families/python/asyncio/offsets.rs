//! Where asyncio's structures are, in a CPython 3.14+ process.
//!
//! Two sources, both published by the interpreter for out-of-process
//! debuggers (what `python -m asyncio pstree` reads):
//! - `_Py_AsyncioModuleDebugOffsets`, the `.AsyncioDebug` ELF section of
//!   the `_asyncio` module (a shared `_asyncio.cpython-314-*.so` on Debian's
//!   3.14, built into the executable on its 3.15): the task object's name,
//!   `awaited_by`, `is_task`, `awaited_by_is_set`, coroutine and list node,
//!   and the interpreter's and thread state's task lists, running loop and
//!   running task ([`AsyncioDebug`]);
//! - the groups of `_Py_DebugOffsets` (at the start of `_PyRuntime`) that
//!   the asyncio walk needs beyond what `super::super::debug_offsets`
//!   reads: the generator object (`gi_iframe`, `gi_frame_state`), the
//!   frame's `stackpointer`, `tp_flags`, the set and int objects, the list
//!   node ([`RuntimeGroups`]). Their positions in the blob differ per
//!   revision (3.14 and 3.15 are known; read from the headers and
//!   cross-checked on the captured blobs in `../testdata`).
//!
//! Not published, and therefore per version here ([`VersionFacts`]): the
//! values of the generator frame states, which stack slot holds the object
//! a suspended `await` waits on, and three `TaskObj` members (the loop,
//! the future state, `task_fut_waiter`), which are derived from the
//! published ones only when those are exactly the known layout.

use crate::families::python::{debug_offsets::check_struct, proc::le_u64};

/// `sizeof(_Py_AsyncioModuleDebugOffsets)` (13 members of 8 bytes) in 3.14 and 3.15.
pub const SECTION_LEN: usize = 104;
/// Name of the ELF section holding it.
pub const SECTION: &str = ".AsyncioDebug";

/// `_Py_AsyncioModuleDebugOffsets`, as read from the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncioDebug {
    pub task_size: u64,
    pub task_name: u64,
    pub task_awaited_by: u64,
    pub task_is_task: u64,
    pub task_awaited_by_is_set: u64,
    pub task_coro: u64,
    pub task_node: u64,
    pub interp_size: u64,
    pub interp_tasks_head: u64,
    pub tstate_size: u64,
    pub tstate_running_loop: u64,
    pub tstate_running_task: u64,
    pub tstate_tasks_head: u64,
}

impl AsyncioDebug {
    /// Parses the section's bytes; every member must fit its structure.
    pub fn parse(b: &[u8]) -> Result<AsyncioDebug, String> {
        if b.len() < SECTION_LEN {
            return Err(format!("{SECTION}: {} bytes, {SECTION_LEN} needed", b.len()));
        }
        let at = |i: u64| le_u64(b, i * 8);
        let d = AsyncioDebug {
            task_size: at(0),
            task_name: at(1),
            task_awaited_by: at(2),
            task_is_task: at(3),
            task_awaited_by_is_set: at(4),
            task_coro: at(5),
            task_node: at(6),
            interp_size: at(7),
            interp_tasks_head: at(8),
            tstate_size: at(9),
            tstate_running_loop: at(10),
            tstate_running_task: at(11),
            tstate_tasks_head: at(12),
        };
        let groups: [Group; 3] = [
            (
                "TaskObj",
                d.task_size,
                &[
                    ("task_name", d.task_name, 8),
                    ("task_awaited_by", d.task_awaited_by, 8),
                    ("task_is_task", d.task_is_task, 1),
                    ("task_awaited_by_is_set", d.task_awaited_by_is_set, 1),
                    ("task_coro", d.task_coro, 8),
                    ("task_node", d.task_node, 16),
                ],
            ),
            ("PyInterpreterState", d.interp_size, &[("asyncio_tasks_head", d.interp_tasks_head, 16)]),
            (
                "_PyThreadStateImpl",
                d.tstate_size,
                &[
                    ("asyncio_running_loop", d.tstate_running_loop, 8),
                    ("asyncio_running_task", d.tstate_running_task, 8),
                    ("asyncio_tasks_head", d.tstate_tasks_head, 16),
                ],
            ),
        ];
        for (strukt, size, members) in groups {
            check_struct(strukt, size, 1 << 24, 16, members).map_err(|e| format!("{SECTION}: {e}"))?;
        }
        Ok(d)
    }

    /// The `TaskObj` layout of 3.14 and 3.15 (`FutureObj_HEAD`, then the
    /// task's members), for which the unpublished members are known.
    fn is_known_task_layout(&self) -> bool {
        (self.task_size, self.task_awaited_by, self.task_is_task, self.task_awaited_by_is_set, self.task_coro, self.task_name, self.task_node)
            == (168, 96, 108, 109, 128, 136, 152)
    }

    /// The unpublished task members, when the published ones are the
    /// known layout (else `None`: the task state and loop are not read).
    pub fn derived_task_members(&self) -> Option<DerivedTask> {
        self.is_known_task_layout().then_some(DerivedTask {
            // FutureObj_HEAD: PyObject_HEAD, then fut_loop.
            loop_: 16,
            // fut_state (an enum, 4 bytes) right after fut_awaited_by.
            state: self.task_awaited_by + 8,
            // task_fut_waiter right before task_coro.
            fut_waiter: self.task_coro - 8,
        })
    }
}

/// (member, offset, bytes it needs).
type Member<'a> = (&'a str, u64, u64);
/// (structure, its size, its members).
type Group<'a> = (&'a str, u64, &'a [Member<'a>]);

/// `TaskObj` members that are not published (see [`AsyncioDebug::derived_task_members`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DerivedTask {
    pub loop_: u64,
    pub state: u64,
    pub fut_waiter: u64,
}

/// The members of `_Py_DebugOffsets` the asyncio walk needs beyond the
/// stack walk's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuntimeGroups {
    pub frame_stackpointer: u64,
    pub frame_owner: u64,
    pub tp_flags: u64,
    pub set_used: u64,
    pub set_table: u64,
    pub set_mask: u64,
    pub long_lv_tag: u64,
    pub long_digit: u64,
    pub gen_size: u64,
    pub gen_iframe: u64,
    pub gen_frame_state: u64,
}

/// Positions of those members in one revision of `_Py_DebugOffsets`.
struct Positions {
    minor: u32,
    frame_size: u64,
    frame_owner: u64,
    frame_stackpointer: u64,
    type_size: u64,
    tp_flags: u64,
    set_size: u64,
    long_size: u64,
    gen_size: u64,
    llist_next: u64,
}

/// 3.14: `interpreter_frame` {size, previous, executable, instr_ptr,
/// localsplus, owner, stackpointer, tlbc_index}; `type_object` {size,
/// tp_name, tp_repr, tp_flags}; then tuple, list, set {size, used, table,
/// mask}, dict, float, long {size, lv_tag, ob_digit}, bytes, unicode, gc,
/// gen_object {size, gi_name, gi_iframe, gi_frame_state}, llist_node.
const POS_314: Positions = Positions {
    minor: 14,
    frame_size: 248,
    frame_owner: 288,
    frame_stackpointer: 296,
    type_size: 416,
    tp_flags: 440,
    set_size: 496,
    long_size: 568,
    gen_size: 664,
    llist_next: 696,
};

/// 3.15: the frame and code groups moved by 64 bytes; `type_object` grew
/// two members and a heap-type group follows it; the gc group grew, and a
/// group was inserted before gen_object.
const POS_315: Positions = Positions {
    minor: 15,
    frame_size: 312,
    frame_owner: 352,
    frame_stackpointer: 360,
    type_size: 480,
    tp_flags: 504,
    set_size: 592,
    long_size: 664,
    gen_size: 792,
    llist_next: 824,
};

impl RuntimeGroups {
    /// Reads the groups from the start of `_PyRuntime` (`blob`) of CPython
    /// 3.`minor`; each member is checked against its structure's size.
    pub fn parse(blob: &[u8], minor: u32) -> Result<RuntimeGroups, String> {
        let p = match minor {
            14 => POS_314,
            15 => POS_315,
            _ => return Err(format!("the _Py_DebugOffsets of 3.{minor} are not known for asyncio")),
        };
        debug_assert_eq!(p.minor, minor);
        if blob.len() < p.llist_next as usize + 16 {
            return Err(format!("_Py_DebugOffsets: {} bytes read", blob.len()));
        }
        let at = |pos: u64| le_u64(blob, pos);
        let g = RuntimeGroups {
            frame_stackpointer: at(p.frame_stackpointer),
            frame_owner: at(p.frame_owner),
            tp_flags: at(p.tp_flags),
            set_used: at(p.set_size + 8),
            set_table: at(p.set_size + 16),
            set_mask: at(p.set_size + 24),
            long_lv_tag: at(p.long_size + 8),
            long_digit: at(p.long_size + 16),
            gen_size: at(p.gen_size),
            gen_iframe: at(p.gen_size + 16),
            gen_frame_state: at(p.gen_size + 24),
        };
        let frame_size = at(p.frame_size);
        let checks: [(&str, u64, u64, u64); 10] = [
            ("_PyInterpreterFrame.stackpointer", g.frame_stackpointer, 8, frame_size),
            ("_PyInterpreterFrame.owner", g.frame_owner, 1, frame_size),
            ("PyTypeObject.tp_flags", g.tp_flags, 8, at(p.type_size)),
            ("PySetObject.used", g.set_used, 8, at(p.set_size)),
            ("PySetObject.table", g.set_table, 8, at(p.set_size)),
            ("PySetObject.mask", g.set_mask, 8, at(p.set_size)),
            ("PyLongObject.lv_tag", g.long_lv_tag, 8, at(p.long_size)),
            ("PyLongObject.ob_digit", g.long_digit, 4, at(p.long_size)),
            ("PyGenObject.gi_frame_state", g.gen_frame_state, 1, g.gen_size),
            // The frame is embedded in the generator.
            ("PyGenObject.gi_iframe", g.gen_iframe, frame_size, g.gen_size),
        ];
        for (name, off, width, size) in checks {
            if !(16..1 << 20).contains(&size) || off.checked_add(width).is_none_or(|end| end > size) {
                return Err(format!("_Py_DebugOffsets: {name} at {off} does not fit in {size} bytes"));
            }
        }
        if (at(p.llist_next), at(p.llist_next + 8)) != (0, 8) {
            return Err("_Py_DebugOffsets: llist_node is not {next, prev}".into());
        }
        Ok(g)
    }
}

/// What each version does not publish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VersionFacts {
    /// `gi_frame_state` of a coroutine suspended in `await` (yield from).
    pub suspended_yield_from: i8,
    /// Running (`FRAME_EXECUTING`).
    pub executing: i8,
    /// States at or above this have no frame to read (completed, cleared).
    pub finished_from: i8,
    /// The awaited object of a suspended `await` is at `stackpointer - 8 * awaited_slot`.
    pub awaited_slot: u64,
}

impl VersionFacts {
    /// Measured on Debian's 3.14.x and 3.15.x (the enum `_framestate` was
    /// renumbered in 3.15, and a suspended `await` keeps one more value
    /// above the awaited object).
    pub fn for_minor(minor: u32) -> Option<VersionFacts> {
        match minor {
            14 => Some(VersionFacts { suspended_yield_from: -1, executing: 0, finished_from: 1, awaited_slot: 1 }),
            15 => Some(VersionFacts { suspended_yield_from: 2, executing: 4, finished_from: 5, awaited_slot: 2 }),
            _ => None,
        }
    }
}

/// `_PyInterpreterFrame.owner` of a generator's (coroutine's) own frame.
pub const FRAME_OWNED_BY_GENERATOR: u8 = 1;
/// `tp_flags` bits.
pub const TPFLAGS_LONG_SUBCLASS: u64 = 1 << 24;
pub const TPFLAGS_UNICODE_SUBCLASS: u64 = 1 << 28;
/// `PyTypeObject.tp_name` (a C string).
pub const TP_NAME: u64 = 24;

#[cfg(test)]
mod tests {
    use super::*;

    fn hex_blob(text: &str) -> Vec<u8> {
        let hex: String = text.lines().filter(|l| !l.starts_with('#')).collect();
        (0..hex.len() / 2).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap()).collect()
    }

    fn runtime(minor: u32) -> Vec<u8> {
        hex_blob(match minor {
            14 => include_str!("../testdata/debug_offsets_3.14.hex"),
            _ => include_str!("../testdata/debug_offsets_3.15.hex"),
        })
    }

    fn section(minor: u32) -> Vec<u8> {
        hex_blob(match minor {
            14 => include_str!("../testdata/asyncio_debug_3.14.hex"),
            _ => include_str!("../testdata/asyncio_debug_3.15.hex"),
        })
    }

    /// The groups read from the captured 3.14 and 3.15 blobs are the
    /// structures as measured in the live interpreters (ctypes on the
    /// objects themselves: `gi_frame_state` at 67, the frame at 72, its
    /// stack pointer at +64).
    #[test]
    fn runtime_groups_of_the_captured_blobs() {
        for minor in [14, 15] {
            let g = RuntimeGroups::parse(&runtime(minor), minor).unwrap();
            assert_eq!(
                g,
                RuntimeGroups {
                    frame_stackpointer: 64,
                    frame_owner: 74,
                    tp_flags: 168,
                    set_used: 24,
                    set_table: 40,
                    set_mask: 32,
                    long_lv_tag: 16,
                    long_digit: 24,
                    gen_size: 160,
                    gen_iframe: 72,
                    gen_frame_state: 67,
                },
                "3.{minor}"
            );
        }
        // 3.14's blob read with 3.15's positions does not pass.
        assert!(RuntimeGroups::parse(&runtime(14), 15).is_err());
        assert!(RuntimeGroups::parse(&runtime(15), 16).is_err());
    }

    #[test]
    fn sections_of_debian_314_and_315() {
        let a = AsyncioDebug::parse(&section(14)).unwrap();
        let b = AsyncioDebug::parse(&section(15)).unwrap();
        assert_eq!((a.task_name, a.task_coro, a.task_node, a.tstate_tasks_head), (136, 128, 152, 880));
        assert_eq!((b.tstate_running_loop, b.tstate_running_task, b.tstate_tasks_head), (1024, 1032, 1048));
        for d in [a, b] {
            assert_eq!(d.derived_task_members(), Some(DerivedTask { loop_: 16, state: 104, fut_waiter: 120 }));
        }
        let mut moved = a;
        moved.task_coro = 136;
        assert_eq!(moved.derived_task_members(), None);
    }

    #[test]
    fn bad_sections_are_refused() {
        assert!(AsyncioDebug::parse(&[0u8; 50]).is_err());
        assert!(AsyncioDebug::parse(&[0u8; SECTION_LEN]).unwrap_err().contains("sizeof(TaskObj)"));
        let mut b = section(14);
        // task_node far outside the task.
        b[48..56].copy_from_slice(&4000u64.to_le_bytes());
        assert!(AsyncioDebug::parse(&b).unwrap_err().contains("task_node"));
    }
}
