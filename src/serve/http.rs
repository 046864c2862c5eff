//! The HTTP endpoints of `gpusweep serve`. Read-only by construction: every route is a GET, none of them
//! reaches a signal or a removal. With `--token-file` every route but `/healthz` wants
//! `Authorization: Bearer TOKEN`.
//!
//! ```text
//! /metrics             OpenMetrics text: dcgm-exporter's memory gauges and gpusweep's own
//! /api/v1/snapshot     the JSON contract of `gpusweep snapshot --json`
//! /api/v1/events       server-sent events: hello, snapshot (when a reading says something new), unchanged
//!                      (a reading that says the same: its time, and its gauges when they moved), memory
//!                      (only its memory moved, to a stream that asks), event (the timeline), status, gap;
//!                      each with an id (EPOCH-SEQ), so a client that reconnects with Last-Event-ID is
//!                      given the timeline events it missed
//! /healthz             200 when every host has a fresh reading, 503 saying why not
//! /hosts/NAME/...      the same, for one of several hosts (a demo fleet)
//! ```

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use futures::Stream;
use tokio::sync::broadcast;

use super::frame::{Frame, sse_body};
use super::hub::{Logged, Missed, Reading, Shared};
use crate::core::conn::ConnStatus;
use crate::core::format::fmt_ms;
use crate::core::model::now_ms;
use crate::core::parse::parse_duration;
use crate::core::protocol::PROTOCOL;
use crate::core::sse;

/// The fastest polling an HTTP client may ask for: a remote reader must not be able to load the node.
pub const MIN_HTTP_INTERVAL: Duration = Duration::from_millis(100);

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone)]
pub struct Web {
    pub shared: Arc<Shared>,
    /// The bearer token every request but /healthz must carry.
    pub token: Option<Arc<str>>,
    /// Places for event streams: half of the HTTP connections, so streams that stay open never leave
    /// `/healthz` and a scrape without one.
    pub streams: Arc<tokio::sync::Semaphore>,
    /// Metric families left out (`--metrics-leave-out`): names starting with one of these.
    pub leave_out: Arc<[String]>,
}

pub fn router(web: Web) -> Router {
    let host_routes = Router::new()
        .route("/metrics", get(host_metrics))
        .route("/api/v1/snapshot", get(host_snapshot))
        .route("/api/v1/events", get(host_events))
        .route("/healthz", get(host_health));
    Router::new()
        .route("/metrics", get(all_metrics))
        .route("/api/v1/snapshot", get(all_snapshot))
        .route("/api/v1/events", get(all_events))
        .route("/healthz", get(all_health))
        .nest("/hosts/{name}", host_routes)
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(web.clone(), auth))
        .with_state(web)
}

/// Equal in constant time: how long a comparison takes says nothing of where a guess went wrong.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn auth(State(web): State<Web>, req: Request, next: Next) -> Response {
    let Some(token) = &web.token else {
        return next.run(req).await;
    };
    let path = req.uri().path();
    if path == "/healthz" || (path.starts_with("/hosts/") && path.ends_with("/healthz")) {
        return next.run(req).await;
    }
    let given = req.headers().get(header::AUTHORIZATION).and_then(|v| {
        // The scheme is case-insensitive (RFC 9110 11.1): `bearer`, `BEARER` are `Bearer`.
        let v = v.as_bytes();
        (v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ")).then(|| &v[7..])
    });
    if given.is_some_and(|g| same(g, token.as_bytes())) {
        return next.run(req).await;
    }
    let mut r = (StatusCode::UNAUTHORIZED, "a bearer token is required\n").into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"gpusweep\""),
    );
    r
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        "gpusweep serve: /metrics, /api/v1/snapshot, /api/v1/events, /healthz, /hosts/NAME/...\n",
    )
        .into_response()
}

/// What `answer` says of the host named `name` (by its place), or that there is no such host.
fn one_host(web: &Web, name: &str, answer: impl FnOnce(usize) -> Response) -> Response {
    match web.shared.host_index(name) {
        Some(i) => answer(i),
        None => no_such_host(web, name),
    }
}

fn no_such_host(web: &Web, name: &str) -> Response {
    let names: Vec<&str> = web.shared.hosts.iter().map(|h| h.label.as_str()).collect();
    (
        StatusCode::NOT_FOUND,
        format!(
            "no host {name:?} here; this serve has {}\n",
            names.join(", ")
        ),
    )
        .into_response()
}

/// The API path each host is served under in a listing of these hosts: the top level for a lone host.
fn scoped(web: &Web, hosts: &[usize]) -> Vec<(usize, String)> {
    let alone = web.shared.hosts.len() == 1;
    hosts
        .iter()
        .map(|&i| {
            let path = if alone {
                String::new()
            } else {
                format!("/hosts/{}", web.shared.hosts[i].label)
            };
            (i, path)
        })
        .collect()
}

fn every(web: &Web) -> Vec<usize> {
    (0..web.shared.hosts.len()).collect()
}

/// The Prometheus text format's type (what a reader that does not ask for OpenMetrics gets).
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The metrics in the format the reader asks for: OpenMetrics where its `Accept` names it (Prometheus does),
/// else the Prometheus text format, which every other reader parses (Python's, a plain curl).
fn metrics(web: &Web, hosts: &[usize], headers: &axum::http::HeaderMap) -> Response {
    let text = super::metrics::leave_out(
        super::metrics::render(&web.shared, &scoped(web, hosts)),
        &web.leave_out,
    );
    let open = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    if open {
        ([(header::CONTENT_TYPE, OPENMETRICS)], text).into_response()
    } else {
        (
            [(header::CONTENT_TYPE, PROMETHEUS_TEXT)],
            super::metrics::as_prometheus_text(&text),
        )
            .into_response()
    }
}

async fn all_metrics(State(web): State<Web>, headers: axum::http::HeaderMap) -> Response {
    metrics(&web, &every(&web), &headers)
}

async fn host_metrics(
    State(web): State<Web>,
    Path(name): Path<String>,
    headers: axum::http::HeaderMap,
) -> Response {
    one_host(&web, &name, |i| metrics(&web, &[i], &headers))
}

fn latest(web: &Web, i: usize) -> Option<Arc<Reading>> {
    web.shared.hosts.get(i)?.latest.borrow().clone()
}

/// `{"hosts": [...]}`, as `gpusweep snapshot --json` prints it; each reading serialized once.
fn snapshot(web: &Web, hosts: &[usize]) -> Response {
    let mut body = String::from("{\"hosts\":[");
    let mut first = true;
    for &i in hosts {
        let Some(r) = latest(web, i) else { continue };
        if !first {
            body.push(',');
        }
        first = false;
        body.push_str(&r.json_as(web.shared.http_view));
    }
    body.push_str("]}\n");
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn all_snapshot(State(web): State<Web>) -> Response {
    snapshot(&web, &every(&web))
}

async fn host_snapshot(State(web): State<Web>, Path(name): Path<String>) -> Response {
    one_host(&web, &name, |i| snapshot(&web, &[i]))
}

/// Why a host's reading cannot be trusted now, if it cannot.
fn unhealthy(web: &Web, i: usize) -> Option<String> {
    let ch = web.shared.hosts.get(i)?;
    let status = ch.status.borrow().clone();
    if let ConnStatus::Down(e) = status {
        return Some(format!("{}: {e}", ch.label));
    }
    let Some(r) = latest(web, i) else {
        return Some(format!("{}: no reading yet", ch.label));
    };
    // Three intervals (at least 5 s) without a new reading: the poll loop is stuck.
    let limit = web
        .shared
        .interval
        .saturating_mul(3)
        .max(Duration::from_secs(5));
    let age = now_ms().saturating_sub(r.snap.taken_at_ms);
    if u128::from(age) > limit.as_millis() {
        return Some(format!("{}: last reading {} old", ch.label, fmt_ms(age)));
    }
    if let Some(e) = &r.snap.error {
        return Some(format!("{}: {e}", ch.label));
    }
    // A serve that reads no GPU says nothing about GPUs: an alert must be able to fire on it.
    if web.shared.expect_gpus && !super::metrics::gpus_readable(&r.snap) {
        let why = r
            .snap
            .gpu_error
            .as_deref()
            .unwrap_or("a GPU does not answer");
        return Some(format!("{}: GPUs cannot be read: {why}", ch.label));
    }
    None
}

fn health(web: &Web, hosts: &[usize]) -> Response {
    let bad: Vec<String> = hosts.iter().filter_map(|&i| unhealthy(web, i)).collect();
    // A node condition that could not be written is said, and the serve stays healthy: its readings are.
    let kube = web
        .shared
        .kube
        .get()
        .and_then(|k| k.health_note())
        .map(|n| format!("{n}\n"))
        .unwrap_or_default();
    if bad.is_empty() {
        (StatusCode::OK, format!("ok\n{kube}")).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{}\n", bad.join("\n")),
        )
            .into_response()
    }
}

async fn all_health(State(web): State<Web>) -> Response {
    health(&web, &every(&web))
}

async fn host_health(State(web): State<Web>, Path(name): Path<String>) -> Response {
    // `/healthz` answers without the token: where one guards the rest, it names no host it was not asked
    // about (the list of this serve's hosts is the token's to read).
    match (web.shared.host_index(&name), &web.token) {
        (Some(i), _) => health(&web, &[i]),
        (None, Some(_)) => {
            (StatusCode::NOT_FOUND, format!("no host {name:?} here\n")).into_response()
        }
        (None, None) => no_such_host(&web, &name),
    }
}

#[derive(Debug, serde::Deserialize)]
pub struct EventsQuery {
    /// Poll at least this often while the stream is open (at least 100ms).
    interval: Option<String>,
    /// Only these hosts (names, comma-separated): a client reading several hosts of this serve through one
    /// stream. Names this serve does not have are left out of the hello, which lists those it streams.
    hosts: Option<String>,
    /// `moved`: an `unchanged` carries only the GPUs whose gauges moved (`moved`), not every GPU's.
    gauges: Option<String>,
    /// `moved`: a reading that reads as the last one sent but for its memory is sent as a `memory` event.
    memory: Option<String>,
    /// `moved` (with `memory=moved`): also one whose findings moved only in their figures (a straggler's
    /// bytes), the findings sent with the memory.
    findings: Option<String>,
}

async fn all_events(
    State(web): State<Web>,
    Query(q): Query<EventsQuery>,
    headers: axum::http::HeaderMap,
) -> Response {
    let hosts = match q.hosts.as_deref() {
        None => every(&web),
        Some(names) => {
            let mut picked: Vec<usize> = names
                .split(',')
                .filter_map(|n| web.shared.host_index(n))
                .collect();
            picked.sort_unstable();
            picked.dedup();
            if picked.is_empty() {
                return no_such_host(&web, names.split(',').next().unwrap_or(""));
            }
            picked
        }
    };
    events(web.clone(), &hosts, &q, last_event_id(&headers))
}

async fn host_events(
    State(web): State<Web>,
    Path(name): Path<String>,
    Query(q): Query<EventsQuery>,
    headers: axum::http::HeaderMap,
) -> Response {
    match web.shared.host_index(&name) {
        Some(i) => events(web, &[i], &q, last_event_id(&headers)),
        None => no_such_host(&web, &name),
    }
}

/// The `Last-Event-ID` a reconnecting client sends: (epoch, sequence number). One that is not this serve's
/// form is none (the client is given the stream as new).
fn last_event_id(headers: &axum::http::HeaderMap) -> Option<(u64, u64)> {
    let v = headers.get("last-event-id")?.to_str().ok()?;
    let (epoch, seq) = v.trim().split_once('-')?;
    Some((epoch.parse().ok()?, seq.parse().ok()?))
}

/// Withdraws a stream's interval requests, and gives its place back, when the stream ends (the client
/// went away).
struct Asked {
    shared: Arc<Shared>,
    client: u64,
    hosts: Vec<usize>,
    _place: tokio::sync::OwnedSemaphorePermit,
    /// Names it asked for that this serve does not have (said in its hello).
    unknown: Vec<String>,
    /// Its `unchanged` events carry only the GPUs whose gauges moved.
    only_moved: bool,
    /// It is sent `memory` events.
    memory_alone: bool,
    /// Its `memory` events may carry findings whose figures moved.
    with_findings: bool,
}

impl Drop for Asked {
    fn drop(&mut self) {
        for &host in &self.hosts {
            self.shared.wants.interval(host, self.client, None);
        }
        self.shared.streams_ended.one();
    }
}

/// A query parameter that picks one of two ways: `off` (or left out) or `on`; anything else is refused.
fn choice(name: &str, said: Option<&str>, off: &str, on: &str) -> Result<bool, String> {
    match said {
        None => Ok(false),
        Some(v) if v == off => Ok(false),
        Some(v) if v == on => Ok(true),
        Some(other) => Err(format!(
            "{name}: \"{}\" is neither {off} nor {on}\n",
            crate::core::escape::escape(other)
        )),
    }
}

fn events(web: Web, hosts: &[usize], q: &EventsQuery, resume: Option<(u64, u64)>) -> Response {
    let interval = match q.interval.as_deref().map(parse_duration) {
        None => None,
        Some(Ok(d)) => Some(d.max(MIN_HTTP_INTERVAL)),
        Some(Err(e)) => {
            return (StatusCode::BAD_REQUEST, format!("interval: {e}\n")).into_response();
        }
    };
    let only_moved = match choice("gauges", q.gauges.as_deref(), "all", "moved") {
        Ok(b) => b,
        Err(e) => return (StatusCode::BAD_REQUEST, e).into_response(),
    };
    let memory_alone = match choice("memory", q.memory.as_deref(), "whole", "moved") {
        Ok(b) => b,
        Err(e) => return (StatusCode::BAD_REQUEST, e).into_response(),
    };
    let with_findings = match choice("findings", q.findings.as_deref(), "whole", "moved") {
        Ok(b) => b,
        Err(e) => return (StatusCode::BAD_REQUEST, e).into_response(),
    };
    let Ok(place) = web.streams.clone().try_acquire_owned() else {
        let mut r = (
            StatusCode::SERVICE_UNAVAILABLE,
            "every place for an event stream is taken; try again later\n",
        )
            .into_response();
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("10"));
        return r;
    };
    let client = web.shared.client_id();
    if let Some(d) = interval {
        for &host in hosts {
            web.shared.wants.interval(host, client, Some(d));
        }
    }
    // Names asked for that this serve does not have: said in the hello (at most 64, each cut to 256 bytes:
    // the query is a stranger's input).
    let unknown: Vec<String> = q
        .hosts
        .as_deref()
        .into_iter()
        .flat_map(|n| n.split(','))
        .filter(|n| web.shared.host_index(n).is_none())
        .take(64)
        .map(|n| crate::core::format::truncate_bytes(n, 256))
        .collect();
    let asked = Asked {
        shared: web.shared.clone(),
        client,
        hosts: hosts.to_vec(),
        _place: place,
        unknown,
        only_moved,
        memory_alone,
        with_findings: memory_alone && with_findings,
    };
    let mut r =
        axum::body::Body::from_stream(stream(web.shared, hosts, asked, resume)).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// An idle stream says it is alive this often (an SSE comment), so proxies and clients keep it open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// An event not yet sent, and the sequence number its id will carry (the timeline's position of the stream
/// when it was made; a timeline event's own).
type Queued = (Frame, u64);

fn event(kind: sse::Kind, data: &impl serde::Serialize) -> Frame {
    Frame::of(sse_body(
        kind,
        &serde_json::to_string(data).unwrap_or_default(),
    ))
}

fn hello(shared: &Shared, hosts: &[usize], unknown: &[String]) -> Frame {
    let hello = sse::Hello {
        protocol: PROTOCOL,
        version: env!("CARGO_PKG_VERSION").into(),
        hosts: hosts
            .iter()
            .filter_map(|&i| shared.hosts.get(i).map(|h| h.label.clone()))
            .collect(),
        interval_ms: Some(u64::try_from(shared.interval.as_millis()).unwrap_or(u64::MAX)),
        unknown: unknown.to_vec(),
    };
    event(sse::Kind::Hello, &hello)
}

fn status_event(label: &str, status: &ConnStatus) -> Frame {
    let (status, reason) = match status {
        ConnStatus::Up => (sse::Conn::Up, None),
        ConnStatus::Connecting => (sse::Conn::Connecting, None),
        ConnStatus::Stale { silent_ms } => (
            sse::Conn::Stale,
            Some(format!("no reading for {}", fmt_ms(*silent_ms))),
        ),
        ConnStatus::Down(e) => (sse::Conn::Down, Some(e.clone())),
    };
    let s = sse::Status {
        host: label.to_string(),
        status,
        reason,
    };
    event(sse::Kind::Status, &s)
}

/// What one stream has sent of one host.
struct Follow {
    host: usize,
    content: Option<u64>,
    status: Option<ConnStatus>,
    /// The gauges it last sent: an `unchanged` carries them only when they moved (a thousand idle GPUs'
    /// gauges would otherwise be most of what a fleet's streams carry).
    gauges: Vec<crate::core::model::Gauges>,
    /// Its `unchanged` carries only the GPUs whose gauges moved (`gauges=moved`).
    only_moved: bool,
    /// A reading that reads as the last one it sent but for its memory goes as `memory` (`memory=moved`).
    memory_alone: bool,
    /// And one whose findings moved only in their figures, with them (`findings=moved`).
    with_findings: bool,
}

/// The events of a host's new reading for a stream: the whole snapshot when it says something new to this
/// stream, else only that it is fresh; and its status when that changed.
fn reading_events(shared: &Shared, f: &mut Follow, out: &mut Vec<Frame>) {
    let Some(ch) = shared.hosts.get(f.host) else {
        return;
    };
    let status = ch.status.borrow().clone();
    if f.status.as_ref() != Some(&status) {
        out.push(status_event(&ch.label, &status));
        f.status = Some(status);
    }
    let Some(r) = ch.latest.borrow().clone() else {
        return;
    };
    let gauges = r.snap.gauges();
    if f.content == Some(r.content) {
        let (all, moved) = moved_gauges(f, gauges);
        let u = sse::Unchanged {
            host: ch.label.clone(),
            taken_at_ms: r.snap.taken_at_ms,
            gauges: all,
            moved,
        };
        out.push(event(sse::Kind::Unchanged, &u));
    } else if f.memory_alone
        && f.content.is_some()
        && (f.content == r.memory_from || (f.with_findings && f.content == r.figures_from))
    {
        // Findings whose figures moved go with the memory, as this reader may see them.
        let findings = (f.content != r.memory_from).then(|| {
            super::redact::redact(&r.snap, shared.http_view)
                .map_or_else(|| r.snap.findings.clone(), |s| s.findings)
        });
        f.content = Some(r.content);
        let (all, moved) = moved_gauges(f, gauges);
        let (used, charged) = r.snap.memory_numbers();
        let m = sse::MemoryMoved {
            host: ch.label.clone(),
            taken_at_ms: r.snap.taken_at_ms,
            used,
            charged,
            gauges: all,
            moved,
            findings,
        };
        out.push(event(sse::Kind::Memory, &m));
    } else {
        f.content = Some(r.content);
        f.gauges = gauges;
        out.push(Frame::of(r.sse_as(shared.http_view)));
    }
}

/// An event's `gauges` (every GPU's) and `moved` (by position).
type SentGauges = (
    Option<Vec<crate::core::model::Gauges>>,
    Option<crate::core::model::SaidList>,
);

/// The gauges a reading that is not sent whole carries: none when none moved since the stream last sent
/// them; else every GPU's, or only the GPUs whose moved (by position) where the stream asked.
fn moved_gauges(f: &mut Follow, gauges: Vec<crate::core::model::Gauges>) -> SentGauges {
    if gauges == f.gauges {
        return (None, None);
    }
    let by_gpu = f.only_moved && gauges.len() == f.gauges.len();
    let out = if by_gpu {
        let moved = (0u32..)
            .zip(gauges.iter().zip(&f.gauges))
            .filter(|(_, (now, sent))| now != sent)
            .map(|(i, (now, _))| (i, now.clone()))
            .collect();
        (None, Some(moved))
    } else {
        (Some(gauges.clone()), None)
    };
    f.gauges = gauges;
    out
}

/// The channels of the one host a stream follows.
type OneHost = (
    tokio::sync::watch::Receiver<Option<Arc<Reading>>>,
    tokio::sync::watch::Receiver<ConnStatus>,
);

/// A stream's state between events.
struct StreamState {
    shared: Arc<Shared>,
    follows: Vec<Follow>,
    /// One host: its own channels, so readings of other hosts never wake this stream.
    single: Option<OneHost>,
    readings: broadcast::Receiver<usize>,
    events: broadcast::Receiver<Arc<Logged>>,
    queue: std::collections::VecDeque<Queued>,
    /// The parts of the event being sent.
    out: std::collections::VecDeque<Bytes>,
    /// The last timeline event this stream has given (or that was there when it began): what its ids say.
    pos: u64,
    epoch: u64,
    asked: Asked,
}

impl StreamState {
    fn wants(&self, host: usize) -> bool {
        self.place(host).is_some()
    }

    /// Where host `host` is among those the stream follows (kept in order of host).
    fn place(&self, host: usize) -> Option<usize> {
        self.follows.binary_search_by_key(&host, |f| f.host).ok()
    }

    /// Events made now, at the stream's position.
    fn extend(&mut self, out: Vec<Frame>) {
        let pos = self.pos;
        self.queue.extend(out.into_iter().map(|e| (e, pos)));
    }

    /// A timeline event, unless the stream gave it already (from the journal).
    fn timeline(&mut self, l: &Logged) {
        if l.seq > self.pos && self.wants(l.host) {
            self.pos = l.seq;
            let e = Frame::of(l.sse.clone());
            self.queue.push_back((e, l.seq));
        }
    }

    /// What the stream missed after `after` (in `epoch`), from the journal: the events, or a gap and what
    /// is kept. Its position is then the journal's last event.
    fn catch_up(&mut self, epoch: u64, after: u64) {
        let Ok(journal) = self.shared.journal.lock() else {
            return;
        };
        let hosts: Vec<usize> = self.follows.iter().map(|f| f.host).collect();
        let missed = journal.since(epoch, after, |h| hosts.contains(&h));
        let last = journal.last();
        // From another serve's epoch, every event kept is new to the stream.
        let from = if epoch == journal.epoch && after <= last {
            after
        } else {
            0
        };
        drop(journal);
        let kept = match missed {
            Missed::Replay(kept) => kept,
            Missed::Gap { why, kept } => {
                let gap = event(sse::Kind::Gap, &sse::Gap { reason: why });
                self.queue.push_back((gap, from));
                kept
            }
        };
        self.pos = from;
        for l in &kept {
            self.timeline(l);
        }
        self.pos = self.pos.max(last);
    }
}

/// A new stream's state: subscribed, its hello, what it missed (in order), then what is there now.
fn begin(
    shared: Arc<Shared>,
    hosts: &[usize],
    asked: Asked,
    resume: Option<(u64, u64)>,
) -> StreamState {
    // Receivers that have seen what is there now: the first events below say it.
    let single = match hosts {
        [i] => shared.hosts.get(*i).map(|h| {
            let (mut latest, mut status) = (h.latest.clone(), h.status.clone());
            latest.borrow_and_update();
            status.borrow_and_update();
            (latest, status)
        }),
        _ => None,
    };
    let events = match hosts {
        [i] if shared.hosts.get(*i).is_some() => shared.hosts[*i].events.subscribe(),
        _ => shared.all_events.subscribe(),
    };
    let follows: Vec<Follow> = hosts
        .iter()
        .map(|&host| Follow {
            host,
            content: None,
            status: None,
            gauges: Vec::new(),
            only_moved: asked.only_moved,
            memory_alone: asked.memory_alone,
            with_findings: asked.with_findings,
        })
        .collect();
    debug_assert!(
        follows.is_sorted_by_key(|f| f.host),
        "followed in order of host"
    );
    // Subscribed above before the journal is read: an event in both is given once.
    let (epoch, last) = shared
        .journal
        .lock()
        .map(|j| (j.epoch, j.last()))
        .unwrap_or_default();
    let mut st = StreamState {
        readings: shared.readings.subscribe(),
        shared,
        follows: Vec::new(),
        single,
        events,
        queue: std::collections::VecDeque::new(),
        out: std::collections::VecDeque::new(),
        pos: last,
        epoch,
        asked,
    };
    let mut hello = hello(&st.shared, hosts, &st.asked.unknown);
    hello.retry_ms = Some(sse::RETRY_MS);
    // A resumed stream's hello carries the place it resumes from, not the newest: a client that drops right
    // after it resumes from there again, and misses none of the replay that follows.
    let at = match resume {
        Some((e, after)) if e == epoch && after <= last => after,
        Some(_) => 0,
        None => last,
    };
    st.queue.push_back((hello, at));
    st.follows = follows;
    // Hello, what was missed (in order), then what is there now.
    if let Some((epoch, after)) = resume {
        st.catch_up(epoch, after);
    }
    let mut first = Vec::new();
    for f in &mut st.follows {
        reading_events(&st.shared, f, &mut first);
    }
    st.extend(first);
    st
}

fn stream(
    shared: Arc<Shared>,
    hosts: &[usize],
    asked: Asked,
    resume: Option<(u64, u64)>,
) -> impl Stream<Item = Result<Bytes, Infallible>> + use<> {
    let st = begin(shared, hosts, asked, resume);
    futures::stream::unfold(st, |mut st| async move {
        loop {
            // Everything queued goes out in one piece (up to a bound): one write, one wake-up of the
            // client, for a batch of small events; a large shared snapshot goes as it is.
            while let Some((e, seq)) = st.queue.pop_front() {
                let id = format!("{}-{seq}", st.epoch);
                st.out.extend(e.chunks(&id));
            }
            if let Some(b) = joined(&mut st.out) {
                return Some((Ok(b), st));
            }
            let mut out = Vec::new();
            match &mut st.single {
                Some((latest, status)) => {
                    tokio::select! {
                        r = latest.changed() => {
                            r.ok()?;
                            reading_events(&st.shared, &mut st.follows[0], &mut out);
                        }
                        r = status.changed() => {
                            r.ok()?;
                            reading_events(&st.shared, &mut st.follows[0], &mut out);
                        }
                        e = st.events.recv() => on_timeline(&mut st, e)?,
                        () = tokio::time::sleep(KEEP_ALIVE) => st.out.push_back(Bytes::from_static(b":\n\n")),
                    }
                }
                None => {
                    tokio::select! {
                        r = st.readings.recv() => match r {
                            Ok(i) => {
                                if let Some(at) = st.place(i) {
                                    reading_events(&st.shared, &mut st.follows[at], &mut out);
                                }
                                // The readings of the next moments go out with it, in one write: a client
                                // of ten thousand hosts is woken a few times a second, not for every host.
                                gather(&mut st, &mut out).await?;
                            }
                            // Fell behind: bring every host up to date at once.
                            Err(broadcast::error::RecvError::Lagged(_)) => {
                                for f in &mut st.follows {
                                    reading_events(&st.shared, f, &mut out);
                                }
                            }
                            Err(broadcast::error::RecvError::Closed) => return None,
                        },
                        e = st.events.recv() => on_timeline(&mut st, e)?,
                        () = tokio::time::sleep(KEEP_ALIVE) => st.out.push_back(Bytes::from_static(b":\n\n")),
                    }
                }
            }
            st.extend(out);
        }
    })
}

/// Past this size a write goes out as it is rather than joined with the next.
const JOIN_UP_TO: usize = 64 * 1024;

/// The next part to send: the small parts at the front joined into one, or a large one alone.
fn joined(out: &mut std::collections::VecDeque<Bytes>) -> Option<Bytes> {
    let first = out.pop_front()?;
    if first.len() >= JOIN_UP_TO || out.front().is_none_or(|b| b.len() >= JOIN_UP_TO) {
        return Some(first);
    }
    let mut one = Vec::with_capacity(JOIN_UP_TO.min(first.len() * 2));
    one.extend_from_slice(&first);
    while let Some(b) = out.front() {
        if b.len() >= JOIN_UP_TO || one.len() + b.len() > JOIN_UP_TO {
            break;
        }
        one.extend_from_slice(b);
        out.pop_front();
    }
    Some(Bytes::from(one))
}

/// How long a stream of several hosts gathers readings before it sends them.
const GATHER: Duration = Duration::from_millis(25);

/// The readings of several hosts that come within `GATHER` of one another, as events; `None` once the serve
/// is going away.
async fn gather(st: &mut StreamState, out: &mut Vec<Frame>) -> Option<()> {
    let until = tokio::time::Instant::now() + GATHER;
    loop {
        tokio::select! {
            r = st.readings.recv() => match r {
                Ok(i) => {
                    if let Some(at) = st.place(i) {
                        reading_events(&st.shared, &mut st.follows[at], out);
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    for f in &mut st.follows {
                        reading_events(&st.shared, f, out);
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            },
            () = tokio::time::sleep_until(until) => return Some(()),
        }
    }
}

/// A timeline event for the stream; `None` once the serve is going away. A stream that fell behind the
/// broadcast catches up from the journal.
fn on_timeline(
    st: &mut StreamState,
    e: Result<Arc<Logged>, broadcast::error::RecvError>,
) -> Option<()> {
    match e {
        Ok(l) => st.timeline(&l),
        Err(broadcast::error::RecvError::Lagged(_)) => st.catch_up(st.epoch, st.pos),
        Err(broadcast::error::RecvError::Closed) => return None,
    }
    Some(())
}
