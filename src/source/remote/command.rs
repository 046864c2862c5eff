//! `cmd:COMMAND` hosts: any local command whose stdio speaks the agent protocol (`kubectl exec ...`,
//! `docker exec ...`, a local `gpusweep agent`).

use std::time::Duration;

use tokio::io::BufReader;
use tokio::sync::mpsc;

use super::RemoteTask;
use super::stream::{drive_stream, spawn_tail};
use crate::core::model::SourceKind;
use crate::source::HostCmd;

pub async fn run(
    task: &RemoteTask,
    command: &str,
    cmds: &mut mpsc::UnboundedReceiver<HostCmd>,
    interval: &mut Duration,
) -> Result<(), String> {
    let permit = task
        .connect_limit
        .acquire()
        .await
        .map_err(|e| e.to_string())?;
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {command:?}: {e}"))?;
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
