//! The one client of a `gpusweep serve`'s event stream. The hosts named of one serve
//! (`http://node:9401/hosts/NAME`) are read through one stream, `/api/v1/events?hosts=...`, instead of a
//! stream each: ten thousand hosts of a serve cost one connection, one parser and one task, not ten
//! thousand (whose connections the serve's stream budget refused). A serve named by its address alone
//! (`http://node:9401`) is a group of one: its one host, whatever its name. Each event names its host; each
//! host keeps its own silence, so one host the serve stops reading is called stale and down alone while the
//! others stay up, and the stream is given up only when the whole serve falls silent. What the serve sends
//! is untrusted (bounded and escaped, as `http`'s parser does).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::http::{
    HttpClient, READ_ONLY, SseEvent, SseParser, describe, hello, preview, read_snapshot,
    silence_limits,
};
use super::{FIRST_BACKOFF, MAX_BACKOFF};
use crate::{ConnStatus, HostCmd, Refuse, Sink};
use gpusweep_core::format::{escape, millis};
use gpusweep_core::model::{Gauges, SaidGauges};
use gpusweep_core::sse;

/// A command for one host of the group: its place, and the command.
pub type GroupCmd = (usize, HostCmd);

/// One host of the group: its name at the serve (none: the one host a serve named by its address serves,
/// alone in its group), and where its readings go.
pub struct GroupHost {
    pub name: Option<String>,
    pub sink: Arc<dyn Sink>,
}

/// Past this length the stream asks for every host of the serve and keeps its own: a URL of thousands of
/// names is not worth sending (a serve of fewer hosts than asked for sends little more).
const MAX_NAMES_QUERY: usize = 4096;

/// What one host of the stream has said.
struct Member {
    last: Instant,
    stale: bool,
    up: bool,
    /// Not among the hosts the serve's hello lists: said down once, never judged for silence.
    absent: bool,
}

/// The group's reader.
struct Group {
    /// Where the serve's API is: `scheme://host:port` for named hosts, the whole address for a serve named by
    /// its address.
    base: String,
    http: HttpClient,
    connect_timeout: Duration,
    hosts: Vec<GroupHost>,
    by_name: HashMap<String, usize>,
    /// Whether each host is the one its name finds (the first of a name given twice).
    named_first: Vec<bool>,
    /// Where the next event's host most likely is: after the last one's.
    next_place: usize,
    /// Each host's interval as last asked; the stream reads at the fastest.
    asked: Vec<Duration>,
    /// The last event's id: where the next connection resumes.
    resume: Option<String>,
}

/// What ended one stream.
enum Ended {
    /// The interval changed or a silent serve was asked again: connect again at once.
    Again,
    Failed(String),
    Stopped,
}

/// Read the group until the fleet goes away: connect, stream, and on a failure say it for every host and
/// connect again with backoff.
pub async fn run(
    base: String,
    http: HttpClient,
    hosts: Vec<GroupHost>,
    interval: Duration,
    connect_timeout: Duration,
    mut cmds: mpsc::Receiver<GroupCmd>,
) {
    let mut g = Group::new(base, http, hosts, interval, connect_timeout);
    let mut backoff = FIRST_BACKOFF;
    loop {
        if !g.say_all(&ConnStatus::Connecting) {
            return;
        }
        let why = match g.stream(&mut cmds).await {
            Ended::Stopped => return,
            Ended::Again => continue,
            Ended::Failed(why) => why,
        };
        if !g.say_all(&ConnStatus::Down(why)) || !g.back_off(backoff, &mut cmds).await {
            return;
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

impl Group {
    fn new(
        base: String,
        http: HttpClient,
        hosts: Vec<GroupHost>,
        interval: Duration,
        connect_timeout: Duration,
    ) -> Group {
        let by_name: HashMap<String, usize> = hosts
            .iter()
            .enumerate()
            .rev()
            .filter_map(|(i, h)| Some((h.name.clone()?, i)))
            .collect();
        let named_first = hosts
            .iter()
            .enumerate()
            .map(|(i, h)| h.name.as_ref().and_then(|n| by_name.get(n)) == Some(&i))
            .collect();
        Group {
            base,
            http,
            connect_timeout,
            asked: vec![interval; hosts.len()],
            hosts,
            by_name,
            named_first,
            next_place: 0,
            resume: None,
        }
    }

    fn interval(&self) -> Duration {
        self.asked
            .iter()
            .copied()
            .min()
            .unwrap_or(Duration::from_secs(1))
    }

    /// Tell every host; false once nobody listens.
    fn say_all(&self, status: &ConnStatus) -> bool {
        let mut listening = false;
        for h in &self.hosts {
            listening |= h.sink.status(status.clone());
        }
        listening
    }

    /// Wait before reconnecting, answering commands: an action is refused at once, `r` reconnects now.
    async fn back_off(&mut self, backoff: Duration, cmds: &mut mpsc::Receiver<GroupCmd>) -> bool {
        super::wait_answering(backoff, cmds, |(at, c)| match c {
            HostCmd::PollNow | HostCmd::Wake => true,
            HostCmd::Interval(d) => {
                if let Some(a) = self.asked.get_mut(at) {
                    *a = d;
                }
                false
            }
            c @ HostCmd::Act { .. } => {
                if let Some(h) = self.hosts.get(at) {
                    c.refuse(h.sink.as_ref(), "host is down");
                }
                false
            }
        })
        .await
    }

    /// The stream's query: only these hosts, where their names fit in a URL (and none for a serve named by
    /// its address).
    fn names_query(&self) -> Option<String> {
        let mut q = String::new();
        for h in &self.hosts {
            if !q.is_empty() {
                q.push(',');
            }
            q.push_str(h.name.as_deref()?);
            if q.len() > MAX_NAMES_QUERY {
                return None;
            }
        }
        Some(q)
    }

    /// One stream: connect, hello, readings, commands and silences, until it ends.
    async fn stream(&mut self, cmds: &mut mpsc::Receiver<GroupCmd>) -> Ended {
        let interval = self.interval();
        let url = format!("{}/api/v1/events", self.base);
        let names = self.names_query();
        // Only the GPUs whose gauges moved: most of a fleet's GPUs idle, most of a busy one's do not move
        // (an older serve ignores the ask and sends them all).
        let mut query: Vec<(&str, &str)> = names.iter().map(|n| ("hosts", n.as_str())).collect();
        query.push(("gauges", "moved"));
        // And a warming host's reading as its memory alone, put onto the reading before it here; with its
        // findings where only their figures moved (a straggler's bytes: an older serve ignores the ask and
        // sends such readings whole).
        query.push(("memory", "moved"));
        query.push(("findings", "moved"));
        let opened = super::http::open_events(
            &self.http,
            &url,
            &query,
            self.connect_timeout,
            interval,
            self.resume.as_deref(),
        )
        .await;
        let mut resp = match opened {
            Ok(r) => r,
            Err(e) => return Ended::Failed(e),
        };
        let now = Instant::now();
        let mut st = Stream {
            members: (0..self.hosts.len())
                .map(|_| Member {
                    last: now,
                    stale: false,
                    up: false,
                    absent: false,
                })
                .collect(),
            said_hello: false,
            serve_interval: None,
            heard_at: now,
            counts_from: now,
        };
        let mut parser = SseParser::default();
        let mut sweep_at = now + interval.min(Duration::from_secs(1));
        loop {
            let step = tokio::select! {
                // What the serve sent comes before any judgement of its silence.
                biased;
                chunk = resp.chunk() => {
                    let bytes = match chunk {
                        Ok(Some(b)) => b,
                        Ok(None) => return Ended::Failed("the serve closed the stream".into()),
                        Err(e) => return Ended::Failed(describe(&e)),
                    };
                    st.heard_at = Instant::now();
                    let mut step = Step::Go;
                    let fed = parser.feed_each(&bytes, &mut |ev| {
                        step = self.on_event(&mut st, ev);
                        matches!(step, Step::Go)
                    });
                    if let Err(e) = fed {
                        return Ended::Failed(format!("from the serve: {e}"));
                    }
                    step
                }
                c = cmds.recv() => self.on_cmd(&st, c),
                () = tokio::time::sleep_until(sweep_at) => {
                    let now = Instant::now();
                    if !super::silence_is_the_hosts(sweep_at, now) {
                        // This client was not running: what the serve said meanwhile waits in the socket.
                        // Silence counts again from now, once it can be read.
                        st.counts_from = now;
                    }
                    sweep_at = now + self.interval().min(Duration::from_secs(1));
                    self.sweep(&mut st, now)
                }
            };
            match step {
                Step::Go => {}
                Step::End(e) => return e,
            }
        }
    }

    /// When a host is stale, and when it is down, at the pace the serve reads.
    fn limits(&self, st: &Stream) -> (Duration, Duration) {
        silence_limits(self.interval(), st.serve_interval, self.connect_timeout)
    }

    /// Judge each host's silence (only its own: the stream may be busy with others), and the whole
    /// serve's: silent past the limit, the stream is given up and opened again.
    fn sweep(&self, st: &mut Stream, now: Instant) -> Step {
        let (stale_after, give_up) = self.limits(st);
        let silent_for = |last: Instant| now.saturating_duration_since(last.max(st.counts_from));
        if silent_for(st.heard_at) > give_up {
            return Step::End(Ended::Failed(format!(
                "no reading from the serve for {}s: reconnecting",
                silent_for(st.heard_at).as_secs()
            )));
        }
        if !st.said_hello {
            return Step::Go;
        }
        let mut listening = false;
        for (m, h) in st.members.iter_mut().zip(&self.hosts) {
            if m.absent {
                continue;
            }
            let silent = silent_for(m.last);
            if m.up && !m.stale && silent > stale_after {
                m.stale = true;
                let st = ConnStatus::Stale {
                    silent_ms: millis(silent),
                };
                listening |= h.sink.status(st);
            } else if (m.up || m.stale) && silent > give_up {
                (m.up, m.stale) = (false, false);
                listening |= h.sink.status(ConnStatus::Down(format!(
                    "the serve sent no reading of it for {}s",
                    silent.as_secs()
                )));
            } else {
                listening = true;
            }
        }
        if listening {
            Step::Go
        } else {
            Step::End(Ended::Stopped)
        }
    }

    fn on_hello(&mut self, st: &mut Stream, data: &str) -> Result<bool, String> {
        let h = hello(data)?;
        if let [GroupHost { name: None, .. }] = self.hosts.as_slice() {
            self.by_name = self.one_host(&h.hosts)?;
        }
        st.serve_interval = h.interval_ms.map(|ms| Duration::from_millis(ms.max(1)));
        st.said_hello = true;
        let streamed: std::collections::HashSet<&str> =
            h.hosts.iter().map(String::as_str).collect();
        let mut listening = false;
        for (m, host) in st.members.iter_mut().zip(&self.hosts) {
            let Some(name) = &host.name else {
                listening = true;
                continue;
            };
            if streamed.contains(name.as_str()) {
                listening = true;
                continue;
            }
            m.absent = true;
            listening |= host.sink.status(ConnStatus::Down(format!(
                "the serve at {} has no host {:?}",
                self.base,
                escape(name)
            )));
        }
        Ok(listening)
    }

    /// A serve named by its address must serve one host: its name, as the events will carry it.
    fn one_host(&self, served: &[String]) -> Result<HashMap<String, usize>, String> {
        if let [one] = served {
            return Ok(HashMap::from([(one.clone(), 0)]));
        }
        let names: Vec<String> = served
            .iter()
            .take(5)
            .map(|n| escape(n).into_owned())
            .collect();
        let base = &self.base;
        Err(format!(
            "{base} serves {} hosts ({}): name one, e.g. {base}/hosts/{}",
            served.len(),
            names.join(", "),
            names.first().map_or("NAME", String::as_str)
        ))
    }

    /// The place of the host an event names. A serve sends each round of readings in its hosts' order,
    /// most often the order they were named in here: the host after the last event's is asked first, and
    /// the map only when it is not the one (looking up each of ten thousand names a second in a map of
    /// them was a twentieth of a fleet client's time, its cache misses rather than its hashing).
    fn place_of(&mut self, name: &str) -> Option<usize> {
        let next = self.next_place;
        let at = if self.named_first.get(next) == Some(&true)
            && self.hosts.get(next).and_then(|h| h.name.as_deref()) == Some(name)
        {
            next
        } else {
            *self.by_name.get(name)?
        };
        self.next_place = at + 1;
        Some(at)
    }

    /// One event: a reading goes to its host's sink as it is (whether it says anything new is the
    /// runtime's to decide); events of hosts not in the group are let go.
    fn on_event(&mut self, st: &mut Stream, ev: &SseEvent) -> Step {
        if let Some(id) = &ev.id {
            id.clone_into(self.resume.get_or_insert_default());
        }
        let kind = sse::Kind::parse(&ev.event);
        if kind == Some(sse::Kind::Hello) {
            return match self.on_hello(st, &ev.data) {
                Ok(true) => Step::Go,
                Ok(false) => Step::End(Ended::Stopped),
                Err(e) => Step::End(Ended::Failed(e)),
            };
        }
        if !st.said_hello {
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
                let Some(at) = self.place_of(&snap.host) else {
                    return Step::Go;
                };
                st.heard(at, &self.hosts[at]) && self.hosts[at].sink.reading(snap)
            }
            Some(sse::Kind::Unchanged) => {
                let Ok(u) = serde_json::from_str::<UnchangedRef>(&ev.data) else {
                    return Step::End(Ended::Failed(format!(
                        "garbage from the serve: {:?}",
                        preview(&ev.data)
                    )));
                };
                let Some(at) = self.place_of(&u.host) else {
                    return Step::Go;
                };
                // As said (only the GPUs that moved, by position): each holder puts them onto its own.
                let gauges = SaidGauges::from_wire(u.gauges, u.moved);
                st.heard(at, &self.hosts[at]) && self.hosts[at].sink.fresh(u.taken_at_ms, gauges)
            }
            Some(sse::Kind::Memory) => return self.on_memory(st, &ev.data),
            Some(sse::Kind::Status) => match serde_json::from_str::<sse::Status>(&ev.data) {
                Ok(s) if s.status == sse::Conn::Down => match self.place_of(&s.host) {
                    Some(at) => {
                        st.members[at].up = false;
                        st.members[at].stale = false;
                        let why = escape(s.reason.as_deref().unwrap_or("down")).into_owned();
                        self.hosts[at]
                            .sink
                            .status(ConnStatus::Down(format!("at the serve: {why}")))
                    }
                    None => true,
                },
                _ => true,
            },
            // The timeline's events: each host's ledger makes its own from the snapshots.
            Some(sse::Kind::Event | sse::Kind::Hello | sse::Kind::Gap) | None => true,
        };
        if sent {
            Step::Go
        } else {
            Step::End(Ended::Stopped)
        }
    }

    /// A `memory` event: the host's last reading with these numbers put in.
    fn on_memory(&mut self, st: &mut Stream, data: &str) -> Step {
        let Ok(m) = serde_json::from_str::<MemoryRef>(data) else {
            return Step::End(Ended::Failed(format!(
                "garbage from the serve: {:?}",
                preview(data)
            )));
        };
        let Some(at) = self.place_of(&m.host) else {
            return Step::Go;
        };
        let moved = sse::MemoryMoved {
            host: m.host.into_owned(),
            taken_at_ms: m.taken_at_ms,
            used: m.used,
            charged: m.charged,
            gauges: m.gauges,
            moved: m.moved,
            findings: m.findings,
        };
        if !st.heard(at, &self.hosts[at]) {
            return Step::End(Ended::Stopped);
        }
        match self.hosts[at].sink.memory(moved) {
            Some(true) => Step::Go,
            Some(false) => Step::End(Ended::Stopped),
            // Not the reading it moves from: a new stream begins with whole readings.
            None => Step::End(Ended::Failed(
                "the serve sent memory for a reading this client does not have".into(),
            )),
        }
    }

    fn on_cmd(&mut self, st: &Stream, c: Option<GroupCmd>) -> Step {
        let Some((at, cmd)) = c else {
            return Step::End(Ended::Stopped);
        };
        match cmd {
            HostCmd::Interval(d) => {
                let before = self.interval();
                if let Some(a) = self.asked.get_mut(at) {
                    *a = d;
                }
                if self.interval() == before {
                    Step::Go
                } else {
                    Step::End(Ended::Again)
                }
            }
            // The serve reads at its own pace; a serve gone quiet is asked again by reconnecting.
            HostCmd::PollNow | HostCmd::Wake if st.members.iter().all(|m| m.stale || !m.up) => {
                Step::End(Ended::Again)
            }
            HostCmd::PollNow | HostCmd::Wake => Step::Go,
            c @ HostCmd::Act { .. } => {
                if let Some(h) = self.hosts.get(at) {
                    c.refuse(h.sink.as_ref(), READ_ONLY);
                }
                Step::Go
            }
        }
    }
}

/// `sse::Unchanged` read in place: its host's name borrowed from the event (one in every event of a
/// ten-thousand-host stream).
#[derive(serde::Deserialize)]
struct UnchangedRef<'a> {
    #[serde(borrow)]
    host: std::borrow::Cow<'a, str>,
    taken_at_ms: u64,
    #[serde(default)]
    gauges: Option<Vec<Gauges>>,
    #[serde(default)]
    moved: Option<gpusweep_core::model::SaidList>,
}

/// `sse::MemoryMoved` read with its host's name borrowed.
#[derive(serde::Deserialize)]
struct MemoryRef<'a> {
    #[serde(borrow)]
    host: std::borrow::Cow<'a, str>,
    taken_at_ms: u64,
    used: Vec<Option<u64>>,
    charged: Vec<Vec<Option<u64>>>,
    #[serde(default)]
    gauges: Option<Vec<Gauges>>,
    #[serde(default)]
    moved: Option<gpusweep_core::model::SaidList>,
    #[serde(default)]
    findings: Option<Vec<gpusweep_core::model::Finding>>,
}

/// What one event, chunk or command amounts to.
enum Step {
    Go,
    End(Ended),
}

/// One stream's state.
struct Stream {
    members: Vec<Member>,
    said_hello: bool,
    /// The serve's own interval, once its hello says it.
    serve_interval: Option<Duration>,
    /// When the stream last carried anything (a keep-alive included).
    heard_at: Instant,
    /// Silences count from here at the earliest: the last time this client was found not running.
    counts_from: Instant,
}

impl Stream {
    /// A reading of host `at` came: it is up (said once) and fresh. False once nobody listens. Heard when the
    /// piece of the stream it came in was: one clock read a piece, not one an event (ten thousand a second).
    fn heard(&mut self, at: usize, host: &GroupHost) -> bool {
        let m = &mut self.members[at];
        m.last = self.heard_at;
        let was = m.stale || !m.up;
        (m.stale, m.up) = (false, true);
        !was || host.sink.status(ConnStatus::Up)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Deaf;

    /// An event's host is the one after the last event's where the names say so, else found by name; a
    /// name given twice is always its first place, and a name the group lacks is none.
    #[test]
    fn an_events_host_is_found_in_order_or_by_name_and_a_twice_given_name_is_its_first() {
        let http = crate::remote::http::HttpOptions::default()
            .client(Duration::from_secs(1))
            .expect("client");
        let hosts = ["a", "b", "a", "c"]
            .iter()
            .map(|n| GroupHost {
                name: Some((*n).to_string()),
                sink: Arc::new(Deaf),
            })
            .collect();
        let mut g = Group::new(
            "http://x".into(),
            http,
            hosts,
            Duration::from_secs(1),
            Duration::from_secs(1),
        );
        let places: Vec<Option<usize>> = ["a", "b", "a", "c", "b", "x", "c", "a"]
            .iter()
            .map(|n| g.place_of(n))
            .collect();
        assert_eq!(
            places,
            [
                Some(0),
                Some(1),
                Some(0),
                Some(3),
                Some(1),
                None,
                Some(3),
                Some(0)
            ]
        );
    }
}
