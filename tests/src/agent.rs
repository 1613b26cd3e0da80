//! `infertrace agent` under test: started on a free loopback port
//! (`--listen 127.0.0.1:0`), its address read from its `listening on
//! SCHEME://ADDR` line, its stderr lines kept; and plain HTTP GETs.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use crate::{infertrace, line_channel, KillOnDrop};

/// A running agent.
pub struct AgentProc {
    pub child: Child,
    /// `HOST:PORT` it listens on.
    pub addr: String,
    /// Its stderr, line by line (what [`AgentProc::wait_line`] has not read).
    pub stderr: Receiver<String>,
    /// The stderr lines read so far.
    pub lines: Vec<String>,
    pub guard: KillOnDrop,
}

/// Starts `infertrace agent --listen 127.0.0.1:0 ARGS` and waits (60 s at
/// most) for the line that says where it listens.
pub fn spawn_agent<I, S>(args: I) -> AgentProc
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let mut child = infertrace(["agent", "--listen", "127.0.0.1:0"])
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn infertrace agent");
    let guard = KillOnDrop::new(child.id());
    let stderr = line_channel(child.stderr.take().expect("stderr"));
    let mut a = AgentProc { child, addr: String::new(), stderr, lines: Vec::new(), guard };
    let line = a.wait_line(|l| l.contains("listening on "), Duration::from_secs(60), &format!("the agent did not say where it listens ({args:?})"));
    let url = line.split("listening on ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap_or_default();
    a.addr = url.split("://").nth(1).unwrap_or(url).to_owned();
    a
}

impl AgentProc {
    /// Waits for a stderr line matching `f` (every line read is kept in
    /// `lines`); panics with `what` and the lines so far past `timeout`.
    pub fn wait_line(&mut self, f: impl Fn(&str) -> bool, timeout: Duration, what: &str) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.lines.iter().find(|l| f(l)) {
                return l.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(l) => self.lines.push(l),
                Err(_) => panic!("{what}; stderr so far:\n{}", self.lines.join("\n")),
            }
        }
    }
}

/// GET `path` over plain HTTP/1.1 (20 s read timeout): (status, head, body);
/// None when the connection or the answer failed.
pub fn http_get(addr: &str, path: &str) -> Option<(u16, String, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, head.to_owned(), body.to_owned()))
}
