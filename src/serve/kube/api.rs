//! The node writer's requests (the `kube` feature): follows the host's readings through the hub, decides
//! through `hold` and writes through `kube`. Writes only its own Node, only its own keys; one request set per
//! transition; a failed write is retried with backoff until it lands, and the transitions it missed meanwhile
//! are each still told as an Event. The serve never waits on it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Client, Config};
use serde_json::Value;
use tokio::sync::watch;

use super::KubeStatus;
use super::body;
use super::hold::{Desired, Held, Hold};
use crate::analyze::node::{Gate, NodeVerdict, node_verdict};
use crate::core::model::now_ms;
use crate::serve::hub::HostChannel;
use crate::source::ConnStatus;

/// Transitions kept for Events while the API cannot be reached (the oldest go first past this).
const PENDING_MAX: usize = 64;

/// Attempts at one guarded taint patch before the round fails (and is retried later as a whole).
const CONFLICT_TRIES: u32 = 6;

/// How long one round of writes may take. A hung API server (one that accepts and never answers) would
/// otherwise hold the writer for the client's read timeout (295 s, sized for watches) with `/healthz` saying
/// nothing; past this the round is said failed and retried.
const ROUND_TIMEOUT: Duration = Duration::from_secs(10);

/// What the writer follows and how.
pub struct Writer {
    pub node: String,
    pub hold: Duration,
    pub load_nvml: bool,
    pub status: Arc<KubeStatus>,
}

/// Whether the cluster serves DRA device taints (resource.k8s.io/v1 ResourceSlices and DeviceTaintRules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dra {
    Unknown,
    Served,
    NotServed,
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "resource.k8s.io".into(),
        version: "v1".into(),
        api_version: "resource.k8s.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Why a round of writes did not land.
#[derive(Debug)]
struct Failed {
    why: String,
    /// The API's HTTP status, where it answered.
    status: Option<u16>,
}

impl Failed {
    fn because(why: impl Into<String>) -> Failed {
        Failed {
            why: why.into(),
            status: None,
        }
    }
}

impl From<kube::Error> for Failed {
    fn from(e: kube::Error) -> Failed {
        match e {
            kube::Error::Api(s) => Failed {
                why: format!("{} {}: {}", s.code, s.reason, s.message),
                status: Some(s.code),
            },
            // Every cause, not the first alone ("client error (Connect)" says nothing of a timeout).
            other => {
                let mut why = other.to_string();
                let mut cause = std::error::Error::source(&other);
                while let Some(c) = cause {
                    let said = c.to_string();
                    if !why.contains(&said) {
                        why = format!("{why}: {said}");
                    }
                    cause = c.source();
                }
                Failed::because(why)
            }
        }
    }
}

impl Writer {
    /// Until the serve stops: readings in, writes out.
    pub async fn run(self, host: &HostChannel) {
        let mut latest = host.latest.clone();
        let mut conn = host.status.clone();
        let mut hold = Hold::new(u64::try_from(self.hold.as_millis()).unwrap_or(u64::MAX));
        let mut verdict: Option<NodeVerdict> = None;
        let mut pending: VecDeque<Desired> = VecDeque::new();
        let mut client: Option<Client> = None;
        let mut written: Option<Desired> = None;
        let mut retry_at: Option<tokio::time::Instant> = None;
        let mut backoff = Duration::from_millis(250);
        let mut dra = Dra::Unknown;
        loop {
            let due = hold.due_ms().map(|ms| {
                tokio::time::Instant::now() + Duration::from_millis(ms.saturating_sub(now_ms()))
            });
            tokio::select! {
                changed = async { tokio::select! { r = latest.changed() => r, r = conn.changed() => r } } => {
                    if changed.is_err() {
                        return;
                    }
                    verdict = self.read(&latest, &conn);
                    if let Some(v) = &verdict && let Some(d) = hold.observe(v, now_ms()) {
                        push(&mut pending, d.clone());
                    }
                }
                () = sleep_until(due) => {
                    if let Some(v) = &verdict && let Some(d) = hold.tick(v, now_ms()) {
                        push(&mut pending, d.clone());
                    }
                }
                () = sleep_until(retry_at) => { retry_at = None; }
            }
            self.status.set_pending(pending.len());
            let Some(want) = hold.shown().cloned() else {
                continue;
            };
            if retry_at.is_some() || written.as_ref() == Some(&want) {
                continue;
            }
            let uuids = uuids_of(&latest, &want.gpus);
            let round = tokio::time::timeout(
                ROUND_TIMEOUT,
                self.write(&mut client, &want, &uuids, &mut dra, &mut pending),
            )
            .await
            .unwrap_or_else(|_| {
                Err(Failed::because(format!(
                    "the API server did not answer within {}",
                    humantime::format_duration(ROUND_TIMEOUT)
                )))
            });
            match round {
                Ok(()) => {
                    self.status.set_pending(0);
                    written = Some(want);
                    backoff = Duration::from_millis(250);
                }
                Err(Failed { why, status }) => {
                    // A refused credential (a rotated token, a replaced pod's): the next round builds the
                    // client again, reading the token file afresh.
                    if status == Some(401) {
                        client = None;
                    }
                    eprintln!(
                        "gpusweep serve: kube: node {}: {} (retrying in {})",
                        crate::core::format::escape(&self.node),
                        crate::core::format::escape(&why),
                        humantime::format_duration(backoff)
                    );
                    self.status.failed(now_ms(), &why);
                    retry_at = Some(tokio::time::Instant::now() + backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
    }

    /// The verdict on the latest reading; a host without a fresh reading is unread.
    fn read(
        &self,
        latest: &watch::Receiver<Option<Arc<crate::serve::hub::Reading>>>,
        conn: &watch::Receiver<ConnStatus>,
    ) -> Option<NodeVerdict> {
        let stale = match &*conn.borrow() {
            ConnStatus::Up | ConnStatus::Connecting => None,
            ConnStatus::Stale { silent_ms } => Some(format!(
                "no reading for {}",
                crate::core::format::fmt_ms(*silent_ms)
            )),
            ConnStatus::Down(why) => Some(why.clone()),
        };
        let reading = latest.borrow().clone();
        match (stale, reading) {
            (Some(why), r) => Some(NodeVerdict {
                gate: Gate::Unknown,
                line: format!(
                    "unknown: {}: {}",
                    crate::core::format::escape(&self.node),
                    crate::core::format::escape(&why)
                ),
                unfit: r
                    .map(|r| r.snap.gpus.iter().map(|g| g.index).collect())
                    .unwrap_or_default(),
            }),
            (None, Some(r)) => Some(node_verdict(&r.snap, self.load_nvml)),
            (None, None) => None,
        }
    }

    /// One round: the condition, the taint, then an Event per transition not yet told.
    async fn write(
        &self,
        client: &mut Option<Client>,
        want: &Desired,
        uuids: &[String],
        dra: &mut Dra,
        pending: &mut VecDeque<Desired>,
    ) -> Result<(), Failed> {
        let c = if let Some(c) = client.as_ref() {
            c.clone()
        } else {
            let mut config = Config::infer()
                .await
                .map_err(|e| Failed::because(format!("no Kubernetes API configuration: {e}")))?;
            // Every request answers within a round's time or fails (it never watches).
            config.connect_timeout = Some(ROUND_TIMEOUT);
            config.read_timeout = Some(ROUND_TIMEOUT);
            config.write_timeout = Some(ROUND_TIMEOUT);
            let made = Client::try_from(config).map_err(|e| Failed::because(e.to_string()))?;
            client.insert(made).clone()
        };
        let nodes: Api<Node> = Api::all(c.clone());
        // The taints first: they are what keep pods off, and they never wait on the condition (which another
        // manager may own: the apply is never forced, so that is a conflict said and retried, not taken over).
        // Where DRA allocates every held GPU, its devices are tainted one by one and the node's other GPUs stay
        // schedulable; else (DRA not served, a GPU no driver publishes, a host unread) the node is.
        // A device rule that failed leaves the node tainted, then is said.
        let by_device = self.device_taints(&c, want, uuids, dra).await;
        let uid = self
            .taint(
                &nodes,
                want.held.tainted() && !matches!(by_device, Ok(true)),
            )
            .await?;
        by_device?;
        let apply = body::condition_apply(&self.node, want, now_ms());
        let condition = nodes
            .patch_status(
                &self.node,
                &PatchParams::apply(super::MANAGER),
                &Patch::Apply(&apply),
            )
            .await;
        if condition.is_ok() {
            self.status.wrote(Some(want.held));
        }
        let events: Api<Event> = Api::namespaced(c, "default");
        while let Some(d) = pending.front() {
            let ev: Event =
                serde_json::from_value(body::event(&self.node, uid.as_deref(), d, now_ms()))
                    .map_err(|e| Failed::because(format!("an Event: {e}")))?;
            match events.create(&PostParams::default(), &ev).await {
                Ok(_) => self.status.wrote(None),
                // One the API refuses for what it is (not for load) is said and let go: retrying it would hold
                // back every transition after it.
                Err(kube::Error::Api(s)) if (400..500).contains(&s.code) && s.code != 429 => {
                    let why = format!("an Event refused: {} {}", s.code, s.message);
                    eprintln!(
                        "gpusweep serve: kube: node {}: {}",
                        crate::core::format::escape(&self.node),
                        crate::core::format::escape(&why)
                    );
                    self.status.failed(now_ms(), &why);
                }
                Err(e) => return Err(e.into()),
            }
            pending.pop_front();
        }
        condition.map(|_| ()).map_err(Failed::from)
    }

    /// The taint as `on` says, by a patch guarded by the resourceVersion read; a Node changed in between is
    /// read again. Returns the Node's UID.
    async fn taint(&self, nodes: &Api<Node>, on: bool) -> Result<Option<String>, Failed> {
        let mut wait = Duration::from_millis(50);
        for _ in 0..CONFLICT_TRIES {
            let node = nodes.get(&self.node).await?;
            let uid = node.metadata.uid.clone();
            let json: Value =
                serde_json::to_value(&node).map_err(|e| Failed::because(e.to_string()))?;
            let Some(patch) = body::taint_patch(&json, on, now_ms()) else {
                return Ok(uid);
            };
            let patch: json_patch::Patch =
                serde_json::from_value(patch).map_err(|e| Failed::because(e.to_string()))?;
            match nodes
                .patch(
                    &self.node,
                    &PatchParams::default(),
                    &Patch::<()>::Json(patch),
                )
                .await
            {
                Ok(_) => {
                    self.status.wrote(None);
                    return Ok(uid);
                }
                // A failed `test` (422) or a stale version (409): another writer changed the Node; read again.
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 422 => {
                    self.status.conflict();
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(Failed::because(format!(
            "the Node kept changing under {CONFLICT_TRIES} taint patches"
        )))
    }
}

impl Writer {
    /// One DeviceTaintRule per GPU whose device is held (found by UUID in the node's ResourceSlices), none
    /// for the others; rules are this writer's by label. Where the cluster serves no DRA, said once. `true`
    /// where the rules keep every held GPU off (each one's device found; a host held, not unread).
    async fn device_taints(
        &self,
        c: &Client,
        want: &Desired,
        uuids: &[String],
        dra: &mut Dra,
    ) -> Result<bool, Failed> {
        if *dra == Dra::NotServed {
            return Ok(false);
        }
        let slices: Api<DynamicObject> =
            Api::all_with(c.clone(), &resource("ResourceSlice", "resourceslices"));
        let rules: Api<DynamicObject> =
            Api::all_with(c.clone(), &resource("DeviceTaintRule", "devicetaintrules"));
        let on_node = ListParams::default().fields(&format!("spec.nodeName={}", self.node));
        let ours =
            ListParams::default().labels(&format!("{}={}", body::RULE_NODE_LABEL, self.node));
        let listed = match slices.list(&on_node).await {
            Ok(l) => rules.list(&ours).await.map(|r| (l, r)),
            Err(e) => Err(e),
        };
        let (slices, existing) = match listed {
            Ok(both) => both,
            Err(kube::Error::Api(s)) if s.code == 404 => {
                eprintln!(
                    "gpusweep serve: kube: the cluster serves no DRA device taints (resource.k8s.io/v1                      DeviceTaintRule): node {} is kept off by its taint alone",
                    crate::core::format::escape(&self.node)
                );
                *dra = Dra::NotServed;
                return Ok(false);
            }
            Err(e) => return Err(e.into()),
        };
        *dra = Dra::Served;
        let slices: Vec<Value> = slices
            .items
            .iter()
            .filter_map(|s| serde_json::to_value(s).ok())
            .collect();
        let devices = if want.held == Held::Yes {
            body::devices_of(&slices, uuids)
        } else {
            Vec::new()
        };
        let mut covers = want.held == Held::Yes
            && !want.gpus.is_empty()
            && uuids.len() == want.gpus.len()
            && devices.len() == want.gpus.len();
        let wanted: std::collections::BTreeMap<String, &body::Device> = devices
            .iter()
            .map(|d| (body::rule_name(&self.node, d), d))
            .collect();
        for r in &existing.items {
            let Some(name) = r.metadata.name.as_deref() else {
                continue;
            };
            if wanted.contains_key(name) {
                continue;
            }
            match rules.delete(name, &DeleteParams::default()).await {
                Ok(_) => self.status.wrote(None),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        let have: std::collections::HashSet<&str> = existing
            .items
            .iter()
            .filter_map(|r| r.metadata.name.as_deref())
            .collect();
        for (name, d) in &wanted {
            if !have.contains(name.as_str()) && !self.create_rule(&rules, d, want).await? {
                covers = false;
            }
        }
        Ok(covers)
    }

    /// One device's rule created (or there already): `false` where the API refused it for what it is (a
    /// policy, a driver it does not allow), said; then the node taint keeps the GPU off instead.
    async fn create_rule(
        &self,
        rules: &Api<DynamicObject>,
        d: &body::Device,
        want: &Desired,
    ) -> Result<bool, Failed> {
        let rule: DynamicObject =
            serde_json::from_value(body::taint_rule(&self.node, d, want.held.reason()))
                .map_err(|e| Failed::because(format!("a DeviceTaintRule: {e}")))?;
        match rules.create(&PostParams::default(), &rule).await {
            Ok(_) => self.status.wrote(None),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(kube::Error::Api(s)) if (400..500).contains(&s.code) && s.code != 429 => {
                let why = format!("a DeviceTaintRule refused: {} {}", s.code, s.message);
                eprintln!(
                    "gpusweep serve: kube: node {}: {} (the node is tainted instead)",
                    crate::core::format::escape(&self.node),
                    crate::core::format::escape(&why)
                );
                self.status.failed(now_ms(), &why);
                return Ok(false);
            }
            Err(e) => return Err(e.into()),
        }
        Ok(true)
    }
}

/// The UUIDs of these GPUs in the latest reading, by which their DRA devices are found.
fn uuids_of(
    latest: &watch::Receiver<Option<Arc<crate::serve::hub::Reading>>>,
    gpus: &[u32],
) -> Vec<String> {
    latest
        .borrow()
        .as_ref()
        .map(|r| {
            r.snap
                .gpus
                .iter()
                .filter(|g| gpus.contains(&g.index))
                .filter_map(|g| g.uuid.clone())
                .collect()
        })
        .unwrap_or_default()
}

fn push(pending: &mut VecDeque<Desired>, d: Desired) {
    if pending.len() == PENDING_MAX {
        pending.pop_front();
    }
    pending.push_back(d);
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}
