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
use crate::{ConnStatus, HostCmd, Refuse};
use gpusweep_core::format::{escape, millis, truncate};
use gpusweep_core::host::HttpUrl;
use gpusweep_core::model::{Feature, HostSnapshot, SourceKind};
use gpusweep_core::protocol::{MAX_LINE_BYTES, PROTOCOL};
use gpusweep_core::sse;

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

/// Why the HTTP client of a fleet could not be made.
#[derive(Debug, thiserror::Error)]
pub enum HttpClientError {
    #[error("http_ca_file {path}: {source}")]
    CaFile {
        path: String,
        source: std::io::Error,
    },
    #[error("http_ca_file {path}: {source}")]
    CaPem {
        path: String,
        source: reqwest::Error,
    },
    #[error("http_token_file {path}: {source}")]
    TokenFile {
        path: String,
        source: std::io::Error,
    },
    #[error("HTTP client: {0}")]
    Build(reqwest::Error),
}

impl HttpOptions {
    /// The shared client: the system's roots plus `ca_file`, no proxy from the environment (a node's
    /// serve is reached directly), no redirects (a serve never sends one).
    pub fn client(&self, connect_timeout: Duration) -> Result<HttpClient, HttpClientError> {
        let mut b = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .user_agent(concat!("gpusweep/", env!("CARGO_PKG_VERSION")));
        if let Some(ca) = &self.ca_file {
            let ca = &super::ssh::expand_tilde(ca);
            let path = ca.display().to_string();
            let pem = std::fs::read(ca).map_err(|source| HttpClientError::CaFile {
                path: path.clone(),
                source,
            })?;
            let cert = reqwest::Certificate::from_pem(&pem)
                .map_err(|source| HttpClientError::CaPem { path, source })?;
            b = b.add_root_certificate(cert);
        }
        let token = match &self.token_file {
            Some(p) => {
                let p = &super::ssh::expand_tilde(p);
                let t =
                    std::fs::read_to_string(p).map_err(|source| HttpClientError::TokenFile {
                        path: p.display().to_string(),
                        source,
                    })?;
                Some(Arc::from(t.lines().next().unwrap_or("").trim()))
            }
            None => None,
        };
        let client = b.build().map_err(HttpClientError::Build)?;
        Ok(HttpClient { client, token })
    }
}

/// One server-sent event.
#[derive(Debug, Default, PartialEq)]
pub(super) struct SseEvent {
    pub event: String,
    pub data: String,
    /// Its `id:`, where it has one.
    pub id: Option<String>,
}

/// Server-sent events out of a byte stream, each at most `MAX_LINE_BYTES`. Lines are read where they
/// arrive; only a line split across chunks is copied, and its buffer is let go once the line is whole (a
/// thousand hosts' streams would otherwise each keep a buffer the size of their largest chunk).
#[derive(Default)]
pub(super) struct SseParser {
    /// The start of a line whose end has not arrived.
    partial: Vec<u8>,
    cur: SseEvent,
}

/// The largest data buffer a parser keeps between events.
const KEEP_DATA_BUFFER: usize = 16 * 1024;

impl SseParser {
    /// Feed bytes; complete events come out (copied: for the tests).
    #[cfg(test)]
    fn feed(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), String> {
        self.feed_each(bytes, &mut |ev| {
            out.push(SseEvent {
                event: ev.event.clone(),
                data: ev.data.clone(),
                id: ev.id.clone(),
            });
            true
        })
    }

    /// Feed bytes; each complete event is shown to `each` as it ends (its buffers are then reused: a
    /// stream of ten thousand hosts' small events allocates nothing per event). `each` returns false to
    /// stop: the rest of the bytes are not read.
    pub fn feed_each(
        &mut self,
        bytes: &[u8],
        each: &mut dyn FnMut(&SseEvent) -> bool,
    ) -> Result<(), String> {
        let mut rest = bytes;
        if !self.partial.is_empty() {
            let Some(n) = memchr::memchr(b'\n', rest) else {
                self.partial.extend_from_slice(rest);
                return self.bounded();
            };
            self.partial.extend_from_slice(&rest[..n]);
            rest = &rest[n + 1..];
            let line = std::mem::take(&mut self.partial);
            if !self.line(&line, each)? {
                return Ok(());
            }
        }
        while let Some(n) = memchr::memchr(b'\n', rest) {
            if !self.line(&rest[..n], each)? {
                return Ok(());
            }
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

    /// One line, without its `\n`; false when `each` said stop.
    fn line(
        &mut self,
        line: &[u8],
        each: &mut dyn FnMut(&SseEvent) -> bool,
    ) -> Result<bool, String> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        // Valid UTF-8 (a serve's lines always are) is read in place, checked at full speed; anything else
        // is read with replacement characters.
        let line = match std::str::from_utf8(line) {
            Ok(l) => std::borrow::Cow::Borrowed(l),
            Err(_) => String::from_utf8_lossy(line),
        };
        if line.is_empty() {
            let mut go = true;
            if !self.cur.data.is_empty() || !self.cur.event.is_empty() {
                go = each(&self.cur);
                self.cur.event.clear();
                self.cur.id = None;
                // A small buffer is kept for the next event; a snapshot's is let go (a thousand streams
                // would otherwise each keep their largest).
                if self.cur.data.capacity() > KEEP_DATA_BUFFER {
                    self.cur.data = String::new();
                } else {
                    self.cur.data.clear();
                }
            }
            return Ok(go);
        }
        if line.starts_with(':') {
            return Ok(true);
        }
        let (field, value) = line.split_once(':').unwrap_or((&line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => value.clone_into(&mut self.cur.event),
            // An id is short (EPOCH-SEQ); a longer one is none (it goes back out as a header).
            "id" if value.len() <= 64 && !value.contains('\0') => {
                self.cur.id = Some(value.to_string());
            }
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
        Ok(true)
    }
}

/// A serve's hello, checked: its protocol must be this one's.
pub(super) fn hello(data: &str) -> Result<sse::Hello, String> {
    let h = serde_json::from_str::<sse::Hello>(data)
        .map_err(|_| format!("not a gpusweep serve: its hello was {:?}", preview(data)))?;
    if h.protocol != PROTOCOL {
        return Err(format!(
            "the serve is gpusweep {} (protocol {}), this one speaks {PROTOCOL}: upgrade one of them",
            escape(&h.version),
            h.protocol
        ));
    }
    Ok(h)
}

/// A `snapshot` event's host object, parsed (or why not) and marked as read over HTTP.
pub(super) fn read_snapshot(data: &str) -> Result<HostSnapshot, String> {
    let mut snap = serde_json::from_str::<HostSnapshot>(data)
        .map_err(|e| format!("a snapshot that does not parse ({e}): {:?}", preview(data)))?;
    as_read_over_http(&mut snap);
    Ok(snap)
}

/// A snapshot as read from a serve: marked so, its counters dropped (an `unchanged` carries gauges alone:
/// kept, counters would read as current while they age; the serve's /metrics has them), and nothing is done
/// over HTTP: the reading says so, as a Prometheus host's does.
fn as_read_over_http(snap: &mut HostSnapshot) {
    snap.source = SourceKind::Http;
    for g in &mut snap.gpus {
        g.counters = None;
    }
    if !snap.missing_features.contains(&Feature::Actions) {
        snap.missing_features.push(Feature::Actions);
    }
}

/// When a serve's host is stale, and when it is given up (down), at the pace readings come: the faster of
/// the client's interval and the serve's own.
pub(super) fn silence_limits(
    interval: Duration,
    serve_interval: Option<Duration>,
    connect_timeout: Duration,
) -> (Duration, Duration) {
    let every = serve_interval.map_or(interval, |s| s.min(interval));
    let stale_after = every.saturating_mul(3).max(Duration::from_secs(3));
    let give_up = every
        .saturating_mul(10)
        .max(stale_after.saturating_mul(2))
        .max(connect_timeout);
    (stale_after, give_up)
}

/// Why an action on a host read over HTTP is refused.
pub(super) const READ_ONLY: &str = "read-only host (read over HTTP from its gpusweep serve): nothing was \
     done; act on it over SSH (--hosts user@node) or through its agent";

/// What ended one stream.
enum Ended {
    /// The poll interval changed: connect again at once with the new one.
    Interval,
    Failed(String),
    Stopped,
}

pub(super) fn preview(s: &str) -> String {
    truncate(&escape(s.trim()), 80)
}

/// Read the host until the fleet goes away. Err says why the connection failed (the task backs off and
/// connects again); a new interval reconnects at once, asking for it.
pub async fn run(
    task: &RemoteTask,
    base: &HttpUrl,
    cmds: &mut mpsc::Receiver<HostCmd>,
    interval: &mut Duration,
    resume: &mut Option<String>,
) -> Result<(), String> {
    let http = task
        .opts
        .http
        .clone()
        .ok_or_else(|| "no HTTP client".to_string())?;
    loop {
        match stream(task, base, &http, cmds, interval, resume).await {
            Ended::Interval => {}
            Ended::Failed(e) => return Err(e),
            Ended::Stopped => return Ok(()),
        }
    }
}

/// Open the event stream, asking for this interval, from where it was (`Last-Event-ID`); a refusal says why
/// (and where a token goes).
async fn connect(
    task: &RemoteTask,
    base: &HttpUrl,
    http: &HttpClient,
    interval: Duration,
    resume: Option<&str>,
) -> Result<reqwest::Response, String> {
    let url = format!("{}/api/v1/events", base.base());
    open_events(
        http,
        &url,
        &[],
        task.opts.ssh.connect_timeout,
        interval,
        resume,
    )
    .await
}

/// Open an event stream at `url` (with `query` besides the interval), from where it was (`Last-Event-ID`);
/// a refusal says why (and where a token goes).
pub(super) async fn open_events(
    http: &HttpClient,
    url: &str,
    query: &[(&str, &str)],
    connect_timeout: Duration,
    interval: Duration,
    resume: Option<&str>,
) -> Result<reqwest::Response, String> {
    let mut req = http
        .client
        .get(url)
        .query(&[("interval", format!("{}ms", millis(interval)))])
        .query(query)
        .header(reqwest::header::ACCEPT, "text/event-stream");
    if let Some(t) = &http.token {
        req = req.bearer_auth(t);
    }
    if let Some(id) = resume.and_then(|r| reqwest::header::HeaderValue::from_str(r).ok()) {
        req = req.header("last-event-id", id);
    }
    let resp = match tokio::time::timeout(connect_timeout, req.send()).await {
        Err(_) => return Err(format!("no answer within {}s", connect_timeout.as_secs())),
        Ok(Err(e)) => return Err(describe(&e)),
        Ok(Ok(r)) => r,
    };
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
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
    Err(format!(
        "HTTP {}{hint}: {}",
        status.as_u16(),
        preview(body.lines().next().unwrap_or(""))
    ))
}

/// One stream's state: whether the serve said hello, how often it reads, when it last sent a reading.
struct Stream<'t> {
    task: &'t RemoteTask,
    base: &'t HttpUrl,
    /// The last event's id: where the next connection resumes.
    resume: &'t mut Option<String>,
    said_hello: bool,
    /// The serve's own interval, once its hello says it; readings come at the faster of it and ours.
    serve_interval: Option<Duration>,
    last: Instant,
    stale: bool,
    /// Up is said once, at the first reading (and again after a silence), not at every reading.
    up: bool,
}

/// What one event, chunk or command amounts to.
enum Step {
    Go,
    End(Ended),
}

impl Stream<'_> {
    /// When the stream is stale, and when it is given up, at the pace readings come.
    fn limits(&self, interval: Duration) -> (Duration, Duration) {
        silence_limits(
            interval,
            self.serve_interval,
            self.task.opts.ssh.connect_timeout,
        )
    }

    fn on_silence(&mut self) -> Step {
        let silent = self.last.elapsed();
        if self.stale {
            return Step::End(Ended::Failed(format!(
                "no reading from the serve for {}s: reconnecting",
                silent.as_secs()
            )));
        }
        self.stale = true;
        let st = ConnStatus::Stale {
            silent_ms: millis(silent),
        };
        if self.task.status(st) {
            Step::Go
        } else {
            Step::End(Ended::Stopped)
        }
    }

    /// A reading came: the host is up (said once) and fresh.
    fn heard(&mut self) -> bool {
        self.last = Instant::now();
        let was = self.stale || !self.up;
        (self.stale, self.up) = (false, true);
        !was || self.task.status(ConnStatus::Up)
    }

    fn on_hello(&mut self, data: &str) -> Result<(), String> {
        let h = hello(data)?;
        if h.hosts.len() != 1 {
            let names: Vec<String> = h
                .hosts
                .iter()
                .take(5)
                .map(|n| escape(n).into_owned())
                .collect();
            let base = self.base.base();
            return Err(format!(
                "{base} serves {} hosts ({}): name one, e.g. {base}/hosts/{}",
                h.hosts.len(),
                names.join(", "),
                names.first().map_or("NAME", String::as_str)
            ));
        }
        self.serve_interval = h.interval_ms.map(|ms| Duration::from_millis(ms.max(1)));
        self.said_hello = true;
        Ok(())
    }

    /// One event of the stream. Readings go to the sink as they are: whether one says anything new is the
    /// runtime's to decide.
    fn on_event(&mut self, ev: &SseEvent) -> Step {
        if let Some(id) = &ev.id {
            id.clone_into(self.resume.get_or_insert_default());
        }
        let kind = sse::Kind::parse(&ev.event);
        if kind == Some(sse::Kind::Hello) {
            return match self.on_hello(&ev.data) {
                Ok(()) => Step::Go,
                Err(e) => Step::End(Ended::Failed(e)),
            };
        }
        if !self.said_hello {
            return Step::End(Ended::Failed(format!(
                "not a gpusweep serve: it began with {:?}",
                preview(&ev.event)
            )));
        }
        let sent = match kind {
            Some(sse::Kind::Snapshot) => {
                let snap = match read_snapshot(&ev.data) {
                    Ok(s) => s,
                    Err(e) => return Step::End(Ended::Failed(e)),
                };
                self.heard() && self.task.sink.reading(snap)
            }
            Some(sse::Kind::Unchanged) => {
                let Ok(u) = serde_json::from_str::<sse::Unchanged>(&ev.data) else {
                    return Step::End(Ended::Failed(format!(
                        "garbage from the serve: {:?}",
                        preview(&ev.data)
                    )));
                };
                self.heard()
                    && self
                        .task
                        .sink
                        .fresh(u.taken_at_ms, u.gauges.unwrap_or_default())
            }
            // Only a stream that asks is sent memory alone; this one does not.
            Some(sse::Kind::Memory) => {
                return Step::End(Ended::Failed(
                    "the serve sent memory alone, which this stream did not ask for".into(),
                ));
            }
            Some(sse::Kind::Status) => {
                if let Ok(s) = serde_json::from_str::<sse::Status>(&ev.data)
                    && s.status == sse::Conn::Down
                {
                    let why = escape(s.reason.as_deref().unwrap_or("down")).into_owned();
                    self.up = false;
                    self.task
                        .status(ConnStatus::Down(format!("at the serve: {why}")))
                } else {
                    true
                }
            }
            // The timeline's events: the client's ledger makes its own from the snapshots (a gap in them
            // loses it nothing: the snapshot that follows says what is there now). A name this version does
            // not know is a newer serve's: left alone.
            Some(sse::Kind::Event | sse::Kind::Hello | sse::Kind::Gap) | None => true,
        };
        if sent {
            Step::Go
        } else {
            Step::End(Ended::Stopped)
        }
    }

    fn on_cmd(&self, c: Option<HostCmd>, interval: &mut Duration) -> Step {
        match c {
            None => Step::End(Ended::Stopped),
            Some(HostCmd::Interval(d)) if d != *interval => {
                *interval = d;
                Step::End(Ended::Interval)
            }
            // The serve reads at its own pace; a host gone quiet is asked again by reconnecting.
            Some(HostCmd::PollNow | HostCmd::Wake) if self.stale => Step::End(Ended::Interval),
            Some(HostCmd::Interval(_) | HostCmd::PollNow | HostCmd::Wake) => Step::Go,
            Some(c @ HostCmd::Act { .. }) => {
                c.refuse(self.task.sink.as_ref(), READ_ONLY);
                Step::Go
            }
        }
    }
}

/// One stream: connect, hello, readings, commands, silences, until it ends.
async fn stream(
    task: &RemoteTask,
    base: &HttpUrl,
    http: &HttpClient,
    cmds: &mut mpsc::Receiver<HostCmd>,
    interval: &mut Duration,
    resume: &mut Option<String>,
) -> Ended {
    let mut resp = match connect(task, base, http, *interval, resume.as_deref()).await {
        Ok(r) => r,
        Err(e) => return Ended::Failed(e),
    };
    let mut parser = SseParser::default();
    let mut st = Stream {
        task,
        base,
        resume,
        said_hello: false,
        serve_interval: None,
        last: Instant::now(),
        stale: false,
        up: false,
    };
    loop {
        let (stale_after, give_up) = st.limits(*interval);
        let alarm = st.last + if st.stale { give_up } else { stale_after };
        let step = tokio::select! {
            // What the serve sent comes before any judgement of its silence.
            biased;
            chunk = resp.chunk() => {
                let bytes = match chunk {
                    Ok(Some(b)) => b,
                    Ok(None) => return Ended::Failed("the serve closed the stream".into()),
                    Err(e) => return Ended::Failed(describe(&e)),
                };
                let mut step = Step::Go;
                let fed = parser.feed_each(&bytes, &mut |ev| {
                    step = st.on_event(ev);
                    matches!(step, Step::Go)
                });
                if let Err(e) = fed {
                    return Ended::Failed(format!("from the serve: {e}"));
                }
                step
            }
            c = cmds.recv() => st.on_cmd(c, interval),
            () = tokio::time::sleep_until(alarm) => {
                let now = Instant::now();
                if super::silence_is_the_hosts(alarm, now) {
                    st.on_silence()
                } else {
                    // This client was not running: the serve's readings wait in the socket. Silence counts
                    // again from now, once they can be read.
                    st.last = now;
                    Step::Go
                }
            }
        };
        if let Step::End(e) = step {
            return e;
        }
    }
}

/// A reqwest error in words, with its cause (connection refused, certificate unknown...).
pub(super) fn describe(e: &reqwest::Error) -> String {
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
            b":1}\r\n\r\n: keep-alive\n\nevent:snapshot\nid: 7-3\ndata:x\ndata:y\n\n",
            &mut out,
        )
        .expect("ok");
        assert_eq!(
            out,
            vec![
                SseEvent {
                    event: "hello".into(),
                    data: "{\"a\":1}".into(),
                    id: None
                },
                SseEvent {
                    event: "snapshot".into(),
                    data: "x\ny".into(),
                    id: Some("7-3".into())
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
                data: "{\"taken_at_ms\":5}".into(),
                id: None
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
