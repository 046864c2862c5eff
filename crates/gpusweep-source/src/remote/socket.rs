//! A `gpusweep serve` on this host, through its Unix socket (`unix:PATH` hosts, and this host for `snapshot`
//! and `wait` when a serve answers): the agent protocol, with NVML already warm on the other end.

use std::time::Duration;

use tokio::io::BufReader;
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use super::RemoteTask;
use super::stream::drive_stream;
use crate::HostCmd;
use gpusweep_core::model::SourceKind;

pub async fn run(
    task: &RemoteTask,
    path: &str,
    cmds: &mut mpsc::Receiver<HostCmd>,
    interval: &mut Duration,
) -> Result<(), String> {
    let stream = UnixStream::connect(path)
        .await
        .map_err(|e| format!("no gpusweep serve answers on {path}: {e}"))?;
    let (r, w) = stream.into_split();
    drive_stream(
        task,
        BufReader::new(r),
        w,
        cmds,
        interval,
        SourceKind::Serve,
    )
    .await
}
