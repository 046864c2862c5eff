//! Parsers for the agentless fallback: nvidia-smi CSV and the output of a POSIX shell scan of /proc.
//! Remote output is untrusted: nothing here panics, and every size is bounded.

use std::collections::HashMap;

use crate::local::procfs::is_benign_program;
use crate::{gpus_of_devices, shown_pids};
use gpusweep_core::model::{
    Feature, Gpu, Holder, HostSnapshot, ListedProcess, MIB, Memory, Proc, ProcessKind, SourceKind,
    now_ms,
};
use gpusweep_core::procstat::parse_stat;

/// The fields asked of `nvidia-smi --query-gpu`, in order. The first nine are what the reference H200 printed.
pub(crate) const GPU_QUERY: &str = "index,uuid,name,memory.used,memory.total,memory.reserved,compute_cap,persistence_mode,pci.bus_id,utilization.gpu,temperature.gpu,power.draw";
/// No process name: nvidia-smi prints it raw, and a name with a newline could forge a CSV row. Names come from
/// the scan of /proc, which is NUL-separated.
pub(crate) const APPS_QUERY: &str = "pid,gpu_uuid,used_memory";

/// Most records and bytes per record a remote may send us in one reading.
pub(crate) const MAX_RECORDS: usize = 400_000;
pub(crate) const MAX_RECORD: usize = 16_384;

/// `[N/A]`, `[Not Supported]`, `N/A`, `[Unknown Error]`, empty: no reading.
fn value(s: &str) -> Option<&str> {
    let t = s.trim();
    if t.is_empty() || t.starts_with('[') || t.eq_ignore_ascii_case("N/A") {
        None
    } else {
        Some(t)
    }
}

fn mib(s: &str) -> Option<u64> {
    value(s)?
        .split_whitespace()
        .next()?
        .parse::<u64>()
        .ok()?
        .checked_mul(MIB)
}

/// `--query-gpu=GPU_QUERY --format=csv,noheader,nounits`. Lines that do not parse are skipped.
pub(crate) fn parse_gpus(csv: &str) -> Vec<Gpu> {
    let mut out = Vec::new();
    for line in csv.lines().take(1024) {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let Some(index) = f
            .first()
            .and_then(|v| value(v))
            .and_then(|v| v.parse::<u32>().ok())
        else {
            continue;
        };
        let get = |i: usize| f.get(i).copied().and_then(value);
        out.push(Gpu {
            index,
            uuid: get(1).map(str::to_string),
            name: get(2).map(str::to_string),
            memory: Memory {
                used: f.get(3).and_then(|v| mib(v)),
                total: f.get(4).and_then(|v| mib(v)),
                reserved: f.get(5).and_then(|v| mib(v)),
            },
            compute_capability: get(6).map(str::to_string),
            persistence_mode: get(7).map(|v| v.eq_ignore_ascii_case("enabled")),
            pci_bus_id: get(8).map(str::to_string),
            utilization: get(9).and_then(|v| v.parse().ok()),
            temperature_c: get(10).and_then(|v| v.parse().ok()),
            power_mw: get(11)
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|w| w.is_finite() && *w >= 0.0)
                .map(|w| {
                    // Finite, non-negative, and clamped: the cast cannot wrap.
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    let mw = (w * 1000.0).min(f64::from(u32::MAX)) as u32;
                    mw
                }),
            // Without NVML the minor number is unknown; nvidia-smi's index is the best guess for /dev/nvidiaN.
            minor: Some(index),
            ..Default::default()
        });
    }
    out
}

/// `--query-compute-apps=APPS_QUERY --format=csv,noheader,nounits`, attached to GPUs by UUID.
/// An empty process list is 0 bytes of output. The name may contain commas: it is the rest of the line.
pub(crate) fn attach_apps(gpus: &mut [Gpu], csv: &str) {
    for line in csv.lines().take(65_536) {
        let mut it = line.splitn(4, ',');
        let (Some(pid), Some(uuid), Some(used)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        let Some(pid) = value(pid).and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let name = it.next().and_then(value).map(str::to_string);
        let uuid = uuid.trim();
        if let Some(g) = gpus.iter_mut().find(|g| g.uuid.as_deref() == Some(uuid)) {
            g.processes.push(ListedProcess {
                pid,
                used_bytes: mib(used),
                kind: ProcessKind::Compute,
                name,
                gpu_instance: None,
            });
        }
    }
}

/// What the agentless shell scan printed, parsed.
#[derive(Debug, Default)]
pub struct ShellScan {
    pub gpus_csv: String,
    pub apps_csv: String,
    pub gpu_error: Option<String>,
    pub procs: HashMap<u32, Proc>,
    pub fds: HashMap<u32, Vec<String>>,
    pub cmdlines: HashMap<u32, String>,
    pub users: HashMap<u32, String>,
    pub unreadable: u32,
}

/// The script run on an agentless host. Every record ends with a NUL byte, so no text a process controls
/// (a `comm` of `\n##x`, a cmdline with newlines) can end a record early or forge a section header.
/// Sections are headed by a `##name` record; everything is read-only.
pub(crate) fn shell_script() -> String {
    format!(
        r#"export LC_ALL=C
printf '##gpus\0'; nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader,nounits 2>/dev/null; s=$?; printf '\0'; [ $s -eq 0 ] || printf '##gpu_error\0'
printf '##apps\0'; nvidia-smi --query-compute-apps={APPS_QUERY} --format=csv,noheader,nounits 2>/dev/null; printf '\0'
printf '##stat\0'; for d in /proc/[0-9]*; do cat "$d/stat" 2>/dev/null && printf '\0'; done
printf '##uid\0'; for d in /proc/[0-9]*; do u=$(sed -n 's/^Uid:[[:space:]]*\([0-9]*\).*/\1/p' "$d/status" 2>/dev/null) && [ -n "$u" ] && printf '%s %s\0' "${{d#/proc/}}" "$u"; done
printf '##fds\0'; for d in /proc/[0-9]*; do [ -r "$d/fd" ] || {{ [ -d "$d" ] && printf 'unreadable %s\0' "${{d#/proc/}}"; continue; }}; for f in "$d"/fd/*; do l=$(readlink "$f" 2>/dev/null) || continue; case "$l" in /dev/nvidia*) printf '%s %s\0' "${{d#/proc/}}" "$l";; esac; done; done 2>/dev/null
printf '##passwd\0'; cut -d: -f1,3 /etc/passwd 2>/dev/null | tr '\n' '\0'
printf '##cmdline\0'; for p in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do [ -r /proc/$p/cmdline ] && printf '%s ' "$p" && tr '\0' ' ' < /proc/$p/cmdline && printf '\0'; done
printf '##end\0'
"#
    )
}

/// The CSV sections may be long (a line per GPU or process); every other record is one short line.
const MAX_CSV: usize = 8 * 1024 * 1024;

/// The scan being read: the sections' records go into `scan`; users are joined to processes at the end.
#[derive(Default)]
struct Reading {
    scan: ShellScan,
    passwd: HashMap<u32, String>,
    uids: HashMap<u32, u32>,
}

impl Reading {
    /// One record of a section.
    fn record(&mut self, section: &str, line: &str) {
        let scan = &mut self.scan;
        match section {
            "gpus" if scan.gpus_csv.len() + line.len() <= MAX_CSV => {
                scan.gpus_csv.push_str(line);
                scan.gpus_csv.push('\n');
            }
            "apps" if scan.apps_csv.len() + line.len() <= MAX_CSV => {
                scan.apps_csv.push_str(line);
                scan.apps_csv.push('\n');
            }
            "stat" => {
                if let Some(p) = parse_stat(line) {
                    scan.procs.insert(p.pid, p);
                }
            }
            "uid" => {
                let mut it = line.split_whitespace();
                if let (Some(Ok(pid)), Some(Ok(uid))) =
                    (it.next().map(str::parse), it.next().map(str::parse))
                {
                    self.uids.insert(pid, uid);
                }
            }
            "fds" => self.fd(line),
            "passwd" => {
                if let Some((name, uid)) = line.split_once(':')
                    && let Ok(uid) = uid.trim().parse::<u32>()
                {
                    self.passwd.insert(uid, name.to_string());
                }
            }
            "cmdline" => {
                if let Some((pid, cmd)) = line.split_once(' ')
                    && let Ok(pid) = pid.trim().parse::<u32>()
                {
                    scan.cmdlines.insert(pid, cmd.trim_end().to_string());
                }
            }
            _ => {}
        }
    }

    /// A device file a process has open, or a process whose fds could not be read.
    fn fd(&mut self, line: &str) {
        let scan = &mut self.scan;
        if let Some(pid) = line
            .strip_prefix("unreadable ")
            .and_then(|p| p.trim().parse::<u32>().ok())
        {
            scan.unreadable += 1;
            if let Some(p) = scan.procs.get_mut(&pid) {
                p.fds_unreadable = true;
            }
            return;
        }
        if let Some((pid, path)) = line.split_once(' ')
            && let Ok(pid) = pid.parse::<u32>()
        {
            let v = scan.fds.entry(pid).or_default();
            if v.len() < 4096 {
                v.push(path.to_string());
            }
        }
    }

    /// The scan, each process with its user's name where the scan named it.
    fn done(mut self) -> ShellScan {
        for (pid, uid) in self.uids {
            if let Some(p) = self.scan.procs.get_mut(&pid) {
                p.uid = Some(uid);
                p.user = Some(
                    self.passwd
                        .get(&uid)
                        .cloned()
                        .unwrap_or_else(|| uid.to_string()),
                );
            }
        }
        self.scan
    }
}

/// The section a `##NAME` line starts; `None` for `##gpu_error`, which is a record of its own.
fn section_of(name: &str) -> Option<&'static str> {
    Some(match name {
        "gpu_error" => return None,
        "gpus" => "gpus",
        "apps" => "apps",
        "stat" => "stat",
        "uid" => "uid",
        "fds" => "fds",
        "passwd" => "passwd",
        "cmdline" => "cmdline",
        _ => "",
    })
}

pub(crate) fn parse_shell_scan(out: &str) -> ShellScan {
    let mut r = Reading::default();
    let mut section = "";
    for record in out.split('\0').take(MAX_RECORDS) {
        // `cat stat` ends with a newline; inside a record newlines are data.
        let line = record.strip_suffix('\n').unwrap_or(record);
        let csv = matches!(section, "gpus" | "apps");
        if line.len() > if csv { MAX_CSV } else { MAX_RECORD } {
            continue;
        }
        match line.strip_prefix("##").map(section_of) {
            Some(Some(s)) => section = s,
            Some(None) => r.scan.gpu_error = Some("nvidia-smi failed or is not installed".into()),
            None => r.record(section, line),
        }
    }
    r.done()
}

/// Holders from the fd lines of a shell scan: (pid, devices, fd count) mapped to GPU indices through minors.
pub(crate) fn holders_from_fds(fds: &HashMap<u32, Vec<String>>, gpus: &[Gpu]) -> Vec<Holder> {
    let mut out: Vec<Holder> = fds
        .iter()
        .map(|(&pid, paths)| {
            let mut devices: Vec<String> = paths.clone();
            devices.sort();
            devices.dedup();
            Holder {
                pid,
                gpus: gpus_of_devices(&devices, gpus),
                devices,
                fd_count: u32::try_from(paths.len()).unwrap_or(u32::MAX),
                benign: false,
                kept: false,
                declared: false,
            }
        })
        .collect();
    out.sort_by_key(|h| h.pid);
    out
}

/// Build a snapshot from the agentless shell scan's output.
pub(crate) fn agentless_snapshot(label: &str, out: &str, benign: &[String]) -> HostSnapshot {
    let scan = parse_shell_scan(out);
    let mut gpus = parse_gpus(&scan.gpus_csv);
    attach_apps(&mut gpus, &scan.apps_csv);
    let mut procs = scan.procs;
    for (pid, cmd) in &scan.cmdlines {
        if let Some(p) = procs.get_mut(pid) {
            p.cmdline.clone_from(cmd);
        }
    }
    let mut holders = holders_from_fds(&scan.fds, &gpus);
    for h in &mut holders {
        if let Some(p) = procs.get(&h.pid) {
            // The shell scan has no exe: the comm (the kernel's name for the program) decides.
            h.benign = is_benign_program(&p.comm, None, benign);
        }
    }
    crate::unbenign_charged(&mut holders, &gpus);
    let seeds = holders
        .iter()
        .map(|h| h.pid)
        .chain(gpus.iter().flat_map(|g| g.processes.iter().map(|p| p.pid)))
        .collect::<Vec<_>>();
    let (wanted, zombies) = shown_pids(&procs, seeds.into_iter());
    let mut processes: Vec<_> = wanted
        .iter()
        .filter_map(|p| procs.get(p).cloned())
        .collect();
    processes.sort_by_key(|p| p.pid);
    HostSnapshot {
        live_url: None,
        simulated: false,
        host: label.to_string(),
        error: None,
        taken_at_ms: now_ms(),
        source: SourceKind::Smi,
        gpu_error: scan.gpu_error,
        driver_version: None,
        gpus,
        processes,
        holders,
        zombies,
        shm: None,
        unreadable_processes: scan.unreadable,
        in_child_pid_namespace: false,
        missing_features: vec![Feature::Signals, Feature::Shm, Feature::Sensors],
        findings: vec![],
        jobs: vec![],
        // Read over a shell, no act notes: a rank another gpusweep ended may read as lost here.
        acts: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Real output from an idle H200 (docs/validation.md lists the reference readings).
    const IDLE: &str = "0, GPU-a5b2e79f-a4e0-1241-ebeb-3cdbbcebd2a0, NVIDIA H200, 0, 143771, 616, 9.0, Enabled, 00000000:00:06.0\n";
    const GHOST_APP: &str = "924, GPU-a5b2e79f-a4e0-1241-ebeb-3cdbbcebd2a0, 10148, [Not Found]\n";

    #[test]
    fn real_idle_h200_line() {
        let g = parse_gpus(IDLE);
        assert_eq!(g.len(), 1);
        let g = &g[0];
        assert_eq!(g.index, 0);
        assert_eq!(g.name.as_deref(), Some("NVIDIA H200"));
        assert_eq!(g.memory.used, Some(0));
        assert_eq!(g.memory.total, Some(143_771 * MIB));
        assert_eq!(g.memory.reserved, Some(616 * MIB));
        assert_eq!(g.compute_capability.as_deref(), Some("9.0"));
        assert_eq!(g.persistence_mode, Some(true));
        assert_eq!(g.pci_bus_id.as_deref(), Some("00000000:00:06.0"));
        // Fields the nine-column query did not ask for are unknown, not zero.
        assert_eq!(g.utilization, None);
        assert_eq!(g.power_mw, None);
    }

    #[test]
    fn real_ghost_app_line_and_empty_app_list() {
        let mut g = parse_gpus(IDLE);
        attach_apps(&mut g, "");
        assert!(g[0].processes.is_empty());
        attach_apps(&mut g, GHOST_APP);
        assert_eq!(g[0].processes.len(), 1);
        assert_eq!(g[0].processes[0].pid, 924);
        assert_eq!(g[0].processes[0].used_bytes, Some(10148 * MIB));
        assert_eq!(g[0].processes[0].name, None, "[Not Found] is no name");
    }

    #[test]
    fn not_supported_values_are_none() {
        let g = parse_gpus(
            "3, GPU-x, Tesla T4, [N/A], 15360, [Not Supported], 7.5, Disabled, 0:1:0.0, [N/A], 41, [Not Supported]\n",
        );
        assert_eq!(g[0].memory.used, None);
        assert_eq!(g[0].memory.reserved, None);
        assert_eq!(g[0].temperature_c, Some(41));
        assert_eq!(g[0].power_mw, None);
        assert_eq!(g[0].persistence_mode, Some(false));
    }

    #[test]
    fn shell_scan_sections() {
        let out = format!(
            "##gpus\0{IDLE}\0##apps\0{GHOST_APP}\0##stat\x00946 (python3) S 1 924 924 0 -1 4194560 1 0 0 0 5 3 0 0 20 0 2 0 123456 100 5\n\0##uid\x00946 1000\0##fds\x00946 /dev/nvidia0\x00946 /dev/nvidia0\x00946 /dev/nvidiactl\0unreadable 77\0##passwd\0alice:1000\0##cmdline\x00946 python3 leak.py \0##end\0"
        );
        let s = parse_shell_scan(&out);
        let mut gpus = parse_gpus(&s.gpus_csv);
        attach_apps(&mut gpus, &s.apps_csv);
        assert_eq!(gpus[0].processes[0].pid, 924);
        assert_eq!(s.procs[&946].user.as_deref(), Some("alice"));
        assert_eq!(s.cmdlines[&946], "python3 leak.py");
        assert_eq!(s.unreadable, 1);
        let h = holders_from_fds(&s.fds, &gpus);
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].gpus, vec![0]);
        assert_eq!(h[0].fd_count, 3);
    }

    /// A `comm` with a newline and a fake section header, and a cmdline with newlines, do not end their records:
    /// the processes after them are still read, and nothing is taken for a header.
    #[test]
    fn hostile_names_cannot_end_a_record() {
        let out = "##stat\0\
            500 (\n##x) S 1 500 500 0 -1 4194560 1 0 0 0 5 3 0 0 20 0 2 0 1000 100 5\n\0\
            501 (python3) S 1 501 501 0 -1 4194560 1 0 0 0 5 3 0 0 20 0 2 0 1001 100 5\n\0\
            ##uid\x00500 0\x00501 1000\0\
            ##fds\x00501 /dev/nvidia0\0\
            ##cmdline\x00501 python3 x\n##fds\n999 /dev/nvidia0 \0##end\0";
        let s = parse_shell_scan(out);
        assert_eq!(s.procs[&500].comm, "\n##x");
        assert_eq!(
            s.procs[&501].uid,
            Some(1000),
            "records after the hostile comm are read"
        );
        assert_eq!(s.fds.keys().copied().collect::<Vec<_>>(), vec![501]);
        assert!(
            s.cmdlines[&501].contains("##fds"),
            "a newline in a cmdline stays data"
        );
    }

    proptest::proptest! {
        #[test]
        fn parsers_never_panic(s in "\\PC{0,400}") {
            let mut g = parse_gpus(&s);
            attach_apps(&mut g, &s);
            let scan = parse_shell_scan(&s);
            let _ = holders_from_fds(&scan.fds, &g);
        }

        #[test]
        fn csv_shaped_garbage_never_panics(fields in proptest::collection::vec("[0-9A-Za-z \\[\\]./-]{0,12}", 0..16)) {
            let line = fields.join(",");
            let mut g = parse_gpus(&line);
            attach_apps(&mut g, &line);
        }
    }
}
