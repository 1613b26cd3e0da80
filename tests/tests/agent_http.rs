//! `infertrace agent`'s HTTP server under hostile clients, its access
//! control, and its exit on a signal while collection is stalled.
//!
//! - slow clients: 100 connections sending one byte a second do not delay
//!   a normal `/metrics` scrape past 1 s, and are all disconnected within
//!   the 5 s deadline (plus a margin) although they never stop sending;
//! - descriptor exhaustion: the agent's RLIMIT_NOFILE lowered to what it
//!   uses plus 24 (prlimit on the running agent), 1500 connections opened:
//!   the agent's CPU over 5 s stays low (a spinning accept loop burnt 0.8
//!   of a core), `/healthz` counts the EMFILE, and `/metrics` answers again
//!   once they are closed;
//! - HEAD has headers only (a Content-Length, no body); a bare-LF request
//!   head is answered at once;
//! - `--auth-token-file`: 401 with `WWW-Authenticate: Bearer` without or
//!   with a wrong token, 200 with it, `/healthz` open; a token file others
//!   can read is refused with one line;
//! - `--tls-cert`/`--tls-key`: curl with the self-signed certificate as its
//!   CA reads `/metrics` over https; plain HTTP gets no HTTP answer;
//! - a target mapping and unmapping an executable page as fast as it can
//!   (`tests/workloads/exec_map_churn.py`; here it slowed the loop to about
//!   one turn a second and one window in 16 s instead of 8): `/healthz` and
//!   `/metrics` answer within 1 s meanwhile, and SIGTERM ends the agent
//!   within 2 s (exit 0 with its last window, or 4 and a line on stderr
//!   without it).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use infertrace_e2e::*;

struct Agent {
    proc: AgentProc,
    _target: Target,
    dir: TempDir,
}

impl std::ops::Deref for Agent {
    type Target = AgentProc;
    fn deref(&self) -> &AgentProc {
        &self.proc
    }
}

impl std::ops::DerefMut for Agent {
    fn deref_mut(&mut self) -> &mut AgentProc {
        &mut self.proc
    }
}

/// A sleeping process for the agent to trace (`--pid`).
struct Target {
    child: Child,
}

impl Target {
    fn sleeper() -> Target {
        Target { child: Command::new("sleep").arg("600").stdin(Stdio::null()).spawn().expect("sleep") }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `infertrace agent --pid <a sleeper> --window 1s` with `extra`,
/// and waits (60 s at most) for the line that says where it listens.
fn start_agent(extra: &[&str]) -> Agent {
    let target = Target::sleeper();
    let pid = target.child.id().to_string();
    start_agent_on(target, &["--no-cuda", "--pid", &pid], extra)
}

/// [`start_agent`] on `target`, with `select` (the selection and options).
fn start_agent_on(target: Target, select: &[&str], extra: &[&str]) -> Agent {
    let dir = TempDir::new("agent-http");
    let windows = dir.join("windows");
    let base = ["--window".as_ref(), "1s".as_ref(), "--out-dir".as_ref(), windows.as_os_str()];
    let proc = spawn_agent(base.into_iter().chain(select.iter().chain(extra).map(|a| std::ffi::OsStr::new(*a))));
    Agent { proc, _target: target, dir }
}

impl Agent {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then the exit status and how long it took (panics past 10 s).
    fn terminate(&mut self) -> (std::process::ExitStatus, Duration) {
        let t = Instant::now();
        kill(self.pid(), libc::SIGTERM);
        let status = poll(Duration::from_secs(10), || self.child.try_wait().ok().flatten()).expect("the agent exits after SIGTERM");
        self.guard.disarm();
        (status, t.elapsed())
    }
}

/// Sends `raw`, reads until the server closes (or `timeout`): the whole
/// answer and how long it took; None if the connection failed.
fn exchange(addr: &str, raw: &[u8], timeout: Duration) -> Option<(Vec<u8>, Duration)> {
    let t = Instant::now();
    let mut s = TcpStream::connect_timeout(&addr.parse().ok()?, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.write_all(raw).ok()?;
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    Some((out, t.elapsed()))
}

/// (status, head, body) of an answer.
fn parse(raw: &[u8]) -> (u16, String, Vec<u8>) {
    let text = String::from_utf8_lossy(raw);
    let Some(end) = text.find("\r\n\r\n") else { panic!("no response head in {text:?}") };
    let head = text[..end].to_owned();
    let status = head.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    (status, head, raw[end + 4..].to_vec())
}

fn get(addr: &str, path: &str, extra_header: &str, timeout: Duration) -> Option<(u16, String, Vec<u8>, Duration)> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{extra_header}Connection: close\r\n\r\n");
    let (raw, took) = exchange(addr, req.as_bytes(), timeout)?;
    if raw.is_empty() {
        return None;
    }
    let (status, head, body) = parse(&raw);
    Some((status, head, body, took))
}

/// A counter of `/healthz`'s body.
fn health_counter(addr: &str, name: &str) -> u64 {
    let (_, _, body, _) = get(addr, "/healthz", "", Duration::from_secs(5)).expect("/healthz answers");
    let body = String::from_utf8_lossy(&body).into_owned();
    body.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no {name} in /healthz:\n{body}"))
}

/// utime + stime of `pid`, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

#[test]
fn slow_clients_neither_delay_a_scrape_nor_stay_past_the_deadline() {
    const TEST: &str = "slow_clients_neither_delay_a_scrape_nor_stay_past_the_deadline";
    require!(TEST, Root, Binary);
    let agent = start_agent(&[]);
    let addr = agent.addr.clone();
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nX-Slow: {}\r\n\r\n", "x".repeat(60));
    let opened = Instant::now();
    let mut slow: Vec<Option<TcpStream>> = (0..100)
        .map(|_| {
            let s = TcpStream::connect(&addr).expect("connect");
            s.set_nonblocking(true).expect("nonblocking");
            Some(s)
        })
        .collect();
    let mut closed_at: Vec<Option<Duration>> = vec![None; slow.len()];
    let mut scrapes = Vec::new();
    let mut second = 0;
    // One byte a second on each, a normal scrape every half second, for 9 s.
    while opened.elapsed() < Duration::from_secs(9) {
        if opened.elapsed() >= Duration::from_secs(second) {
            let byte = &request.as_bytes()[second as usize..second as usize + 1];
            for (i, s) in slow.iter_mut().enumerate() {
                let Some(conn) = s else { continue };
                let mut probe = [0u8; 256];
                let gone = match conn.read(&mut probe) {
                    Ok(_) => true,
                    Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                } || conn.write(byte).is_err();
                if gone {
                    closed_at[i] = Some(opened.elapsed());
                    *s = None;
                }
            }
            second += 1;
        }
        let (status, _, body, took) = get(&addr, "/metrics", "", Duration::from_secs(5)).expect("/metrics answers");
        assert_eq!(status, 200, "/metrics with 100 slow clients");
        assert!(String::from_utf8_lossy(&body).contains("# EOF"), "a whole exposition");
        scrapes.push(took);
        std::thread::sleep(Duration::from_millis(500));
    }
    let worst = scrapes.iter().max().copied().unwrap_or_default();
    eprintln!("{TEST}: {} scrapes, the slowest {worst:?}; slow clients closed at {closed_at:?}", scrapes.len());
    assert!(worst < Duration::from_secs(1), "a scrape took {worst:?} with 100 slow clients");
    let open: Vec<usize> = closed_at.iter().enumerate().filter(|(_, c)| c.is_none()).map(|(i, _)| i).collect();
    assert!(open.is_empty(), "slow clients {open:?} still connected after 9 s (deadline 5 s for the whole request)");
    let expired = health_counter(&addr, "http_deadline_expired");
    assert!(expired > 0, "no connection ended by the deadline (the others were evicted as the cap was reached)");
}

/// A non-blocking connect to `addr` (EINPROGRESS is fine: the kernel goes
/// on with the handshake).
fn connect_nonblocking(addr: &SocketAddr) -> Option<OwnedFd> {
    let SocketAddr::V4(v4) = addr else { return None };
    // SAFETY: plain socket calls on a descriptor owned here.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return None;
        }
        let owned = OwnedFd::from_raw_fd(fd);
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr { s_addr: u32::from(*v4.ip()).to_be() },
            sin_zero: [0; 8],
        };
        let rc = libc::connect(fd, &sin as *const _ as *const libc::sockaddr, std::mem::size_of::<libc::sockaddr_in>() as u32);
        if rc != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINPROGRESS) {
            return None;
        }
        Some(owned)
    }
}

/// The highest sequence number among the windows written to `dir` (0: none).
fn newest_window(dir: &std::path::Path) -> u64 {
    let names = std::fs::read_dir(dir).map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect::<Vec<_>>());
    names
        .unwrap_or_default()
        .iter()
        .filter_map(|n| n.strip_suffix(".itr")?.rsplit('-').next()?.parse::<u64>().ok())
        .max()
        .unwrap_or(0)
}

#[test]
fn descriptor_exhaustion_does_not_make_the_accept_loop_spin() {
    const TEST: &str = "descriptor_exhaustion_does_not_make_the_accept_loop_spin";
    require!(TEST, Root, Binary);
    if !in_path("prlimit") {
        return skip(TEST, "prlimit (util-linux)");
    }
    let agent = start_agent(&[]);
    let addr = agent.addr.clone();
    let pid = agent.pid();
    let windows = agent.dir.join("windows");
    // Let the agent settle (its first windows), then measure what it costs
    // with descriptors to spare: the bound below is relative to that.
    std::thread::sleep(Duration::from_secs(2));
    let before = cpu_seconds(pid);
    std::thread::sleep(Duration::from_secs(4));
    let idle = cpu_seconds(pid) - before;
    // Leave it 24 descriptors.
    let used = std::fs::read_dir(format!("/proc/{pid}/fd")).expect("fds").count();
    let limit = used + 24;
    let st = Command::new("prlimit").args(["--pid", &pid.to_string(), &format!("--nofile={limit}:{limit}")]).status().expect("prlimit");
    assert!(st.success(), "prlimit --pid {pid} --nofile={limit}");
    // This process needs 1500 descriptors of its own.
    let want = libc::rlimit { rlim_cur: 4096, rlim_max: 4096 };
    // SAFETY: a valid rlimit.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) };
    assert_eq!(rc, 0, "raise this test's RLIMIT_NOFILE");
    let sa: SocketAddr = addr.parse().expect("address");
    let conns: Vec<OwnedFd> = (0..1500).filter_map(|_| connect_nonblocking(&sa)).collect();
    assert!(conns.len() >= 1400, "only {} connections opened", conns.len());
    std::thread::sleep(Duration::from_secs(1));
    let first = newest_window(&windows);
    let before = cpu_seconds(pid);
    std::thread::sleep(Duration::from_secs(4));
    let cpu = cpu_seconds(pid) - before;
    let last = newest_window(&windows);
    eprintln!(
        "{TEST}: agent used {used} descriptors, limit {limit}; {} connections held; agent CPU over 4 s: {idle:.2} s before, \
         {cpu:.2} s with the connections; windows {first} -> {last}",
        conns.len()
    );
    // A spinning accept loop burns a whole core (4 s here; 0.8 of a core when
    // the issue was found); the agent's own work is in `idle`.
    assert!(
        cpu - idle < 1.0,
        "the agent burnt {cpu:.2} s of CPU in 4 s with its descriptors exhausted, {idle:.2} s before (a spinning accept loop)"
    );
    // 1 s windows: the descriptors left to collection keep them written.
    assert!(last >= first + 2, "windows {first} -> {last} in 4 s of 1 s windows: the connections took the descriptors the windows need");
    drop(conns);
    let back = poll(Duration::from_secs(20), || {
        let (status, _, body, _) = get(&addr, "/metrics", "", Duration::from_secs(2))?;
        (status == 200 && String::from_utf8_lossy(&body).contains("# EOF")).then_some(())
    });
    assert!(back.is_some(), "/metrics does not answer again after the connections closed");
    let exhausted = health_counter(&addr, "http_accept_fd_exhausted");
    assert!(exhausted > 0, "accept never ran out of descriptors: the test did not reach EMFILE");
    assert!(alive(pid), "the agent died");
}

#[test]
fn head_has_no_body_and_a_bare_lf_request_is_answered_at_once() {
    const TEST: &str = "head_has_no_body_and_a_bare_lf_request_is_answered_at_once";
    require!(TEST, Root, Binary);
    let agent = start_agent(&[]);
    let addr = agent.addr.clone();
    let (raw, _) = exchange(&addr, format!("HEAD /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes(), Duration::from_secs(5)).expect("HEAD");
    let (status, head, body) = parse(&raw);
    assert_eq!(status, 200, "HEAD /metrics: {head}");
    let len: usize = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no Content-Length in {head}"));
    assert!(len > 0, "HEAD's Content-Length is the GET body's: {head}");
    assert!(body.is_empty(), "HEAD answered with a body of {} bytes", body.len());

    let (raw, took) = exchange(&addr, b"GET /healthz HTTP/1.1\nHost: x\n\n", Duration::from_secs(5)).expect("bare LF");
    let (status, _, body) = parse(&raw);
    assert_eq!(status, 200, "bare-LF GET /healthz: {}", String::from_utf8_lossy(&body));
    assert!(took < Duration::from_secs(1), "a bare-LF request took {took:?}");
}

fn write_token(dir: &Path, token: &str, mode: u32) -> std::path::PathBuf {
    let f = dir.join("token");
    std::fs::write(&f, format!("{token}\n")).expect("token file");
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).expect("chmod");
    f
}

#[test]
fn a_token_protects_every_endpoint_but_healthz() {
    const TEST: &str = "a_token_protects_every_endpoint_but_healthz";
    require!(TEST, Root, Binary);
    let dir = TempDir::new("agent-http-token");
    let token = "c2VjcmV0LXRva2VuLWZvci10ZXN0cw";
    let file = write_token(dir.path(), token, 0o600);
    let agent = start_agent(&["--auth-token-file", file.to_str().expect("utf-8")]);
    let addr = agent.addr.clone();
    let t = Duration::from_secs(5);
    for path in ["/metrics", "/targets", "/report/latest", "/nothing"] {
        let (status, head, _, _) = get(&addr, path, "", t).expect("answer");
        assert_eq!(status, 401, "{path} without a token");
        assert!(head.contains("WWW-Authenticate: Bearer"), "{path}: {head}");
        let (status, _, _, _) = get(&addr, path, &format!("Authorization: Bearer {token}x\r\n"), t).expect("answer");
        assert_eq!(status, 401, "{path} with a wrong token");
    }
    let (status, _, body, _) = get(&addr, "/metrics", &format!("Authorization: Bearer {token}\r\n"), t).expect("answer");
    assert_eq!(status, 200, "/metrics with the token");
    assert!(String::from_utf8_lossy(&body).contains("# EOF"));
    let (status, _, _, _) = get(&addr, "/targets", &format!("authorization: bearer {token}\r\n"), t).expect("answer");
    assert_eq!(status, 200, "/targets with the token (header and scheme case-insensitive)");
    let (status, _, _, _) = get(&addr, "/healthz", "", t).expect("answer");
    assert_eq!(status, 200, "/healthz stays open");

    // A token others can read is refused, in one line.
    let loose = write_token(dir.path(), token, 0o644);
    let r = run_cmd(
        Command::new(bin()).args(["agent", "--no-cuda", "--pid", "1", "--listen", "127.0.0.1:0", "--auth-token-file"]).arg(&loose).arg("--out-dir").arg(dir.join("w")),
        Duration::from_secs(30),
    );
    assert_eq!(r.code(), Some(1), "a 0644 token file: {}", r.describe());
    let line = single_error_line(&r);
    assert!(line.contains("mode 0644") && line.contains("chmod 600"), "{line}");
}

#[test]
fn tls_serves_https_and_refuses_plain_http() {
    const TEST: &str = "tls_serves_https_and_refuses_plain_http";
    require!(TEST, Root, Binary);
    for tool in ["openssl", "curl"] {
        if !in_path(tool) {
            return skip(TEST, tool);
        }
    }
    let dir = TempDir::new("agent-http-tls");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let st = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl");
    assert!(st.success(), "openssl req");
    // A key others can read is refused, in one line, before anything loads.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let args = ["agent", "--listen", "127.0.0.1:0", "--tls-cert", cert.to_str().expect("utf-8"), "--tls-key", key.to_str().expect("utf-8")];
    let refused = run_cmd(infertrace(args).stdin(Stdio::null()), Duration::from_secs(30));
    let err = refused.stderr.trim();
    assert!(refused.code() != Some(0) && err.contains("TLS key file") && err.contains("mode 0644") && err.lines().count() == 1, "{err}");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let mut agent = start_agent(&["--tls-cert", cert.to_str().expect("utf-8"), "--tls-key", key.to_str().expect("utf-8")]);
    let addr = agent.addr.clone();
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(&cert)
        .arg(format!("https://{addr}/metrics"))
        .output()
        .expect("curl");
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "curl https: {}", String::from_utf8_lossy(&out.stderr));
    assert!(body.contains("# EOF"), "an exposition over https: {body}");
    // Plain HTTP to the TLS port gets no HTTP answer.
    let plain = exchange(&addr, format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes(), Duration::from_secs(6));
    let answered = plain.as_ref().is_some_and(|(raw, _)| raw.starts_with(b"HTTP/"));
    assert!(!answered, "plain HTTP was answered: {:?}", plain.map(|(r, _)| String::from_utf8_lossy(&r).into_owned()));
    let (status, took) = agent.terminate();
    assert!(status.success() && took < Duration::from_secs(2), "exit {status:?} after {took:?}");
}

#[test]
fn sigterm_ends_an_agent_whose_target_churns_executable_mappings() {
    const TEST: &str = "sigterm_ends_an_agent_whose_target_churns_executable_mappings";
    require!(TEST, Root, Binary);
    let Some((python, _)) = system_python() else {
        return skip(TEST, "a python3 on PATH");
    };
    let mut churn = Command::new(&python)
        .arg(workspace_root().join("tests/workloads/exec_map_churn.py"))
        .arg("30")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("workload");
    let lines = line_channel(churn.stdout.take().expect("stdout"));
    let first = lines.recv_timeout(Duration::from_secs(30)).expect("pid line");
    let pid: u32 = first.strip_prefix("pid ").and_then(|p| p.trim().parse().ok()).unwrap_or_else(|| panic!("{first:?}"));
    // CUDA probing on (the default): each new executable mapping is a
    // library to look at, which is what slows the loop down.
    let mut agent = start_agent_on(Target { child: churn }, &["--pid", &pid.to_string()], &[]);
    let addr = agent.addr.clone();
    let started = Instant::now();
    let mut worst = Duration::ZERO;
    let mut healthz = Vec::new();
    // 8 s of churn under trace, both endpoints asked every half second.
    while started.elapsed() < Duration::from_secs(8) {
        let (status, _, body, took) = get(&addr, "/healthz", "", Duration::from_secs(5)).expect("/healthz answers during the churn");
        assert!(status == 200 || status == 503, "/healthz {status}");
        healthz.push((status, String::from_utf8_lossy(&body).lines().next().unwrap_or("").to_owned()));
        worst = worst.max(took);
        let (status, _, _, took) = get(&addr, "/metrics", "", Duration::from_secs(5)).expect("/metrics answers during the churn");
        assert_eq!(status, 200, "/metrics during the churn");
        worst = worst.max(took);
        std::thread::sleep(Duration::from_millis(500));
    }
    let turns_age = get(&addr, "/healthz", "", Duration::from_secs(5)).map(|(_, _, b, _)| String::from_utf8_lossy(&b).into_owned());
    assert!(alive(pid), "the churning target ended early");
    let (status, took) = agent.terminate();
    let stderr: Vec<String> = agent.stderr.try_iter().collect();
    eprintln!("{TEST}: slowest answer {worst:?}; /healthz {healthz:?}; last {turns_age:?}; SIGTERM -> {status:?} in {took:?}");
    assert!(worst < Duration::from_secs(1), "an endpoint took {worst:?} during the churn");
    assert!(took < Duration::from_secs(2), "SIGTERM took {took:?} to end the agent");
    match status.code() {
        Some(0) => assert!(stderr.iter().any(|l| l.contains("the last window is written")), "{stderr:?}"),
        Some(4) => assert!(stderr.iter().any(|l| l.contains("did not stop within")), "{stderr:?}"),
        other => panic!("exit {other:?} after SIGTERM: {stderr:?}"),
    }
}

/// `/report/latest` is kept compressed: served as it is to a client that
/// accepts gzip (with `Content-Encoding: gzip`), inflated for one that
/// does not; both are the JSON report.
#[test]
fn the_latest_report_is_gzip_for_those_who_accept_it() {
    const TEST: &str = "the_latest_report_is_gzip_for_those_who_accept_it";
    require!(TEST, Root, Binary);
    let agent = start_agent(&[]);
    let addr = agent.addr.clone();
    poll(Duration::from_secs(30), || (health_counter(&addr, "windows_written") >= 1).then_some(()))
        .expect("a window within 30 s");
    let t = Duration::from_secs(10);
    let json = |body: &[u8], how: &str| -> serde_json::Value {
        let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_else(|e| panic!("{how}: not JSON ({e})"));
        assert!(v["schema_version"].is_u64() && v["targets"].is_array(), "{how}: not the report: {v}");
        v
    };
    let (status, head, body, _) = get(&addr, "/report/latest", "Accept-Encoding: gzip, deflate\r\n", t).expect("answer");
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("Content-Encoding: gzip"), "{head}");
    let length: usize = head.lines().find_map(|l| l.strip_prefix("Content-Length: ")).and_then(|v| v.trim().parse().ok()).expect("a length");
    assert_eq!(length, body.len(), "Content-Length is the compressed size");
    let mut plain = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(body.as_slice()), &mut plain).expect("a gzip body");
    json(&plain, "inflated");
    for refusing in ["", "Accept-Encoding: identity\r\n", "Accept-Encoding: gzip;q=0\r\n"] {
        let (status, head, body, _) = get(&addr, "/report/latest", refusing, t).expect("answer");
        assert_eq!(status, 200, "{refusing:?}: {head}");
        assert!(!head.contains("Content-Encoding"), "{refusing:?}: {head}");
        json(&body, refusing);
    }
    // HEAD: the same head, no body.
    let (raw, _) = exchange(&addr, format!("HEAD /report/latest HTTP/1.1\r\nHost: {addr}\r\nAccept-Encoding: gzip\r\n\r\n").as_bytes(), t).expect("answer");
    let (status, head, body) = parse(&raw);
    assert_eq!((status, body.len()), (200, 0), "{head}");
    assert!(head.contains("Content-Encoding: gzip"), "{head}");
}
