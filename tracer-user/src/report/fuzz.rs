//! A seeded property test of the recording reader (a module of its own:
//! its fixtures come from `report`, which the recording model may not
//! import), run with the unit tests
//! (`cargo xtask test`) for a bounded time: valid recordings are mutated
//! (cut short, bytes flipped, spliced, numbers made huge or negative,
//! strings made huge, arrays nested deep, gzip bombs) at the file level and
//! at the JSON level, and every input must give a recording or a
//! [`RecordingError`], never a panic, within a time and memory bound.
//!
//! `INFERTRACE_FUZZ_SEED=N` replays (or varies) the sequence;
//! `INFERTRACE_FUZZ_SECS=S` runs longer than the default budget. A failure
//! names the seed and case number that reproduce it.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
    collections::BTreeMap,
    io::Write as _,
    path::Path,
    time::{Duration, Instant},
};

use flate2::{write::GzEncoder, Compression};

use crate::recording::{
    cuda::{CudaLaunch, CudaLibrary, CudaReport, Site},
    limits::{ReadLimits, MAX_STRING},
    Recording, RecordingError, ENCODING_GZIP_JSON, FORMAT_VERSION, MAGIC,
};

/// Bytes allocated on the current thread: the test binary's allocator
/// counts them (per thread, so that tests running in parallel do not
/// disturb the measure).
struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn track(delta: isize) {
    let _ = LIVE.try_with(|live| {
        let v = live.get() + delta;
        live.set(v);
        let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
    });
}

// SAFETY: every call is forwarded to the system allocator unchanged; the
// bookkeeping touches const-initialized thread locals only (no allocation).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            track(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            track(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        track(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            track(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Runs `f`; its result and the most bytes it had allocated at once on
/// this thread, above what was live before.
fn peak_alloc<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let r = f();
    (r, usize::try_from(PEAK.with(Cell::get) - base).unwrap_or(0))
}

/// splitmix64: small, seeded, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Header + gzip of `json`, as `Recording::write_to` lays a file out.
fn itr(json: &[u8]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&ENCODING_GZIP_JSON.to_le_bytes());
    let mut gz = GzEncoder::new(out, Compression::fast());
    gz.write_all(json).expect("in-memory gzip");
    gz.finish().expect("in-memory gzip")
}

/// Valid recordings to start from: the small sample, one with stacks and
/// threads, one with a CUDA section.
fn seeds() -> Vec<Vec<u8>> {
    let small = crate::recording::tests::sample();
    let stacks = crate::report::folded::tests::stacks_sample();
    let site = Site { function: "step".into(), file: Some("/srv/app.py".into()), line: Some(7) };
    let mut cuda = stacks.clone();
    cuda.cuda = Some(CudaReport {
        launches: vec![CudaLaunch { pid: 10, kernel: "gemm".into(), count: 3, site, api: "cudaLaunchKernel".into(), estimated: false, sampled: None }],
        gpu_samples: vec![crate::report::text::nvml::tests::gpu(1, 0, 50.0, 1 << 30, Some((1, 2)))],
        libraries: vec![CudaLibrary { path: "/lib/libcudart.so.12".into(), functions: vec!["cudaMemcpy".into()], pids: vec![10] }],
        window_ns: 1_000_000_000,
        notes: vec!["n".into()],
        ..Default::default()
    });
    cuda.runqueue_hist = BTreeMap::from([(10, vec![0, 3, 1])]);
    [small, stacks, cuda].iter().map(|r| serde_json::to_vec(r).expect("recordings serialize")).collect()
}

/// Text spliced into the JSON: hostile numbers, types and structure.
const TOKENS: &[&str] = &[
    "18446744073709551616",
    "-1",
    "1e999",
    "-0",
    "4294967296",
    "99999999999999999999999999999999999999",
    "null",
    "true",
    "\"\"",
    "\"\\u0000\\ud800\"",
    "{}",
    "[]",
    "{\"pid\":",
    "\"\\",
    ",",
    ":",
    "]",
    "}",
];

/// One mutation of the JSON text `j`.
fn mutate_json(rng: &mut Rng, j: &mut Vec<u8>) {
    let at = rng.below(j.len() + 1);
    match rng.below(9) {
        0 => j.truncate(at),
        1 => {
            for _ in 0..1 + rng.below(8) {
                let i = rng.below(j.len());
                if let Some(b) = j.get_mut(i) {
                    *b ^= 1 << rng.below(8);
                }
            }
        }
        2 => {
            let t = rng.pick(TOKENS).as_bytes();
            j.splice(at..at, t.iter().copied());
        }
        3 => {
            // A number replaced by a hostile one.
            if let Some(start) = (at..j.len()).find(|&i| j[i].is_ascii_digit()) {
                let end = (start..j.len()).find(|&i| !j[i].is_ascii_digit()).unwrap_or(j.len());
                let t = rng.pick(&TOKENS[..6]).as_bytes();
                j.splice(start..end, t.iter().copied());
            }
        }
        4 => {
            // Deep nesting.
            let depth = 1 + rng.below(100_000);
            let open = if rng.below(2) == 0 { b"[" as &[u8] } else { b"{\"a\":" };
            let nest: Vec<u8> = open.iter().copied().cycle().take(open.len() * depth).collect();
            j.splice(at..at, nest);
        }
        5 => {
            // A long string (past the string bound, sometimes).
            // (The bombs test passes MAX_STRING; here, past the 4 MiB limit.)
            let n = if rng.below(8) == 0 { 5 << 20 } else { rng.below(1 << 16) };
            let mut s = vec![b'"'];
            s.resize(n + 1, b'x');
            s.push(b'"');
            j.splice(at..at, s);
        }
        6 => {
            // A long run of whitespace or digits.
            let c = *rng.pick(b" \n7");
            j.splice(at..at, std::iter::repeat_n(c, rng.below(1 << 17)));
        }
        7 => {
            // A slice of the text repeated: duplicate keys, arrays grown.
            let from = rng.below(j.len());
            let to = (from + rng.below(256)).min(j.len());
            let piece = j[from..to].to_vec();
            for _ in 0..1 + rng.below(64) {
                j.splice(at.min(j.len())..at.min(j.len()), piece.iter().copied());
            }
        }
        _ => {
            let from = rng.below(j.len());
            let to = (from + rng.below(64)).min(j.len());
            j.drain(from..to);
        }
    }
}

/// One mutation of the file bytes `f` (header and gzip stream).
fn mutate_file(rng: &mut Rng, f: &mut Vec<u8>) {
    match rng.below(5) {
        0 => f.truncate(rng.below(f.len() + 1)),
        1 => {
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(f.len());
                f[i] ^= 1 << rng.below(8);
            }
        }
        2 => {
            // Version and encoding words.
            let v = *rng.pick(&[0u32, 1, 2, u32::MAX]);
            let at = *rng.pick(&[8usize, 12]);
            f[at..at + 4].copy_from_slice(&v.to_le_bytes());
        }
        3 => {
            let at = rng.below(f.len() + 1);
            let junk: Vec<u8> = (0..rng.below(64)).map(|_| rng.next() as u8).collect();
            f.splice(at..at, junk);
        }
        _ => {
            // The gzip trailer (CRC, size) or the header flags.
            let i = if rng.below(2) == 0 { f.len().saturating_sub(1 + rng.below(8)) } else { 16 + rng.below(10) };
            if let Some(b) = f.get_mut(i) {
                *b = rng.next() as u8;
            }
        }
    }
}

/// Bombs: small files that inflate to a lot.
fn bombs() -> Vec<(&'static str, Vec<u8>)> {
    let mut string = b"{\"format_version\":1,\"tool_version\":\"".to_vec();
    string.resize(string.len() + MAX_STRING as usize + 1024, b'a');
    string.extend_from_slice(b"\"}");
    let spaces = vec![b' '; 8 << 20];
    let zeros = {
        let mut z = b"{\"runqueue_hist\":{\"1\":[".to_vec();
        for _ in 0..(4 << 20) {
            z.extend_from_slice(b"0,");
        }
        z
    };
    vec![("one long string", itr(&string)), ("whitespace", itr(&spaces)), ("an array of zeros", itr(&zeros))]
}

/// What one input may cost, at most, under [`LIMITS`].
const MAX_CASE_TIME: Duration = Duration::from_secs(2);
const LIMITS: ReadLimits = ReadLimits { max_inflated: 4 << 20, max_ratio: None, ratio_floor: 0 };
/// The default ratio bound, with a floor small enough for a unit test.
const RATIO: ReadLimits = ReadLimits { max_inflated: 1 << 30, max_ratio: Some(100), ratio_floor: 1 << 20 };
/// The parsed recording can be several times its JSON (a `0,` is a u64 in
/// a vector that doubles as it grows), plus the buffers.
const MAX_CASE_ALLOC: usize = 24 * (4 << 20) + (4 << 20);

fn check(input: &[u8], limits: ReadLimits, what: &dyn Fn() -> String) -> Result<Recording, RecordingError> {
    let t = Instant::now();
    let (r, peak) = peak_alloc(|| {
        std::panic::catch_unwind(|| Recording::from_reader(input, Path::new("fuzz.itr"), limits))
            .unwrap_or_else(|_| panic!("the reader panicked on {}", what()))
    });
    let took = t.elapsed();
    assert!(took < MAX_CASE_TIME, "{} took {took:?}", what());
    assert!(peak <= MAX_CASE_ALLOC, "{} allocated {peak} bytes at once", what());
    r
}

#[test]
fn bombs_are_refused_quickly_in_little_memory() {
    for (name, file) in bombs() {
        // The string and whitespace bounds hold whatever the limits; an
        // array of zeros passes them, and is stopped by the size or the
        // ratio bound (under the default floor, 64 MiB of `0,` would be
        // 256 MiB of u64s: too slow for a unit test).
        let limits: &[ReadLimits] =
            if name == "an array of zeros" { &[LIMITS, RATIO] } else { &[ReadLimits::default(), LIMITS, RATIO] };
        for &limits in limits {
            let t = Instant::now();
            let (r, peak) = peak_alloc(|| Recording::from_reader(&file[..], Path::new("bomb.itr"), limits));
            let err = r.expect_err(name);
            assert!(
                matches!(err, RecordingError::Corrupt { .. } | RecordingError::TooLarge { .. } | RecordingError::Bomb { .. }),
                "{name}: {err}"
            );
            if name == "an array of zeros" && limits == RATIO {
                assert!(matches!(err, RecordingError::Bomb { ratio: 100, .. }), "{err}");
            }
            assert!(t.elapsed() < Duration::from_secs(2), "{name}: {:?}", t.elapsed());
            assert!(peak < 64 << 20, "{name}: {peak} bytes allocated at once ({err})");
        }
    }
}

#[test]
fn mutated_recordings_never_panic() {
    let seed = std::env::var("INFERTRACE_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x1f_5eed);
    let budget = std::env::var("INFERTRACE_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs_f64)
        .unwrap_or(Duration::from_secs(3));
    let seeds = seeds();
    for s in &seeds {
        let file = itr(s);
        check(&file, LIMITS, &|| "a seed".into()).expect("the seeds are valid recordings");
    }
    let mut rng = Rng(seed);
    let start = Instant::now();
    let (mut cases, mut accepted) = (0u64, 0u64);
    // Never fewer than this many cases, however slow the machine.
    while cases < 300 || start.elapsed() < budget {
        let mut json = rng.pick(&seeds).clone();
        for _ in 0..1 + rng.below(3) {
            mutate_json(&mut rng, &mut json);
        }
        let mut file = itr(&json);
        if rng.below(3) == 0 {
            mutate_file(&mut rng, &mut file);
        }
        let what = || format!("case {cases} of seed {seed:#x} (INFERTRACE_FUZZ_SEED={seed})");
        if check(&file, LIMITS, &what).is_ok() {
            accepted += 1;
        }
        cases += 1;
        if cases >= 1_000_000 {
            break;
        }
    }
    eprintln!("recording reader fuzz: {cases} cases in {:.1?} ({accepted} read as recordings), seed {seed:#x}", start.elapsed());
}
