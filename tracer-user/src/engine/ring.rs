//! The one reader of the kernel's ring buffers: every item is one
//! `#[repr(C)]` record (aya's [`Pod`], as tracer-common implements it
//! for them), copied out with `read_unaligned`; an
//! item shorter than a record is not read but counted, and the count goes
//! to the [`Sink`] as the lost-event counter the family names
//! ([`Records::report`]).

use std::{
    marker::PhantomData,
    os::fd::{AsFd, BorrowedFd},
};

use aya::{
    maps::{MapData, RingBuf},
    Pod,
};

use super::Sink;

/// The record at the start of `bytes`, or None when `bytes` is shorter
/// than a record (a longer item is read up to a record's size).
pub fn decode<T: Pod>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: `bytes` holds at least `size_of::<T>()` initialized bytes,
    // `read_unaligned` copes with any alignment, and `T: Pod` (tracer-common's
    // record types: integers only) makes any bytes a valid `T`.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// A ring buffer of `T` records and the count of its items too short to
/// be one.
pub struct Records<T> {
    ring: RingBuf<MapData>,
    /// The lost-event counter the short items are reported as.
    counter: &'static str,
    short: u64,
    _record: PhantomData<fn() -> T>,
}

impl<T: Pod> Records<T> {
    /// Reads `ring`; short items are reported as `counter`
    /// (`<family>_short_records`).
    pub fn new(ring: RingBuf<MapData>, counter: &'static str) -> Self {
        Records { ring, counter, short: 0, _record: PhantomData }
    }

    /// Calls `f` on every record in the ring now (non-blocking), in order;
    /// returns how many.
    pub fn drain(&mut self, mut f: impl FnMut(T)) -> u64 {
        let mut n = 0;
        while let Some(item) = self.ring.next() {
            n += take(&item, &mut self.short, &mut f);
        }
        n
    }

    /// Items too short to be a record, so far.
    pub fn short(&self) -> u64 {
        self.short
    }

    /// Sets the family's counter of short items in `sink` (nothing while 0).
    pub fn report(&self, sink: &mut Sink) {
        sink.set_lost(self.counter, self.short);
    }
}

impl<T> AsFd for Records<T> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.ring.as_fd()
    }
}

/// One item: `f` on its record (1), or counted in `short` (0).
fn take<T: Pod>(item: &[u8], short: &mut u64, f: &mut impl FnMut(T)) -> u64 {
    match decode(item) {
        Some(r) => {
            f(r);
            1
        }
        None => {
            *short += 1;
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::process::ProcEvent;

    use super::*;

    fn bytes(kind: u32, pid: u32, ts_ns: u64) -> Vec<u8> {
        let mut b = Vec::new();
        for v in [kind, pid, 7, 0] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        b.extend_from_slice(&ts_ns.to_ne_bytes());
        b.extend_from_slice(b"python3\0\0\0\0\0\0\0\0\0");
        b
    }

    fn read(items: &[&[u8]]) -> (Vec<ProcEvent>, u64, u64) {
        let (mut out, mut short, mut n) = (Vec::new(), 0, 0);
        for item in items {
            n += take(item, &mut short, &mut |e| out.push(e));
        }
        (out, n, short)
    }

    #[test]
    fn a_full_record() {
        let b = bytes(2, 42, 1234);
        assert_eq!(b.len(), size_of::<ProcEvent>());
        let (out, n, short) = read(&[&b]);
        assert_eq!((n, short), (1, 0));
        let e = out[0];
        assert_eq!((e.kind, e.pid, e.ppid, e.ts_ns), (2, 42, 7, 1234));
        assert_eq!(&e.comm[..8], b"python3\0");
    }

    #[test]
    fn a_short_record_is_counted_not_read() {
        let b = bytes(2, 42, 1234);
        let (out, n, short) = read(&[&b[..b.len() - 1], &[]]);
        assert!(out.is_empty());
        assert_eq!((n, short), (0, 2));
    }

    #[test]
    fn two_records_in_order_unaligned_and_longer() {
        let (a, b) = (bytes(1, 10, 5), bytes(3, 11, 6));
        // At an odd address, and followed by bytes past the record.
        let mut odd = vec![0u8];
        odd.extend_from_slice(&b);
        odd.extend_from_slice(&[0xff; 3]);
        let (out, n, short) = read(&[&a, &odd[1..]]);
        assert_eq!((n, short), (2, 0));
        assert_eq!(out.iter().map(|e| (e.kind, e.pid, e.ts_ns)).collect::<Vec<_>>(), vec![(1, 10, 5), (3, 11, 6)]);
    }
}
