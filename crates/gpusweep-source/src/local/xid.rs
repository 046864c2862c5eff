//! XID errors, the driver's error events, watched on a thread of their own for as long as the reader lives
//! (the TUI, a serve): each GPU's last XID and how many of each were seen since. A one-shot reading does not
//! watch (it would see nothing in its lifetime); the driver's recovery action, read with each GPU's
//! identity, says what it needs then.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;

use gpusweep_core::model::Xids;

/// Each GPU's XIDs by index, shared with the reader.
pub type Seen = Arc<Mutex<HashMap<u32, Xids>>>;

/// How long one wait for an event lasts (it returns at once when one comes).
const WAIT_MS: u32 = 1000;

/// Start watching every GPU that supports XID events; `None` where none does (or events cannot be had).
pub fn watch(nvml: &'static Nvml, count: u32) -> Option<Seen> {
    let mut set = nvml.create_event_set().ok()?;
    let since_ms = gpusweep_core::model::now_ms();
    let seen: Seen = Arc::default();
    let mut any = false;
    for i in 0..count {
        let Ok(dev) = nvml.device_by_index(i) else {
            continue;
        };
        let supported = dev
            .supported_event_types()
            .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR));
        if !supported {
            continue;
        }
        set = match dev.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(s) => s,
            // A failed registration frees the set: start over with a new one for the rest.
            Err(_) => nvml.create_event_set().ok()?,
        };
        if let Ok(mut m) = seen.lock() {
            m.insert(
                i,
                Xids {
                    since_ms,
                    ..Xids::default()
                },
            );
            any = true;
        }
    }
    if !any {
        return None;
    }
    let out = seen.clone();
    std::thread::Builder::new()
        .name("xid".into())
        .spawn(move || {
            loop {
                match set.wait(WAIT_MS) {
                    Ok(e) => {
                        let (Ok(i), Some(XidError::Value(xid))) = (e.device.index(), e.event_data)
                        else {
                            continue;
                        };
                        if let Ok(mut m) = seen.lock()
                            && let Some(x) = m.get_mut(&i)
                        {
                            x.last = Some(xid);
                            *x.counts.entry(xid).or_default() += 1;
                        }
                    }
                    Err(NvmlError::Timeout) => {}
                    // The driver went away or waiting is not supported: stop watching, and say so.
                    Err(e) => {
                        if let Ok(mut m) = seen.lock() {
                            for x in m.values_mut() {
                                x.stopped = Some(format!("XID events stopped: {e}"));
                            }
                        }
                        return;
                    }
                }
            }
        })
        .ok()?;
    Some(out)
}
