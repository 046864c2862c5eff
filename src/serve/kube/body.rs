//! What the node writer sends, as the API's JSON: the condition's apply body, the taint's guarded patch,
//! an Event. Pure, so what goes on the wire is tested without a server; `api` sends it.

use serde_json::{Value, json};

use super::hold::{Desired, Held};
use super::{CONDITION, TAINT_KEY};

/// The API's timestamps: RFC 3339 in UTC, to the second (`metav1.Time`).
pub fn time(ms: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
        .to_string()
}

/// `metav1.MicroTime`, which an Event's `eventTime` must be.
pub fn micro_time(ms: u64) -> String {
    humantime::format_rfc3339_micros(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
        .to_string()
}

/// The longest message the writer puts on a Node (the API takes more; a condition is read on one line).
const MESSAGE_MAX: usize = 1024;

fn message(d: &Desired) -> String {
    crate::core::format::truncate_bytes(&d.message, MESSAGE_MAX)
}

/// The server-side apply body of `nodes/status` that owns the `GPUHeld` condition alone (conditions are a
/// map keyed by type: the kubelet's and other managers' stay theirs).
pub fn condition_apply(node: &str, d: &Desired, now_ms: u64) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": { "name": node },
        "status": { "conditions": [{
            "type": CONDITION,
            "status": d.held.status(),
            "reason": d.held.reason(),
            "message": message(d),
            "lastTransitionTime": time(d.since_ms),
            "lastHeartbeatTime": time(now_ms),
        }]}
    })
}

/// The JSON patch that puts the taint on (or takes it off) a Node as read, or `None` when it already says
/// so. `spec.taints` is one atomic list, so the patch replaces it whole with every other taint as read, and
/// its first operation tests the resourceVersion read: a Node changed since fails the patch, never loses a
/// taint another writer added.
pub fn taint_patch(node: &Value, on: bool, now_ms: u64) -> Option<Value> {
    let rv = node.pointer("/metadata/resourceVersion")?.as_str()?;
    let taints: Vec<Value> = node
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let ours = |t: &Value| t.get("key").and_then(Value::as_str) == Some(TAINT_KEY);
    let has = taints.iter().any(ours);
    if has == on {
        return None;
    }
    let mut kept: Vec<Value> = taints.iter().filter(|t| !ours(t)).cloned().collect();
    if on {
        kept.push(json!({ "key": TAINT_KEY, "effect": "NoSchedule", "timeAdded": time(now_ms) }));
    }
    let present = node.pointer("/spec/taints").is_some();
    let change = match (present, kept.is_empty()) {
        (true, true) => json!({ "op": "remove", "path": "/spec/taints" }),
        (true, false) => json!({ "op": "replace", "path": "/spec/taints", "value": kept }),
        (false, _) => json!({ "op": "add", "path": "/spec/taints", "value": kept }),
    };
    Some(json!([
        { "op": "test", "path": "/metadata/resourceVersion", "value": rv },
        change
    ]))
}

/// The Event of one transition, on the Node (`kubectl describe node` shows it).
pub fn event(node: &str, node_uid: Option<&str>, d: &Desired, now_ms: u64) -> Value {
    let (reason, kind) = match d.held {
        Held::Yes => ("GPUHeld", "Warning"),
        Held::No => ("GPUClean", "Normal"),
        Held::Unread => ("GPUUnread", "Warning"),
    };
    let mut regarding = json!({ "apiVersion": "v1", "kind": "Node", "name": node });
    if let Some(uid) = node_uid {
        regarding["uid"] = json!(uid);
    }
    json!({
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": { "generateName": format!("{node}.gpusweep-") },
        "eventTime": micro_time(now_ms),
        "reportingController": "gpusweep.io/serve",
        "reportingInstance": format!("gpusweep-{node}"),
        "action": "Judge",
        "reason": reason,
        "type": kind,
        "regarding": regarding,
        "note": message(d),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(h: Held) -> Desired {
        Desired {
            held: h,
            message: "gpu-a: GPU 0: 2.0 GiB held by 7391 (k8s:3f2a9c1e), ghost".into(),
            gpus: vec![0],
            since_ms: 1_780_000_000_000,
        }
    }

    #[test]
    fn the_taint_patch_keeps_every_other_taint_and_tests_the_version_read() {
        let node = json!({
            "metadata": { "resourceVersion": "41" },
            "spec": { "taints": [{ "key": "other.io/x", "effect": "NoExecute" }] }
        });
        let p = taint_patch(&node, true, 0).expect("a change");
        assert_eq!(
            p[0],
            json!({ "op": "test", "path": "/metadata/resourceVersion", "value": "41" })
        );
        assert_eq!(p[1]["op"], "replace");
        let t = p[1]["value"].as_array().expect("taints");
        assert_eq!(t.len(), 2);
        assert_eq!(t[0]["key"], "other.io/x");
        assert_eq!(
            (t[1]["key"].as_str(), t[1]["effect"].as_str()),
            (Some(TAINT_KEY), Some("NoSchedule"))
        );
        // Already so: nothing to send.
        assert_eq!(taint_patch(&node, false, 0), None);
        // Off: the others stay; the last one off removes the list.
        let on = json!({ "metadata": { "resourceVersion": "42" }, "spec": { "taints": [t[0].clone(), t[1].clone()] } });
        let off = taint_patch(&on, false, 0).expect("a change");
        assert_eq!(off[1]["value"], json!([t[0].clone()]));
        let alone = json!({ "metadata": { "resourceVersion": "43" }, "spec": { "taints": [t[1].clone()] } });
        assert_eq!(
            taint_patch(&alone, false, 0).expect("a change")[1],
            json!({ "op": "remove", "path": "/spec/taints" })
        );
        let bare = json!({ "metadata": { "resourceVersion": "44" }, "spec": {} });
        assert_eq!(
            taint_patch(&bare, true, 0).expect("a change")[1]["op"],
            "add"
        );
    }

    #[test]
    fn the_condition_says_the_verdict_and_the_event_names_no_more() {
        let c = condition_apply("gpu-a", &held(Held::Yes), 1_780_000_060_000);
        let cond = &c["status"]["conditions"][0];
        assert_eq!(cond["type"], CONDITION);
        assert_eq!(cond["status"], "True");
        assert_eq!(cond["reason"], "LeftoverHolds");
        assert_eq!(cond["lastTransitionTime"], "2026-05-28T20:26:40Z");
        assert_eq!(cond["lastHeartbeatTime"], "2026-05-28T20:27:40Z");
        let unread = condition_apply("gpu-a", &held(Held::Unread), 0);
        assert_eq!(unread["status"]["conditions"][0]["status"], "Unknown");
        let e = event("gpu-a", Some("u-1"), &held(Held::No), 1_780_000_000_000);
        assert_eq!(
            (e["reason"].as_str(), e["type"].as_str()),
            (Some("GPUClean"), Some("Normal"))
        );
        assert_eq!(e["regarding"]["uid"], "u-1");
        assert_eq!(e["eventTime"], "2026-05-28T20:26:40.000000Z");
        let long = Desired {
            message: "x".repeat(5000),
            ..held(Held::Yes)
        };
        assert!(
            event("gpu-a", None, &long, 0)["note"]
                .as_str()
                .is_some_and(|n| n.len() <= MESSAGE_MAX)
        );
    }
}

/// A GPU's device as a DRA driver publishes it in the node's ResourceSlices.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Device {
    pub driver: String,
    pub pool: String,
    pub device: String,
}

/// The devices of `slices` (ResourceSlice objects as JSON) that are these GPUs: a device any of whose string
/// attributes is the GPU's UUID (NVIDIA's driver publishes it as `uuid`). A GPU no device names is left out:
/// a device is never guessed from an index.
pub fn devices_of(slices: &[Value], uuids: &[String]) -> Vec<Device> {
    let mut out = Vec::new();
    for s in slices {
        let (Some(driver), Some(pool)) = (
            s.pointer("/spec/driver").and_then(Value::as_str),
            s.pointer("/spec/pool/name").and_then(Value::as_str),
        ) else {
            continue;
        };
        let devices = s.pointer("/spec/devices").and_then(Value::as_array);
        for d in devices.into_iter().flatten() {
            let Some(name) = d.get("name").and_then(Value::as_str) else {
                continue;
            };
            let names_one = d
                .get("attributes")
                .and_then(Value::as_object)
                .into_iter()
                .flat_map(|a| a.values())
                .filter_map(|v| v.get("string").and_then(Value::as_str))
                .any(|v| uuids.iter().any(|u| u.eq_ignore_ascii_case(v)));
            if names_one {
                out.push(Device {
                    driver: driver.to_string(),
                    pool: pool.to_string(),
                    device: name.to_string(),
                });
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The label that marks a DeviceTaintRule as this node's writer's.
pub const RULE_NODE_LABEL: &str = "gpusweep.io/node";

/// A DeviceTaintRule's name: `gpusweep-held.NODE.DEVICE` (DNS subdomain parts as the API gave them), or a
/// digest of it past the 253 characters a name may have.
pub fn rule_name(node: &str, d: &Device) -> String {
    use sha2::Digest;
    let name = format!("gpusweep-held.{node}.{}", d.device);
    if name.len() <= 253 {
        return name;
    }
    let digest = sha2::Sha256::digest(format!("{node}/{}/{}/{}", d.driver, d.pool, d.device));
    format!("gpusweep-held.{}", data_encoding::HEXLOWER.encode(&digest))
}

/// The DeviceTaintRule that keeps claims off one GPU's device while it is held or unread (resource.k8s.io/v1);
/// its value is the condition's reason (`LeftoverHolds`, `Unread`).
pub fn taint_rule(node: &str, d: &Device, reason: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule_name(node, d),
            "labels": { RULE_NODE_LABEL: node },
        },
        "spec": {
            "deviceSelector": { "driver": d.driver, "pool": d.pool, "device": d.device },
            "taint": { "key": TAINT_KEY, "value": reason, "effect": "NoSchedule",
            },
        },
    })
}

#[cfg(test)]
mod dra_tests {
    use super::*;

    #[test]
    fn a_gpu_is_found_by_its_uuid_and_its_rule_selects_that_device_alone() {
        let slices = vec![json!({
            "spec": { "driver": "gpu.nvidia.com", "pool": { "name": "gpu-a" }, "devices": [
                { "name": "gpu-0", "attributes": { "uuid": { "string": "GPU-aaa" }, "index": { "int": 0 } } },
                { "name": "gpu-1", "attributes": { "uuid": { "string": "GPU-bbb" }, "index": { "int": 1 } } },
                { "name": "gpu-2", "attributes": { "index": { "int": 2 } } },
            ]}
        })];
        let found = devices_of(&slices, &["gpu-bbb".into(), "GPU-ccc".into()]);
        assert_eq!(
            found,
            [Device {
                driver: "gpu.nvidia.com".into(),
                pool: "gpu-a".into(),
                device: "gpu-1".into()
            }]
        );
        let rule = taint_rule("gpu-a", &found[0], "LeftoverHolds");
        assert_eq!(rule["metadata"]["name"], "gpusweep-held.gpu-a.gpu-1");
        assert_eq!(rule["spec"]["deviceSelector"]["device"], "gpu-1");
        assert_eq!(rule["spec"]["taint"]["effect"], "NoSchedule");
        assert_eq!(rule["spec"]["taint"]["value"], "LeftoverHolds");
        let long = Device {
            device: "d".repeat(250),
            ..found[0].clone()
        };
        assert!(rule_name("gpu-a", &long).len() <= 253);
    }
}
