//! `cmd:COMMAND` hosts: any local command whose stdio speaks the agent protocol (`kubectl exec ...`,
//! `docker exec ...`, a local `gpusweep agent`).

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::BufReader;
use tokio::sync::mpsc;

use super::RemoteTask;
use super::stream::{drive_stream, spawn_tail};
use crate::HostCmd;
use gpusweep_core::model::SourceKind;

/// Process groups of the `cmd:` hosts running now, for `kill_all` at exit.
static GROUPS: Mutex<Option<HashSet<i32>>> = Mutex::new(None);

/// A `cmd:` host's process group: the command runs in a group of its own, and the whole group (the shell, and
/// whatever it started: `ssh`, `kubectl`, a pipeline) is killed when the connection ends, times out, or the
/// fleet goes away. Killing only the shell would leave its children to PID 1.
struct Group(i32);

impl Group {
    fn new(pgid: i32) -> Group {
        if let Ok(mut g) = GROUPS.lock() {
            g.get_or_insert_with(HashSet::new).insert(pgid);
        }
        Group(pgid)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let _ = killpg(Pid::from_raw(self.0), Signal::SIGKILL);
        if let Ok(mut g) = GROUPS.lock()
            && let Some(set) = g.as_mut()
        {
            set.remove(&self.0);
        }
    }
}

/// Kill the process group of every `cmd:` host still running: called when gpusweep ends on a signal, where
/// no destructor runs.
pub fn kill_all() {
    if let Ok(g) = GROUPS.lock()
        && let Some(set) = g.as_ref()
    {
        for &pgid in set {
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
    }
}

pub async fn run(
    task: &RemoteTask,
    command: &str,
    cmds: &mut mpsc::Receiver<HostCmd>,
    interval: &mut Duration,
) -> Result<(), String> {
    let permit = task
        .connect_limit
        .acquire()
        .await
        .map_err(|e| e.to_string())?;
    let mut c = tokio::process::Command::new("sh");
    c.arg("-c")
        .arg(command)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    // A spawn copies this process's whole fd table (three pipes per host already started): off the async
    // workers, so readings of the hosts already up are read meanwhile.
    let mut child = tokio::task::spawn_blocking(move || c.spawn())
        .await
        .map_err(|e| format!("cannot start {command:?}: {e}"))?
        .map_err(|e| format!("cannot start {command:?}: {e}"))?;
    // Its pid is its group's id (process_group(0)).
    let group = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .map(Group::new);
    drop(permit);
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err("no stdio from the command".into());
    };
    let errtail = spawn_tail(stderr);
    let r = drive_stream(
        task,
        BufReader::new(stdout),
        stdin,
        cmds,
        interval,
        SourceKind::Agent,
    )
    .await;
    drop(group);
    let _ = child.kill().await;
    let tail = errtail.await.unwrap_or_default();
    r.map_err(|e| {
        if tail.is_empty() {
            e
        } else {
            format!("{e}: {tail}")
        }
    })
}
