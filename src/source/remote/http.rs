//! `http(s)://` hosts: a remote `gpusweep serve` read through its event stream (`/api/v1/events`). The serve
//! sends a whole snapshot when a reading says something new and a one-line `unchanged` when it does not, so a
//! thousand quiet hosts cost their reader almost nothing. Read-only: a kill or a removal is refused at once,
//! saying to use SSH or the agent. What the serve sends is untrusted: events are bounded and parsed, never
//! trusted to be well-formed.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::RemoteTask;
use crate::core::format::{escape, millis, truncate};
use crate::core::host::HttpUrl;
use crate::core::model::{HostSnapshot, SourceKind};
use crate::core::protocol::{MAX_LINE_BYTES, PROTOCOL};
use crate::source::{ConnStatus, HostCmd};

/// The client every HTTP host and Prometheus server of a fleet shares (one connection pool), with the bearer
/// token for serves that want one.
#[derive(Clone)]
pub struct HttpClient {
    pub client: reqwest::Client,
    pub token: Option<Arc<str>>,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .finish_non_exhaustive()
    }
}

/// Where a client's token and extra trusted certificate come from (config `http_token_file`,
/// `http_ca_file`, or `GPUSWEEP_HTTP_TOKEN_FILE` / `GPUSWEEP_HTTP_CA_FILE`).
#[derive(Debug, Clone, Default)]
pub struct HttpOptions {
    pub token_file: Option<std::path::PathBuf>,
    pub ca_file: Option<std::path::PathBuf>,
}

impl HttpOptions {
    /// The shared client: the system's roots plus `ca_file`, no proxy from the environment (a node's
    /// serve is reached directly), no redirects (a serve never sends one).
    pub fn client(&self, connect_timeout: Duration) -> Result<HttpClient, String> {
        let mut b = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .user_agent(concat!("gpusweep/", env!("CARGO_PKG_VERSION")));
        if let Some(ca) = &self.ca_file {
            let ca = &super::ssh::expand_tilde(ca);
            let pem =
                std::fs::read(ca).map_err(|e| format!("http_ca_file {}: {e}", ca.display()))?;
            let cert = reqwest::Certificate::from_pem(&pem)
                .map_err(|e| format!("http_ca_file {}: {e}", ca.display()))?;
            b = b.add_root_certificate(cert);
        }
        let token = match &self.token_file {
            Some(p) => {
                let p = &super::ssh::expand_tilde(p);
                let t = std::fs::read_to_string(p)
                    .map_err(|e| format!("http_token_file {}: {e}", p.display()))?;
                Some(Arc::from(t.lines().next().unwrap_or("").trim()))
            }
            None => None,
        };
        let client = b.build().map_err(|e| format!("HTTP client: {e}"))?;
        Ok(HttpClient { client, token })
    }
}

/// One server-sent event.
#[derive(Debug, Default, PartialEq)]
struct SseEvent {
    event: String,
    data: String,
}

/// Server-sent events out of a byte stream, each at most `MAX_LINE_BYTES`. Lines are read where they
/// arrive; only a line split across chunks is copied, and its buffer is let go once the line is whole (a
/// thousand hosts' streams would otherwise each keep a buffer the size of their largest chunk).
#[derive(Default)]
struct SseParser {
    /// The start of a line whose end has not arrived.
    partial: Vec<u8>,
    cur: SseEvent,
}

impl SseParser {
    /// Feed bytes; complete events come out.
    fn feed(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), String> {
        let mut rest = bytes;
        if !self.partial.is_empty() {
            let Some(n) = rest.iter().position(|&b| b == b'\n') else {
                self.partial.extend_from_slice(rest);
                return self.bounded();
            };
            self.partial.extend_from_slice(&rest[..n]);
            rest = &rest[n + 1..];
            let line = std::mem::take(&mut self.partial);
            self.line(&line, out)?;
        }
        while let Some(n) = rest.iter().position(|&b| b == b'\n') {
            self.line(&rest[..n], out)?;
            rest = &rest[n + 1..];
        }
        self.partial.extend_from_slice(rest);
        self.bounded()
    }

    fn bounded(&self) -> Result<(), String> {
        if self.partial.len() > MAX_LINE_BYTES {
            return Err(format!("a line longer than {MAX_LINE_BYTES} bytes"));
        }
        Ok(())
    }

    /// One line, without its `\n`.
    fn line(&mut self, line: &[u8], out: &mut Vec<SseEvent>) -> Result<(), String> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let line = String::from_utf8_lossy(line);
        if line.is_empty() {
            if !self.cur.data.is_empty() || !self.cur.event.is_empty() {
                out.push(std::mem::take(&mut self.cur));
            }
            return Ok(());
        }
        if line.starts_with(':') {
            return Ok(());
        }
        let (field, value) = line.split_once(':').unwrap_or((&line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => value.clone_into(&mut self.cur.event),
            "data" => {
                if !self.cur.data.is_empty() {
                    self.cur.data.push('\n');
                }
                self.cur.data.push_str(value);
            }
            _ => {}
        }
        if self.cur.data.len() > MAX_LINE_BYTES {
            return Err(format!("an event longer than {MAX_LINE_BYTES} bytes"));
        }
        Ok(())
    }
}

#[derive(serde::Deserialize)]
struct Hello {
    protocol: u32,
    version: String,
    hosts: Vec<String>,
}

#[derive(serde::Deserialize)]
struct Unchanged {
    taken_at_ms: u64,
    #[serde(default)]
    gauges: Vec<crate::core::model::Gauges>,
}

#[derive(serde::Deserialize)]
struct Status {
    status: String,
    reason: Option<String>,
}

/// What ended one stream.
enum Ended {
    /// The poll interval changed: connect again at once with the new one.
    Interval,
    Failed(String),
    Stopped,
}

fn preview(s: &str) -> String {
    truncate(&escape(s.trim()), 80)
}

/// Read the host until the fleet goes away. Err says why the connection failed (the task backs off and
/// connects again); a new interval reconnects at once, asking for it.
pub async fn run(
    task: &RemoteTask,
    url: &str,
    cmds: &mut mpsc::Receiver<HostCmd>,
    interval: &mut Duration,
) -> Result<(), String> {
    let base = HttpUrl::parse(url)?;
    let http = task
        .opts
        .http
        .clone()
        .ok_or_else(|| "no HTTP client".to_string())?;
    loop {
        match stream(task, &base, &http, cmds, interval).await {
            Ended::Interval => {}
            Ended::Failed(e) => return Err(e),
            Ended::Stopped => return Ok(()),
        }
    }
}

#[allow(clippy::too_many_lines)] // one stream: connect, hello, readings, commands, silences
async fn stream(
    task: &RemoteTask,
    base: &HttpUrl,
    http: &HttpClient,
    cmds: &mut mpsc::Receiver<HostCmd>,
    interval: &mut Duration,
) -> Ended {
    let connect_timeout = task.opts.ssh.connect_timeout;
    let mut req = http
        .client
        .get(format!("{}/api/v1/events", base.base()))
        .query(&[("interval", format!("{}ms", millis(*interval)))])
        .header(reqwest::header::ACCEPT, "text/event-stream");
    if let Some(t) = &http.token {
        req = req.bearer_auth(t);
    }
    let resp = match tokio::time::timeout(connect_timeout, req.send()).await {
        Err(_) => {
            return Ended::Failed(format!("no answer within {}s", connect_timeout.as_secs()));
        }
        Ok(Err(e)) => return Ended::Failed(describe(&e)),
        Ok(Ok(r)) => r,
    };
    let status = resp.status();
    if !status.is_success() {
        let body = tokio::time::timeout(Duration::from_secs(2), resp.text())
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        let hint = if status == reqwest::StatusCode::UNAUTHORIZED {
            " (set http_token_file in the config, or GPUSWEEP_HTTP_TOKEN_FILE)"
        } else {
            ""
        };
        return Ended::Failed(format!(
            "HTTP {}{hint}: {}",
            status.as_u16(),
            preview(body.lines().next().unwrap_or(""))
        ));
    }
    let mut resp = resp;
    let mut parser = SseParser::default();
    let mut events = Vec::new();
    let mut said_hello = false;
    // The serve's own interval, once its hello says it; readings come at the faster of it and ours.
    let mut serve_interval: Option<Duration> = None;
    let mut last = Instant::now();
    let mut stale = false;
    // Up is said once, at the first reading (and again after a silence), not at every reading.
    let mut up = false;
    // The last whole snapshot, kept fresh: sent whole again after a silence.
    let mut whole: Option<HostSnapshot> = None;
    loop {
        let every = serve_interval.map_or(*interval, |s| s.min(*interval));
        let stale_after = every.saturating_mul(3).max(Duration::from_secs(3));
        let give_up = every
            .saturating_mul(10)
            .max(stale_after.saturating_mul(2))
            .max(connect_timeout);
        let alarm = last + if stale { give_up } else { stale_after };
        tokio::select! {
            () = tokio::time::sleep_until(alarm) => {
                let silent = last.elapsed();
                if stale {
                    return Ended::Failed(format!("no reading from the serve for {}s: reconnecting", silent.as_secs()));
                }
                stale = true;
                if !task.status(ConnStatus::Stale { silent_ms: millis(silent) }) {
                    return Ended::Stopped;
                }
            }
            chunk = resp.chunk() => {
                let bytes = match chunk {
                    Ok(Some(b)) => b,
                    Ok(None) => return Ended::Failed("the serve closed the stream".into()),
                    Err(e) => return Ended::Failed(describe(&e)),
                };
                if let Err(e) = parser.feed(&bytes, &mut events) {
                    return Ended::Failed(format!("from the serve: {e}"));
                }
                for ev in events.drain(..) {
                    match ev.event.as_str() {
                        "hello" => {
                            let Ok(h) = serde_json::from_str::<Hello>(&ev.data) else {
                                return Ended::Failed(format!("not a gpusweep serve: its hello was {:?}", preview(&ev.data)));
                            };
                            if h.protocol != PROTOCOL {
                                return Ended::Failed(format!(
                                    "the serve is gpusweep {} (protocol {}), this one speaks {PROTOCOL}: upgrade one of them",
                                    escape(&h.version), h.protocol
                                ));
                            }
                            if h.hosts.len() != 1 {
                                let names: Vec<String> = h.hosts.iter().take(5).map(|n| escape(n).into_owned()).collect();
                                return Ended::Failed(format!(
                                    "{} serves {} hosts ({}): name one, e.g. {}/hosts/{}",
                                    base.base(), h.hosts.len(), names.join(", "), base.base(),
                                    names.first().map_or("NAME", String::as_str)
                                ));
                            }
                            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&ev.data)
                                && let Some(ms) = v.get("interval_ms").and_then(serde_json::Value::as_u64)
                            {
                                serve_interval = Some(Duration::from_millis(ms.max(1)));
                            }
                            said_hello = true;
                        }
                        _ if !said_hello => {
                            return Ended::Failed(format!("not a gpusweep serve: it began with {:?}", preview(&ev.event)));
                        }
                        "snapshot" => {
                            let mut snap = match serde_json::from_str::<HostSnapshot>(&ev.data) {
                                Ok(s) => s,
                                Err(e) => return Ended::Failed(format!("a snapshot that does not parse ({e}): {:?}", preview(&ev.data))),
                            };
                            snap.source = SourceKind::Http;
                            last = Instant::now();
                            whole = Some(snap.clone());
                            if (stale || !up) && !task.status(ConnStatus::Up) {
                                return Ended::Stopped;
                            }
                            (stale, up) = (false, true);
                            if !task.sink.reading(snap) {
                                return Ended::Stopped;
                            }
                        }
                        "unchanged" => {
                            let Ok(u) = serde_json::from_str::<Unchanged>(&ev.data) else {
                                return Ended::Failed(format!("garbage from the serve: {:?}", preview(&ev.data)));
                            };
                            last = Instant::now();
                            // The gauges come only when they moved: the whole reading kept takes them.
                            if let Some(w) = whole.as_mut() {
                                w.refresh(u.taken_at_ms, &u.gauges);
                            }
                            // After a silence the reading goes on whole: whoever counted the host
                            // unreadable needs a reading to count it again.
                            let sent = match whole.as_ref() {
                                Some(w) if stale || !up => {
                                    (stale, up) = (false, true);
                                    task.status(ConnStatus::Up);
                                    task.sink.reading(w.clone())
                                }
                                _ => task.sink.fresh(u.taken_at_ms, u.gauges),
                            };
                            if !sent {
                                return Ended::Stopped;
                            }
                        }
                        "status" => {
                            let Ok(s) = serde_json::from_str::<Status>(&ev.data) else { continue };
                            if s.status == "down" {
                                let why = escape(s.reason.as_deref().unwrap_or("down")).into_owned();
                                task.status(ConnStatus::Down(format!("at the serve: {why}")));
                                up = false;
                            }
                        }
                        // The timeline's events: the client computes its own from the snapshots.
                        _ => {}
                    }
                }
            }
            c = cmds.recv() => match c {
                None => return Ended::Stopped,
                Some(HostCmd::Interval(d)) => {
                    if d != *interval {
                        *interval = d;
                        return Ended::Interval;
                    }
                }
                // The serve reads at its own pace; a host gone quiet is asked again by reconnecting.
                Some(HostCmd::PollNow | HostCmd::Wake) => {
                    if stale {
                        return Ended::Interval;
                    }
                }
                Some(c @ HostCmd::Act { .. }) => {
                    c.refuse(
                        task.sink.as_ref(),
                        "read-only host (read over HTTP from its gpusweep serve): nothing was done; \
                         act on it over SSH (--hosts user@node) or through its agent",
                    );
                }
            },
        }
    }
}

/// A reqwest error in words, with its cause (connection refused, certificate unknown...).
fn describe(e: &reqwest::Error) -> String {
    use std::error::Error as _;
    // The innermost cause says what happened (connection refused, unknown certificate...).
    let mut cause = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        cause = c.to_string();
        src = c.source();
    }
    let s = if e.is_connect() {
        format!("cannot connect: {cause}")
    } else if e.is_timeout() {
        format!("timed out: {cause}")
    } else {
        cause
    };
    truncate(&escape(&s), 300)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_chunks_and_lines_with_cr() {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        p.feed(b"event: hello\r\ndata: {\"a\"", &mut out)
            .expect("ok");
        assert!(out.is_empty());
        p.feed(
            b":1}\r\n\r\n: keep-alive\n\nevent:snapshot\ndata:x\ndata:y\n\n",
            &mut out,
        )
        .expect("ok");
        assert_eq!(
            out,
            vec![
                SseEvent {
                    event: "hello".into(),
                    data: "{\"a\":1}".into()
                },
                SseEvent {
                    event: "snapshot".into(),
                    data: "x\ny".into()
                }
            ]
        );
    }

    #[test]
    fn a_line_split_byte_by_byte_is_read_and_its_buffer_let_go() {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        for b in b"event: unchanged\ndata: {\"taken_at_ms\":5}\n\n" {
            p.feed(&[*b], &mut out).expect("ok");
        }
        assert_eq!(
            out,
            vec![SseEvent {
                event: "unchanged".into(),
                data: "{\"taken_at_ms\":5}".into()
            }]
        );
        assert_eq!(p.partial.capacity(), 0, "nothing kept between events");
    }

    #[test]
    fn an_endless_line_is_refused() {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        let big = vec![b'a'; MAX_LINE_BYTES + 10];
        assert!(p.feed(&big, &mut out).is_err());
    }
}
