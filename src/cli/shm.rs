//! `gpusweep shm clean`: remove the /dev/shm files of the GPU stack (nccl-*, torch_*, ...) that no live
//! process has open or mapped, on every chosen host. Each host re-checks each file at the moment of removal
//! (same device and inode, a plain file, still unused after a fresh scan) and logs it in its audit log.

use std::time::Duration;

use anyhow::bail;

use super::common::{confirm, first_snapshots, runtime};
use crate::analyze::findings::shm::removable;
use crate::core::action::{ActionAnswer, ActionRequest};
use crate::core::format::{escape, fmt_bytes};
use crate::core::host::HostSpec;
use crate::core::model::{Feature, HostId};
use crate::core::removal::{RemovalOutcome, RemovalRequest, all_failed};
use crate::runtime::{Fleet, HostEvent, Settings};
use crate::source::HostCmd;

#[derive(Debug, clap::Args)]
pub struct CleanArgs {
    /// List what would be removed and remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not ask (required when stdin is not a terminal).
    #[arg(long, short = 'y')]
    pub yes: bool,
}

/// How long a host may take to answer one part of a removal (a fresh scan of every process's fds and maps,
/// then up to `PART` files); each answer gives the rest as long again.
const ANSWER_LIMIT: Duration = Duration::from_secs(60);

/// Files asked for in one request: a host answers part by part, so a slow one leaves unknown only the
/// files of the parts it never answered, never the ones it removed.
const PART: usize = 10_000;

/// Exit 0: everything listed was removed (or was already gone), or there was nothing to remove; 1: a file
/// was refused or could not be removed; 2: a host could not be read, or the removal was not confirmed.
pub fn run(s: &Settings, a: &CleanArgs) -> anyhow::Result<i32> {
    if s.readonly && !a.dry_run {
        bail!(
            "read-only (--readonly / readonly = true): nothing is removed; --dry-run lists what would be"
        );
    }
    let rt = runtime()?;
    let code = rt.block_on(async {
        let opts = s.fleet_acting_via_serve().without_gauges();
        let mut fleet = Fleet::start(&s.specs, &opts).await?;
        let snaps = first_snapshots(&mut fleet, s.connect_timeout).await;
        let mut unreadable = false;
        let mut reqs: Vec<(HostId, RemovalRequest)> = Vec::new();
        for (i, snap) in snaps.iter().enumerate() {
            let host = escape(&snap.host);
            if let Some(e) = &snap.error {
                eprintln!("gpusweep: {host}: {}", escape(e));
                unreadable = true;
                continue;
            }
            if fleet.spec(HostId(i)).is_some_and(HostSpec::read_only) && !a.dry_run {
                eprintln!(
                    "gpusweep: {host}: read-only host (read over HTTP or from Prometheus): nothing is removed on it; \
                     reach it over SSH or through its agent"
                );
                unreadable = true;
                continue;
            }
            if snap.lacks(Feature::Shm) || snap.shm.is_none() {
                eprintln!(
                    "gpusweep: {host}: who uses /dev/shm cannot be seen there (agentless): nothing is removed on it"
                );
                unreadable = true;
                continue;
            }
            let files = removable(snap);
            if nothing_to_remove(&host, snap, &files, &mut unreadable) {
                continue;
            }
            let total: u64 = files.iter().map(|f| f.bytes).sum();
            println!(
                "{host}: {} leftover file(s), {} — open or mapped by no live process:",
                files.len(),
                fmt_bytes(Some(total))
            );
            print_files(snap, &files);
            reqs.push((HostId(i), RemovalRequest { files }));
        }
        if reqs.is_empty() || a.dry_run {
            if a.dry_run && !reqs.is_empty() {
                println!("dry run: nothing removed");
            }
            return anyhow::Ok(if unreadable { 2 } else { 0 });
        }
        let n: usize = reqs.iter().map(|(_, r)| r.files.len()).sum();
        if !confirm(&format!("remove these {n} file(s)?"), a.yes)? {
            eprintln!("gpusweep: not confirmed: nothing removed");
            return Ok(2);
        }
        let outcomes = remove_all(&mut fleet, &reqs).await;
        let mut failed = false;
        for (host, o) in &outcomes {
            println!("  {}: {}", escape(host), o.describe());
            failed |= o.failed();
        }
        Ok(if unreadable {
            2
        } else {
            i32::from(failed)
        })
    });
    rt.shutdown_background();
    code
}

/// Whether a host has nothing to remove, said so; what its reading left unread is said either way (pods'
/// volumes past the bounds: no absence is claimed of them).
fn nothing_to_remove(
    host: &str,
    snap: &crate::core::model::HostSnapshot,
    files: &[crate::core::removal::ShmFile],
    unreadable: &mut bool,
) -> bool {
    let unread = snap.shm.as_ref().and_then(|i| i.pods_unread.as_deref());
    if let Some(why) = unread {
        eprintln!("gpusweep: {host}: {}", escape(why));
        *unreadable = true;
    }
    if !files.is_empty() {
        return false;
    }
    if unread.is_some() {
        println!("{host}: no leftovers in what was read");
    } else {
        println!("{host}: no /dev/shm leftovers");
    }
    true
}

/// Each file to remove, with its size, its path and the pod it is in.
fn print_files(snap: &crate::core::model::HostSnapshot, files: &[crate::core::removal::ShmFile]) {
    for f in files {
        let path = match (&f.pod_volume, snap.shm.as_ref()) {
            (Some(v), _) => crate::core::model::shm_path(Some(v), &f.name),
            (None, Some(i)) => i.path_of(&f.name),
            (None, None) => crate::core::model::shm_path(None, &f.name),
        };
        let pod = f
            .pod_volume
            .as_deref()
            .and_then(|v| snap.shm.as_ref()?.pods.iter().find(|p| p.dir == v))
            .map(|p| format!("  ({})", escape(&p.describe())))
            .unwrap_or_default();
        println!("  {:>10}  {}{pod}", fmt_bytes(Some(f.bytes)), escape(&path));
    }
}

/// A host's parts still to ask, and the id of the one asked now.
type HostParts = (
    HostId,
    std::collections::VecDeque<RemovalRequest>,
    Option<u64>,
);

/// Ask a host for its next part, if it has one; `asked` keeps every part asked, by id - 1.
fn ask_next(fleet: &Fleet, p: &mut HostParts, asked: &mut Vec<RemovalRequest>) {
    p.2 = p.1.pop_front().map(|req| {
        asked.push(req.clone());
        let id = asked.len() as u64;
        fleet.send(
            p.0,
            HostCmd::Act {
                id,
                req: ActionRequest::Remove(req),
            },
        );
        id
    });
}

/// Each host's files asked for in parts of at most `PART`, one part at a time per host (hosts side by
/// side), each part's answer reported as it comes; a part a host does not answer within `ANSWER_LIMIT` of
/// the last answer has its files, and those of the parts not yet asked, reported as unknown or not done.
async fn remove_all(
    fleet: &mut Fleet,
    whole: &[(HostId, RemovalRequest)],
) -> Vec<(String, RemovalOutcome)> {
    // Per host: its parts still to ask, and the id of the one asked now.
    let mut parts: Vec<(
        HostId,
        std::collections::VecDeque<RemovalRequest>,
        Option<u64>,
    )> = whole
        .iter()
        .map(|(host, req)| {
            let parts = req
                .files
                .chunks(PART)
                .map(|files| RemovalRequest {
                    files: files.to_vec(),
                })
                .collect();
            (*host, parts, None)
        })
        .collect();
    let mut asked: Vec<RemovalRequest> = Vec::new();
    for p in &mut parts {
        ask_next(fleet, p, &mut asked);
    }
    let mut out = Vec::new();
    let mut deadline = tokio::time::Instant::now() + ANSWER_LIMIT;
    while parts.iter().any(|p| p.2.is_some()) {
        let Ok(Some(ev)) = tokio::time::timeout_at(deadline, fleet.recv()).await else {
            break;
        };
        let HostEvent::Answer {
            host,
            id,
            answer: ActionAnswer::Remove(outcomes),
        } = ev
        else {
            continue;
        };
        let Some(p) = parts.iter_mut().find(|p| p.0 == host && p.2 == Some(id)) else {
            continue;
        };
        deadline = tokio::time::Instant::now() + ANSWER_LIMIT;
        let label = fleet.label(host).to_string();
        out.extend(outcomes.into_iter().map(|o| (label.clone(), o)));
        ask_next(fleet, p, &mut asked);
    }
    for (host, left, now) in parts {
        let label = fleet.label(host).to_string();
        if let Some(req) = now.and_then(|id| asked.get(usize::try_from(id).ok()?.checked_sub(1)?)) {
            out.extend(
                all_failed(
                    req,
                    "no answer from the host: whether it was removed is unknown",
                )
                .into_iter()
                .map(|o| (label.clone(), o)),
            );
        }
        for req in left {
            out.extend(
                all_failed(
                    &req,
                    "not asked: the host stopped answering before this part",
                )
                .into_iter()
                .map(|o| (label.clone(), o)),
            );
        }
    }
    out
}
