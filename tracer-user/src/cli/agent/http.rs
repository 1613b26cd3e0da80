//! The agent's HTTP endpoints, on `--listen` (loopback by default):
//! `/metrics` (OpenMetrics text, `prometheus-client`), `/healthz`,
//! `/targets` (JSON), `/report/latest` (the last window's JSON report),
//! `/report/latest.html` (its page).
//! A deliberately small HTTP/1.1 server: GET and HEAD only, one request per
//! connection, request head capped at 8 KiB (CRLF or bare-LF lines).
//!
//! It runs on threads of its own ([`start`]: a small tokio runtime, two
//! workers), never on the collection loop's thread: a loop that stalls (a
//! target churning executable mappings, a slow snapshot) does not silence
//! `/metrics` or `/healthz`. What it serves is what the loop last published
//! in [`Shared`]; the loop holds that lock only to publish, and a request
//! that cannot take it within [`LOCK_WAIT`] is answered 503 rather than
//! queued behind collection.
//!
//! Against slow or abusive clients: every connection has one deadline for
//! the whole exchange ([`DEADLINE`]: TLS handshake, request head, response),
//! not a per-read timeout; at most [`MAX_CONNECTIONS`] are open at once,
//! and a new one evicts the oldest (refusing new ones instead would let 64
//! idle clients lock Prometheus out; a real request completes in
//! milliseconds); running out of descriptors on accept (EMFILE/ENFILE)
//! evicts the oldest and backs off [`ACCEPT_BACKOFF`] instead of spinning,
//! and a connection that would leave fewer than [`FD_HEADROOM`] descriptors
//! free takes the oldest's place (or is closed, with the same back-off), so
//! collection and the windows keep the descriptors they need.
//! Each is counted in `/healthz`'s body.
//!
//! `/healthz` says whether collection progresses: 200 while the loop's last
//! turn ([`Heartbeat`]) is recent, 503 with its age once it is older than
//! [`STALE_AFTER`]. With `--auth-token-file`, every endpoint but `/healthz`
//! needs `Authorization: Bearer TOKEN` (`auth`); `/healthz` stays open for
//! probes and says nothing about the targets. With `--tls-cert`/`--tls-key`
//! only TLS is spoken (`tls`).

use std::{
    collections::BTreeMap,
    io,
    os::fd::{AsRawFd, RawFd},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, MutexGuard, TryLockError,
    },
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    task::AbortHandle,
};

use super::auth::Token;

/// The default `--listen` address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9475";
/// One connection's whole exchange (handshake, request head, response).
pub const DEADLINE: Duration = Duration::from_secs(5);
/// Connections open at once; one more evicts the oldest.
pub const MAX_CONNECTIONS: usize = 64;
/// Descriptors kept free for collection and the windows: a connection that
/// would leave fewer evicts the oldest (or is closed), as at EMFILE.
pub const FD_HEADROOM: u64 = 16;
/// The pause after accept failed for want of descriptors.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// How long a request waits for the published state before a 503.
pub const LOCK_WAIT: Duration = Duration::from_secs(2);
/// A healthy collection loop turns at least this often (a 1 s tick; a
/// window's snapshot of many targets can take a few seconds).
pub const TURN_BOUND: Duration = Duration::from_secs(5);
/// `/healthz` answers 503 when the loop's last turn is older than this
/// (3 x [`TURN_BOUND`]).
pub const STALE_AFTER: Duration = Duration::from_secs(15);
const HEAD_MAX: usize = 8192;

/// What the endpoints serve, updated by the agent's loop. Hold the lock
/// only to publish (no collection, no I/O under it): the HTTP threads take
/// it for each request.
pub struct Shared {
    /// The `/metrics` text, rendered by the agent's loop at each publish
    /// (at most `PUBLISH_EVERY` old): a scrape copies it.
    pub metrics_text: String,
    /// `/metrics` requests served (the series of exited targets wait for two).
    pub metrics_scrapes: u64,
    pub targets_json: String,
    /// The last window's JSON report, gzip-compressed
    /// (`report::json::render_gzip`); shared by the requests that serve it.
    pub latest_report: Option<Arc<Vec<u8>>>,
    /// The last window's page (`report::html::render_gzip`, no source
    /// lines: the agent never reads files a recording names), for
    /// `/report/latest.html`.
    pub latest_html: Option<Arc<Vec<u8>>>,
    pub windows_written: u64,
}

pub type SharedState = Arc<Mutex<Shared>>;

/// The collection loop's last turn, read by `/healthz` without a lock.
pub struct Heartbeat {
    origin: Instant,
    last_ms: AtomicU64,
    turns: AtomicU64,
}

impl Heartbeat {
    pub fn new() -> Arc<Heartbeat> {
        Arc::new(Heartbeat { origin: Instant::now(), last_ms: AtomicU64::new(0), turns: AtomicU64::new(0) })
    }

    /// Called by the loop at each turn.
    pub fn beat(&self) {
        let ms = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
        self.turns.fetch_add(1, Ordering::Relaxed);
    }

    fn age(&self) -> Duration {
        let now = self.origin.elapsed();
        now.saturating_sub(Duration::from_millis(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// What the server counts, shown by `/healthz`.
#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    evicted: AtomicU64,
    deadline: AtomicU64,
    fd_exhausted: AtomicU64,
    accept_errors: AtomicU64,
    unauthorized: AtomicU64,
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// `--auth-token-file` and `--tls-cert`/`--tls-key`, loaded at start.
#[derive(Clone, Default)]
pub struct ServeOptions {
    pub token: Option<Token>,
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl ServeOptions {
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }
}

struct Ctx {
    state: SharedState,
    heartbeat: Arc<Heartbeat>,
    token: Option<Token>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    counters: Counters,
    /// Open connections by age (ids increase).
    open: Mutex<BTreeMap<u64, AbortHandle>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Serves `listener` on a thread of its own until the process exits.
pub fn start(listener: std::net::TcpListener, state: SharedState, heartbeat: Arc<Heartbeat>, opts: ServeOptions) -> io::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("infertrace-http")
        .enable_io()
        .enable_time()
        .build()?;
    let ctx = Arc::new(Ctx {
        state,
        heartbeat,
        token: opts.token,
        tls: opts.tls.map(tokio_rustls::TlsAcceptor::from),
        counters: Counters::default(),
        open: Mutex::new(BTreeMap::new()),
    });
    listener.set_nonblocking(true)?;
    let listener = {
        let _enter = rt.enter();
        TcpListener::from_std(listener)?
    };
    std::thread::Builder::new().name("infertrace-http".into()).spawn(move || rt.block_on(serve(listener, ctx)))?;
    Ok(())
}

async fn serve(listener: TcpListener, ctx: Arc<Ctx>) {
    let mut next_id = 0u64;
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                inc(&ctx.counters.accepted);
                if few_descriptors_left(stream.as_raw_fd()) && !evict_oldest(&ctx) {
                    // Keep the last descriptors for collection and the
                    // windows: this one takes the oldest's place, or is
                    // closed when there is no connection to evict.
                    drop(stream);
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
                let mut open = lock(&ctx.open);
                while open.len() >= MAX_CONNECTIONS {
                    if let Some((_, oldest)) = open.pop_first() {
                        oldest.abort();
                        inc(&ctx.counters.evicted);
                    }
                }
                let id = next_id;
                next_id += 1;
                let c = ctx.clone();
                // Spawned under the lock: the task's own removal waits for the insert.
                let task = tokio::spawn(async move {
                    if tokio::time::timeout(DEADLINE, connection(stream, &c)).await.is_err() {
                        inc(&c.counters.deadline);
                    }
                    lock(&c.open).remove(&id);
                });
                open.insert(id, task.abort_handle());
            }
            Err(e) => {
                let fds = matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM));
                if fds {
                    // Free one descriptor of ours, and let the others go.
                    evict_oldest(&ctx);
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                } else {
                    // ECONNABORTED and the like: per connection, but never a spin.
                    inc(&ctx.counters.accept_errors);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
    }
}

/// Counts a want of descriptors and frees one: the oldest connection is
/// evicted (false: there was none).
fn evict_oldest(ctx: &Ctx) -> bool {
    inc(&ctx.counters.fd_exhausted);
    let Some((_, oldest)) = lock(&ctx.open).pop_first() else { return false };
    oldest.abort();
    inc(&ctx.counters.evicted);
    true
}

/// Whether a descriptor numbered `fd` leaves fewer than [`FD_HEADROOM`] free
/// under the soft `RLIMIT_NOFILE` (read each time: `prlimit` can change it
/// from outside). Descriptors are allocated lowest first, so every number
/// below `fd` is in use: this never claims room that is not there (it can
/// miss a shortage when higher numbers are taken too; EMFILE covers that).
fn few_descriptors_left(fd: RawFd) -> bool {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 || lim.rlim_cur == libc::RLIM_INFINITY {
        return false;
    }
    u64::try_from(fd).unwrap_or(0).saturating_add(FD_HEADROOM) >= lim.rlim_cur
}

async fn connection(stream: TcpStream, ctx: &Ctx) -> io::Result<()> {
    let _ = stream.set_nodelay(true);
    match &ctx.tls {
        Some(acceptor) => exchange(acceptor.accept(stream).await?, ctx).await,
        None => exchange(stream, ctx).await,
    }
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The end of the request head: the first empty line (CRLF or bare LF).
fn head_end(buf: &[u8]) -> Option<usize> {
    let mut line_start = 0;
    for (i, &b) in buf.iter().enumerate() {
        if b == b'\n' {
            let line = &buf[line_start..i];
            if line.is_empty() || line == b"\r" {
                return Some(line_start);
            }
            line_start = i + 1;
        }
    }
    None
}

struct Response {
    status: u16,
    ctype: &'static str,
    body: Body,
    extra: &'static str,
}

enum Body {
    Text(String),
    /// Bytes the published state holds (the compressed report), not copied.
    Shared(Arc<Vec<u8>>),
}

impl Body {
    fn bytes(&self) -> &[u8] {
        match self {
            Body::Text(s) => s.as_bytes(),
            Body::Shared(b) => b,
        }
    }
}

fn text(status: u16, body: impl Into<String>) -> Response {
    Response { status, ctype: "text/plain; charset=utf-8", body: Body::Text(body.into()), extra: "" }
}

/// Whether the request head names gzip among its `Accept-Encoding`s
/// (a `q=0` is a refusal).
fn accepts_gzip(head: &str) -> bool {
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(name, _)| name.trim().eq_ignore_ascii_case("accept-encoding"))
        .flat_map(|(_, v)| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';');
            let name = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| p.trim().replace(' ', "").trim_start_matches("q=").parse::<f64>().is_ok_and(|q| q == 0.0));
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
        })
}

/// The compressed report as the client takes it: as is with
/// `Content-Encoding: gzip`, else inflated for this request.
fn report_response(gz: Arc<Vec<u8>>, gzip_ok: bool, ctype: &'static str) -> Response {
    if gzip_ok {
        return Response { status: 200, ctype, body: Body::Shared(gz), extra: "Content-Encoding: gzip\r\nVary: Accept-Encoding\r\nX-Content-Type-Options: nosniff\r\n" };
    }
    let mut out = Vec::new();
    match std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(gz.as_slice()), &mut out) {
        Ok(_) => Response { status: 200, ctype, body: Body::Shared(Arc::new(out)), extra: "Vary: Accept-Encoding\r\nX-Content-Type-Options: nosniff\r\n" },
        Err(e) => text(500, format!("the stored report could not be inflated: {e}\n")),
    }
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, ctx: &Ctx) -> io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let end = loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = head_end(&buf) {
            break end;
        }
        if buf.len() > HEAD_MAX {
            return respond(&mut stream, false, text(431, "request head too large\n")).await;
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]);
    let mut lines = head.lines();
    let mut first = lines.next().unwrap_or("").split_whitespace();
    let (method, target) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
    let is_head = method == "HEAD";
    if method != "GET" && !is_head {
        let r = Response { extra: "Allow: GET, HEAD\r\n", ..text(405, "only GET and HEAD\n") };
        return respond(&mut stream, false, r).await;
    }
    let path = target.split('?').next().unwrap_or("");
    if path != "/healthz" {
        if let Some(token) = &ctx.token {
            let presented = lines
                .filter_map(|l| l.split_once(':'))
                .find(|(name, _)| name.trim().eq_ignore_ascii_case("authorization"))
                .and_then(|(_, v)| bearer(v.trim()));
            if !presented.is_some_and(|p| token.matches(p)) {
                inc(&ctx.counters.unauthorized);
                let r = Response {
                    extra: "WWW-Authenticate: Bearer realm=\"infertrace\"\r\n",
                    ..text(401, "a bearer token is required (Authorization: Bearer TOKEN)\n")
                };
                return respond(&mut stream, is_head, r).await;
            }
        }
    }
    let r = route(path, accepts_gzip(&head), ctx).await;
    respond(&mut stream, is_head, r).await
}

/// The credentials of an `Authorization: Bearer X` value.
fn bearer(v: &str) -> Option<&str> {
    let (scheme, cred) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| cred.trim())
}

/// The published state, or None when the loop holds it longer than `wait`.
async fn lock_within(state: &SharedState, wait: Duration) -> Option<MutexGuard<'_, Shared>> {
    let start = Instant::now();
    loop {
        match state.try_lock() {
            Ok(s) => return Some(s),
            Err(TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => {}
        }
        if start.elapsed() >= wait {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn route(path: &str, gzip_ok: bool, ctx: &Ctx) -> Response {
    if path == "/healthz" {
        return healthz(ctx).await;
    }
    let busy = || text(503, format!("the collection loop has held the published state for over {}s; retry\n", LOCK_WAIT.as_secs()));
    match path {
        "/metrics" => {
            let Some(mut s) = lock_within(&ctx.state, LOCK_WAIT).await else { return busy() };
            s.metrics_scrapes += 1;
            let body = Body::Text(s.metrics_text.clone());
            drop(s);
            Response { status: 200, ctype: OPENMETRICS, body, extra: "" }
        }
        "/targets" => {
            let Some(s) = lock_within(&ctx.state, LOCK_WAIT).await else { return busy() };
            let body = Body::Text(s.targets_json.clone());
            drop(s);
            Response { status: 200, ctype: "application/json", body, extra: "" }
        }
        "/report/latest" | "/report/latest.html" => {
            let html = path.ends_with(".html");
            let Some(s) = lock_within(&ctx.state, LOCK_WAIT).await else { return busy() };
            let latest = if html { s.latest_html.clone() } else { s.latest_report.clone() };
            drop(s);
            match latest {
                Some(gz) => report_response(gz, gzip_ok, if html { "text/html; charset=utf-8" } else { "application/json" }),
                None => text(404, "no window has closed yet\n"),
            }
        }
        _ => text(404, "not found; try /metrics, /healthz, /targets, /report/latest, /report/latest.html\n"),
    }
}

/// 200 while the loop turns, 503 once its last turn is older than
/// [`STALE_AFTER`]; the body has the age and the server's counters.
async fn healthz(ctx: &Ctx) -> Response {
    let age = ctx.heartbeat.age();
    let windows = match lock_within(&ctx.state, Duration::from_millis(100)).await {
        Some(s) => s.windows_written.to_string(),
        None => "unknown".to_owned(),
    };
    let c = &ctx.counters;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let stalled = age > STALE_AFTER;
    let mut body = if stalled {
        format!("stalled: the collection loop's last turn was {:.1}s ago (limit {}s)\n", age.as_secs_f64(), STALE_AFTER.as_secs())
    } else {
        "ok\n".to_owned()
    };
    body.push_str(&format!(
        "last_turn_age_seconds {:.3}\nloop_turns {}\nwindows_written {windows}\nhttp_connections_accepted {}\nhttp_connections_open {}\n\
         http_connections_evicted {}\nhttp_deadline_expired {}\nhttp_accept_fd_exhausted {}\nhttp_accept_errors {}\nhttp_unauthorized {}\n",
        age.as_secs_f64(),
        get(&ctx.heartbeat.turns),
        get(&c.accepted),
        lock(&ctx.open).len(),
        get(&c.evicted),
        get(&c.deadline),
        get(&c.fd_exhausted),
        get(&c.accept_errors),
        get(&c.unauthorized),
    ));
    text(if stalled { 503 } else { 200 }, body)
}

async fn respond<S: AsyncWrite + Unpin>(stream: &mut S, head_only: bool, r: Response) -> io::Result<()> {
    let reason = match r.status {
        200 => "OK",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        500 => "Internal Server Error",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n",
        r.status,
        r.ctype,
        r.body.bytes().len(),
        r.extra
    );
    stream.write_all(head.as_bytes()).await?;
    if !head_only {
        stream.write_all(r.body.bytes()).await?;
    }
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_is_accepted_when_named_without_q_zero() {
        let head = |v: &str| format!("GET / HTTP/1.1\r\nHost: x\r\n{v}\r\n");
        assert!(accepts_gzip(&head("Accept-Encoding: gzip")));
        assert!(accepts_gzip(&head("accept-encoding: deflate, GZIP;q=0.5")));
        assert!(accepts_gzip(&head("Accept-Encoding: *")));
        assert!(!accepts_gzip(&head("Accept-Encoding: gzip;q=0")));
        assert!(!accepts_gzip(&head("Accept-Encoding: gzip; q=0.0, identity")));
        assert!(!accepts_gzip(&head("Accept-Encoding: identity")));
        assert!(!accepts_gzip(&head("X-Gzip: gzip")));
        assert!(!accepts_gzip("GET / HTTP/1.1\r\n\r\n"));
    }

    #[test]
    fn head_ends_at_the_first_empty_line_crlf_or_bare_lf() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), Some(25));
        assert_eq!(head_end(b"GET / HTTP/1.1\nHost: x\n\n"), Some(23));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\n\r\n"), Some(24));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n"), None);
    }

    #[test]
    fn bearer_credentials() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer  abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer"), None);
    }
}
