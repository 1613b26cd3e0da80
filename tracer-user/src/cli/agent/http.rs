//! The agent's HTTP endpoints, on `--listen` (loopback by default):
//! `/metrics` (OpenMetrics text, `prometheus-client`), `/healthz`,
//! `/targets` (JSON), `/report/latest` (the last window's JSON report).
//! A deliberately small HTTP/1.1 server: GET only, one request per
//! connection, request head capped at 8 KiB.

use std::sync::{Arc, Mutex};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// The default `--listen` address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9475";

/// What the endpoints serve, updated by the agent's loop.
pub struct Shared {
    /// The `/metrics` text, rendered by the agent's loop at each publish
    /// (at most `PUBLISH_EVERY` old): a scrape copies it.
    pub metrics_text: String,
    /// `/metrics` requests served (the series of exited targets wait for two).
    pub metrics_scrapes: u64,
    pub targets_json: String,
    pub latest_report: Option<String>,
    pub windows_written: u64,
}

pub type SharedState = Arc<Mutex<Shared>>;

pub async fn serve(listener: TcpListener, state: SharedState) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let state = state.clone();
        tokio::spawn(async move {
            let _ = handle(stream, state).await;
        });
    }
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

async fn handle(mut stream: TcpStream, state: SharedState) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let head_end = loop {
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), stream.read(&mut chunk))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > 8192 {
            return respond(&mut stream, 431, "text/plain", "request head too large\n").await;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]);
    let mut first = head.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
    if method != "GET" && method != "HEAD" {
        return respond(&mut stream, 405, "text/plain", "only GET\n").await;
    }
    let path = target.split('?').next().unwrap_or("");
    let (status, ctype, body) = {
        let mut s = match state.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        match path {
            "/metrics" => {
                s.metrics_scrapes += 1;
                (200, OPENMETRICS, s.metrics_text.clone())
            }
            "/healthz" => (200, "text/plain", format!("ok\nwindows_written {}\n", s.windows_written)),
            "/targets" => (200, "application/json", s.targets_json.clone()),
            "/report/latest" => match &s.latest_report {
                Some(r) => (200, "application/json", r.clone()),
                None => (404, "text/plain", "no window has closed yet\n".to_owned()),
            },
            _ => (404, "text/plain", "not found; try /metrics, /healthz, /targets, /report/latest\n".to_owned()),
        }
    };
    respond(&mut stream, status, ctype, &body).await
}

async fn respond(stream: &mut TcpStream, status: u16, ctype: &str, body: &str) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Request Header Fields Too Large",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}
