//! SSH transport (russh).

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::collect::HostCmd;
use crate::source::agent_client::RemoteTask;

#[derive(Debug, Clone)]
pub struct SshOptions {
    pub remote_command: String,
    pub deploy: bool,
    pub accept_new: bool,
    pub max_connections: usize,
    pub connect_timeout: Duration,
    pub identities: Vec<PathBuf>,
    pub ssh_config: Option<PathBuf>,
    pub known_hosts: Option<PathBuf>,
}

impl Default for SshOptions {
    fn default() -> Self {
        SshOptions {
            remote_command: "gpusweep agent".into(),
            deploy: false,
            accept_new: false,
            max_connections: 16,
            connect_timeout: Duration::from_secs(10),
            identities: vec![],
            ssh_config: None,
            known_hosts: None,
        }
    }
}

pub async fn run(
    _task: &RemoteTask,
    _cmds: &mut mpsc::UnboundedReceiver<HostCmd>,
    _interval: &mut Duration,
) -> Result<(), String> {
    Err("SSH transport not available in this build".into())
}
