//! What every HTTP reader shares: the client (one connection pool, the bearer token), opening a serve's
//! event stream, its parser, and the words of a serve's events. The serve sends a whole snapshot when a
//! reading says something new and a one-line `unchanged` when it does not, so a thousand quiet hosts cost
//! their reader almost nothing; the one reader of those streams is `http_group`. Read-only: a kill or a
//! removal is refused at once, saying to use SSH or the agent. What the serve sends is untrusted: events are
//! bounded and parsed, never trusted to be well-formed.

use std::sync::Arc;
use std::time::Duration;

use gpusweep_core::format::{escape, millis, truncate};
use gpusweep_core::model::{Feature, HostSnapshot, SourceKind};
use gpusweep_core::protocol::{MAX_LINE_BYTES, PROTOCOL};
use gpusweep_core::sse;

/// The client every HTTP host and Prometheus server of a fleet shares (one connection pool), with the bearer
/// token for serves that want one.
#[derive(Clone)]
pub struct HttpClient {
    pub client: reqwest::Client,
    pub token: Option<Arc<str>>,
    /// The fleet's key, which checks a `prom:` host's seal.
    pub seal: Option<Arc<gpusweep_core::seal::SealKey>>,
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
    /// The fleet's key (`--seal-key`): a `prom:` host's summary is believed only where its seal checks.
    pub seal_key_file: Option<std::path::PathBuf>,
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
    #[error("--seal-key {0}")]
    SealKey(#[from] gpusweep_core::seal::SealKeyError),
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
        let seal = match &self.seal_key_file {
            Some(p) => Some(Arc::new(gpusweep_core::seal::SealKey::from_file(
                &super::ssh::expand_tilde(p),
            )?)),
            None => None,
        };
        let client = b.build().map_err(HttpClientError::Build)?;
        Ok(HttpClient {
            client,
            token,
            seal,
        })
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
    /// The last event's id buffer, for the next one's: every event of a serve's stream has an id, and an
    /// allocation for each was a tenth of what a 10,000-host stream's parsing allocated.
    spare_id: String,
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
                if let Some(id) = self.cur.id.take() {
                    self.spare_id = id;
                }
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
                let mut id = self
                    .cur
                    .id
                    .take()
                    .unwrap_or_else(|| std::mem::take(&mut self.spare_id));
                value.clone_into(&mut id);
                self.cur.id = Some(id);
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
    super::stream::silence_limits(every, connect_timeout)
}

/// Why an action on a host read over HTTP is refused.
pub(super) const READ_ONLY: &str = "read-only host (read over HTTP from its gpusweep serve): nothing was \
     done; act on it over SSH (--hosts user@node) or through its agent";

pub(super) fn preview(s: &str) -> String {
    truncate(&escape(s.trim()), 80)
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
        // An event's id is its own: none where it has none, the next one's as it says (the buffer reused).
        out.clear();
        p.feed(
            b"event: a\ndata: 1\n\nevent: b\nid: 8-12\ndata: 2\n\nevent: c\nid: 9\ndata: 3\n\n",
            &mut out,
        )
        .expect("ok");
        let ids: Vec<Option<&str>> = out.iter().map(|e| e.id.as_deref()).collect();
        assert_eq!(ids, [None, Some("8-12"), Some("9")]);
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
