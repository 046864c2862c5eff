//! Pods' memory-backed volumes on this node: a Kubernetes `emptyDir` with `medium: Memory` is a tmpfs the
//! kubelet mounts at `KUBELET/pods/UID/volumes/kubernetes.io~empty-dir/NAME`, and a pod's NCCL and sglang
//! segments live there in place of the host's /dev/shm (one crash left them in 101 pods). A directory there
//! is a pod's volume only where the place proves it: the pod's directory is root's (the kubelet's), and
//! the volume is a tmpfs mount of its own. Bounded: at most `MAX_PODS` pods and `MAX_VOLUMES` volumes each.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Pods looked at on one node (a kubelet runs at most a few hundred).
const MAX_PODS: usize = 1024;
/// Memory-backed volumes looked at in one pod.
const MAX_VOLUMES: usize = 64;
/// The most of a pod's `etc-hosts` read.
const MAX_ETC_HOSTS: u64 = 64 * 1024;

/// `TMPFS_MAGIC` from linux/magic.h.
const TMPFS_MAGIC: rustix::fs::FsWord = 0x0102_1994;

/// One pod volume found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodDir {
    pub uid: String,
    pub pod: Option<String>,
    pub volume: String,
    pub path: PathBuf,
    /// The tmpfs's device: an fd on a file there is a segment's, whatever its path.
    pub dev: u64,
}

/// Every pod volume under `kubelet` (the kubelet's root directory, `/var/lib/kubelet`), and what was left
/// unread past the bounds (then no absence may be said of the pods' shared memory).
pub fn find(kubelet: &Path) -> (Vec<PodDir>, Option<String>) {
    let Ok(pods) = fs::read_dir(kubelet.join("pods")) else {
        return (Vec::new(), None);
    };
    let mut out = Vec::new();
    let mut cut = None;
    for (n, pod) in pods.flatten().enumerate() {
        if n >= MAX_PODS {
            cut = Some(format!(
                "pods past the first {MAX_PODS} under {} were not read",
                kubelet.display()
            ));
            break;
        }
        let Ok(md) = fs::symlink_metadata(pod.path()) else {
            continue;
        };
        // The kubelet's: a directory someone else could make there is no pod's.
        if !md.is_dir() || md.uid() != 0 {
            continue;
        }
        let uid = pod.file_name().to_string_lossy().into_owned();
        let vols = pod.path().join("volumes").join("kubernetes.io~empty-dir");
        let Ok(vols) = fs::read_dir(&vols) else {
            continue;
        };
        let mut name = None;
        for (k, v) in vols.flatten().enumerate() {
            if k >= MAX_VOLUMES {
                cut = Some(format!(
                    "a pod ({}) has more than {MAX_VOLUMES} emptyDir volumes: the rest were not read",
                    pod.file_name().to_string_lossy()
                ));
                break;
            }
            let path = v.path();
            let Ok(vmd) = fs::symlink_metadata(&path) else {
                continue;
            };
            // A mount of its own (its device is not the pod directory's) that is a tmpfs: memory-backed.
            if !vmd.is_dir() || vmd.dev() == md.dev() || !is_tmpfs(&path) {
                continue;
            }
            if name.is_none() {
                name = Some(pod_name(&pod.path()));
            }
            out.push(PodDir {
                uid: uid.clone(),
                pod: name.clone().flatten(),
                volume: v.file_name().to_string_lossy().into_owned(),
                path,
                dev: vmd.dev(),
            });
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    (out, cut)
}

fn is_tmpfs(path: &Path) -> bool {
    rustix::fs::statfs(path).is_ok_and(|s| s.f_type == TMPFS_MAGIC)
}

/// The pod's host name, from the `etc-hosts` the kubelet writes for it: its last entry names the pod.
fn pod_name(pod_dir: &Path) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    fs::File::open(pod_dir.join("etc-hosts"))
        .ok()?
        .take(MAX_ETC_HOSTS)
        .read_to_string(&mut text)
        .ok()?;
    text.lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty() && !l.starts_with('#'))?
        .split_whitespace()
        .nth(1)
        .map(|n| gpusweep_core::format::truncate_bytes(n, 253))
}
