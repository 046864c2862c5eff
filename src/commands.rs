//! The subcommands: resolve settings, start the fleet, print, and map results to exit codes.

use std::collections::{BTreeMap, HashSet};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};

use crate::analyze::{AnalyzeOptions, gpu_state};
use crate::cli::Global;
use crate::collect::{ConnStatus, Fleet, FleetOptions, HostCmd, HostEvent};
use crate::config::{self, Config, parse_duration, parse_gpu_list};
use crate::hosts::{self, HostSpec};
use crate::model::{HostSnapshot, MIB, fmt_bytes, fmt_opt, now_ms};
use crate::smem::{self, Dtype, Tile};
use crate::source::demo::{DEMO_HOSTS, DemoClock};
use crate::source::procfs::ProcfsConfig;
use crate::source::ssh::SshOptions;
use crate::sweep::{self, AuditLog, Fate, Outcome, Plan, Sig, SignalRequest, TargetInfo};
use crate::tui::view::truncate;
use crate::watch::{Scope, Verdict, Watch, fmt_ms, fmt_secs, judged_by_holders_only};

/// Everything a command needs, resolved from CLI > environment > config file > defaults.
#[derive(Debug, Clone)]
pub struct Settings {
    pub specs: Vec<HostSpec>,
    pub fleet: FleetOptions,
    pub config: Config,
    pub connect_timeout: Duration,
    pub demo: bool,
    /// Hosts came from --hosts, --hostfile or the config file (not the local default).
    pub hosts_given: bool,
    /// --local: never fall back to the demo cluster.
    pub local: bool,
}

pub fn settings(g: &Global) -> anyhow::Result<Settings> {
    let config = config::load(g.config.as_deref(), g.config.is_some())
        .map_err(|e| anyhow!("config: {e}"))?;
    let interval = match g.interval.as_deref().or(config.interval.as_deref()) {
        Some(s) => parse_duration(s).map_err(|e| anyhow!("--interval: {e}"))?,
        None => crate::source::DEFAULT_INTERVAL,
    };
    if interval < Duration::from_millis(20) {
        bail!("--interval: at least 20ms");
    }
    let mut host_values = g.hosts.clone();
    if let Some(f) = &g.hostfile {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("--hostfile {}", f.display()))?;
        host_values.extend(hosts::parse_hostfile(&text));
    }
    let mut hosts_given = !host_values.is_empty();
    let specs = if g.demo {
        if host_values.is_empty() {
            DEMO_HOSTS
                .iter()
                .map(|h| HostSpec::Demo(h.to_string()))
                .collect()
        } else {
            let mut v = Vec::new();
            for item in host_values.iter().flat_map(|h| h.split(',')) {
                let item = item.trim();
                for name in hosts::expand(item).map_err(|e| anyhow!("--hosts: {e}"))? {
                    if !DEMO_HOSTS.contains(&name.as_str()) {
                        bail!(
                            "--demo has hosts {}; there is no {name:?}",
                            DEMO_HOSTS.join(", ")
                        );
                    }
                    v.push(HostSpec::Demo(name));
                }
            }
            v
        }
    } else {
        if host_values.is_empty() {
            host_values = config.hosts.clone();
        }
        hosts_given = !host_values.is_empty();
        if host_values.is_empty() {
            vec![HostSpec::Local]
        } else {
            hosts::parse_specs(&host_values, &config.groups).map_err(|e| anyhow!("--hosts: {e}"))?
        }
    };
    if specs.is_empty() {
        bail!("no hosts to watch");
    }
    let mut procfs = ProcfsConfig::default();
    if !g.device_globs.is_empty() {
        procfs.device_globs = g.device_globs.clone();
    } else if !config.device_globs.is_empty() {
        procfs.device_globs = config.device_globs.clone();
    }
    procfs.benign.extend(config.benign.iter().cloned());
    let connect_timeout = Duration::from_secs(
        g.connect_timeout
            .or(config.ssh.connect_timeout_s)
            .unwrap_or(10)
            .max(1),
    );
    let mut identities = g.identities.clone();
    identities.extend(config.ssh.identity_files.iter().cloned());
    let ssh = SshOptions {
        remote_command: g
            .remote_command
            .clone()
            .or(config.ssh.remote_command.clone())
            .unwrap_or_else(|| "gpusweep agent".into()),
        deploy: g.deploy || config.ssh.deploy.unwrap_or(false),
        accept_new: g.accept_new || config.ssh.accept_new.unwrap_or(false),
        max_connections: config.ssh.max_connections.unwrap_or(16),
        connect_timeout,
        identities,
        ssh_config: g.ssh_config.clone(),
        known_hosts: g.known_hosts.clone(),
    };
    let fleet = FleetOptions {
        interval,
        analyze: AnalyzeOptions {
            tolerance: config.tolerance_mib.unwrap_or(0) * MIB,
            ..Default::default()
        },
        procfs,
        load_nvml: !g.no_nvml,
        audit: AuditLog::default_location(),
        ssh,
        demo_clock: DemoClock::real(),
    };
    Ok(Settings {
        specs,
        fleet,
        config,
        connect_timeout,
        demo: g.demo,
        hosts_given,
        local: g.local || g.no_nvml,
    })
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// The first reading of every host, or its error; hosts that say nothing within the timeout get an error.
pub async fn first_snapshots(fleet: &mut Fleet, timeout: Duration) -> Vec<HostSnapshot> {
    let n = fleet.labels.len();
    let mut got: Vec<Option<HostSnapshot>> = vec![None; n];
    let deadline = tokio::time::Instant::now() + timeout;
    while got.iter().any(Option::is_none) {
        let ev = match tokio::time::timeout_at(deadline, fleet.events.recv()).await {
            Ok(Some(ev)) => ev,
            _ => break,
        };
        match ev {
            HostEvent::Snapshot { host, snap } if host < n => got[host] = Some(*snap),
            HostEvent::Status {
                host,
                status: ConnStatus::Down(e),
            } if host < n && got[host].is_none() => {
                got[host] = Some(error_snapshot(&fleet.labels[host], &e));
            }
            _ => {}
        }
    }
    got.into_iter()
        .enumerate()
        .map(|(i, s)| {
            s.unwrap_or_else(|| {
                error_snapshot(
                    &fleet.labels[i],
                    &format!("no reading within {}s", timeout.as_secs()),
                )
            })
        })
        .collect()
}

pub fn error_snapshot(host: &str, e: &str) -> HostSnapshot {
    HostSnapshot {
        host: host.to_string(),
        error: Some(e.to_string()),
        taken_at_ms: now_ms(),
        ..Default::default()
    }
}

// ---------------------------------------------------------------- snapshot

pub fn snapshot(s: &Settings, json: bool) -> anyhow::Result<i32> {
    let rt = runtime()?;
    crate::trace("main", "runtime up");
    let snaps = rt.block_on(async {
        let mut fleet = Fleet::start(&s.specs, &s.fleet)?;
        crate::trace("main", "fleet started");
        anyhow::Ok(first_snapshots(&mut fleet, s.connect_timeout).await)
    })?;
    rt.shutdown_background();
    crate::trace("main", "readings in");
    let mut out = std::io::stdout().lock();
    if json {
        let doc = serde_json::json!({ "hosts": snaps });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        for snap in &snaps {
            write!(out, "{}", render_table(snap, &s.fleet.analyze))?;
        }
    }
    Ok(if snaps.iter().all(|h| h.error.is_some()) {
        2
    } else {
        0
    })
}

fn age(snap: &HostSnapshot, started_at: Option<u64>) -> String {
    match started_at {
        Some(t) => fmt_secs((snap.taken_at_ms / 1000).saturating_sub(t)),
        None => "N/A".into(),
    }
}

/// The human table for one host.
pub fn render_table(snap: &HostSnapshot, opts: &AnalyzeOptions) -> String {
    let mut o = String::new();
    let src = format!("{:?}", snap.source).to_lowercase();
    o.push_str(&format!("== {} ({src}", snap.host));
    if let Some(d) = &snap.driver_version {
        o.push_str(&format!(", driver {d}"));
    }
    o.push_str(")\n");
    if let Some(e) = &snap.error {
        o.push_str(&format!("   ERROR: {e}\n\n"));
        return o;
    }
    if let Some(e) = &snap.gpu_error {
        o.push_str(&format!("   GPUs: {e}\n"));
    }
    if !snap.gpus.is_empty() {
        o.push_str(&format!(
            "   {:<3} {:<26} {:>22} {:>8} {:>5} {:>5} {:>6} {:>4}  {:<8} {}\n",
            "GPU",
            "NAME",
            "USED / TOTAL",
            "RESERVED",
            "UTIL",
            "TEMP",
            "POWER",
            "CC",
            "STATE",
            "LISTED"
        ));
        for g in &snap.gpus {
            let st = gpu_state(snap, g, opts);
            let listed: Vec<String> = g
                .processes
                .iter()
                .map(|p| format!("{}:{}", p.pid, fmt_bytes(p.used_bytes)))
                .collect();
            o.push_str(&format!(
                "   {:<3} {:<26} {:>22} {:>8} {:>5} {:>5} {:>6} {:>4}  {:<8} {}\n",
                g.index,
                truncate(g.name.as_deref().unwrap_or("N/A"), 26),
                format!(
                    "{} / {}",
                    fmt_bytes(g.memory.used),
                    fmt_bytes(g.memory.total)
                ),
                fmt_bytes(g.memory.reserved),
                g.utilization
                    .map(|u| format!("{u}%"))
                    .unwrap_or_else(|| "N/A".into()),
                g.temperature_c
                    .map(|t| format!("{t}C"))
                    .unwrap_or_else(|| "N/A".into()),
                g.power_mw
                    .map(|p| format!("{}W", p / 1000))
                    .unwrap_or_else(|| "N/A".into()),
                fmt_opt(g.compute_capability.as_ref()),
                format!("{} {}", st.glyph(), st.word()),
                if let Some(e) = &g.error {
                    format!("error: {e}")
                } else {
                    listed.join(" ")
                }
            ));
        }
    }
    let shown: Vec<_> = snap
        .processes
        .iter()
        .filter(|p| {
            snap.holder(p.pid).is_some()
                || p.state == 'Z'
                || snap
                    .gpus
                    .iter()
                    .any(|g| g.processes.iter().any(|l| l.pid == p.pid))
        })
        .collect();
    if !shown.is_empty() {
        o.push_str(&format!(
            "\n   {:>7} {:<10} {:<2} {:>7} {:<8} {:>10} {:>7}  {}\n",
            "PID", "USER", "S", "PPID", "GPUS", "GPU MEM", "AGE", "COMMAND"
        ));
        for p in shown {
            let h = snap.holder(p.pid);
            let charged: Option<u64> = {
                let v: Vec<u64> = snap
                    .gpus
                    .iter()
                    .flat_map(|g| g.processes.iter())
                    .filter(|l| l.pid == p.pid)
                    .filter_map(|l| l.used_bytes)
                    .collect();
                if v.is_empty() {
                    None
                } else {
                    Some(v.iter().sum())
                }
            };
            let gpus = h
                .map(|h| {
                    h.gpus
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            let mark = if h.is_some_and(|h| h.benign) {
                " (benign)"
            } else {
                ""
            };
            o.push_str(&format!(
                "   {:>7} {:<10} {:<2} {:>7} {:<8} {:>10} {:>7}  {}{}\n",
                p.pid,
                truncate(p.user.as_deref().unwrap_or("N/A"), 10),
                p.state,
                p.ppid,
                if gpus.is_empty() { "-".into() } else { gpus },
                if charged.is_some() {
                    fmt_bytes(charged)
                } else {
                    "-".into()
                },
                age(snap, p.started_at),
                truncate(&p.display_cmd(), 70),
                mark
            ));
        }
    }
    if snap.unreadable_processes > 0 {
        o.push_str(&format!(
            "   note: {} processes could not be inspected (not root)\n",
            snap.unreadable_processes
        ));
    }
    if let Some(shm) = &snap.shm {
        o.push_str(&format!(
            "\n   /dev/shm: {} used of {}, {} GPU-stack segments; SysV shmmax {} shmmni {}\n",
            fmt_bytes(shm.used),
            fmt_bytes(shm.total),
            shm.segments.len(),
            fmt_opt(shm.shmmax),
            fmt_opt(shm.shmmni)
        ));
    }
    if snap.findings.is_empty() {
        o.push_str("\n   no findings\n\n");
    } else {
        o.push_str("\n   FINDINGS\n");
        for f in &snap.findings {
            let sev = match f.severity {
                crate::model::Severity::Leak => "!",
                crate::model::Severity::Warning => "~",
                crate::model::Severity::Info => "i",
            };
            o.push_str(&format!(
                "   {sev} {:<13} {}\n       -> {}\n",
                f.kind.as_str(),
                f.detail,
                f.action
            ));
        }
        o.push('\n');
    }
    o
}

// ---------------------------------------------------------------- wait

fn scope_from(gpus: Option<&str>) -> anyhow::Result<Scope> {
    Ok(Scope {
        gpus: gpus
            .map(parse_gpu_list)
            .transpose()
            .map_err(|e| anyhow!("--gpus: {e}"))?,
    })
}

/// Watch until clean. `Ok(true)` clean, `Ok(false)` timed out; Err when no host ever answered.
async fn watch_until_clean(
    fleet: &mut Fleet,
    scope: Scope,
    tolerance: u64,
    timeout: Option<Duration>,
    started: Instant,
    connect_timeout: Duration,
    progress: bool,
) -> anyhow::Result<(bool, Watch)> {
    let mut watch = Watch::new(fleet.labels.clone(), scope, tolerance, 0);
    let deadline = timeout.map(|t| tokio::time::Instant::from_std(started) + t);
    let first_deadline = tokio::time::Instant::now() + connect_timeout;
    let mut any_reading = false;
    let mut noted: HashSet<String> = HashSet::new();
    let mut last_line = 0usize;
    loop {
        let until = match (deadline, any_reading) {
            (Some(d), true) => d,
            (Some(d), false) => d.min(first_deadline),
            (None, true) => tokio::time::Instant::now() + Duration::from_secs(3600),
            (None, false) => first_deadline,
        };
        let ev = match tokio::time::timeout_at(until, fleet.events.recv()).await {
            Ok(Some(ev)) => ev,
            Ok(None) => bail!("all collectors stopped"),
            Err(_) if !any_reading && deadline.is_none_or(|d| first_deadline < d) => {
                let why = watch.remaining().join("; ");
                bail!(
                    "no host could be read within {}s: {why}",
                    connect_timeout.as_secs()
                )
            }
            Err(_) => {
                if progress {
                    eprintln!();
                }
                return Ok((false, watch));
            }
        };
        let elapsed = started.elapsed().as_millis() as u64;
        match ev {
            HostEvent::Snapshot { snap, .. } => {
                any_reading = true;
                if judged_by_holders_only(&snap) && noted.insert(snap.host.clone()) {
                    eprintln!(
                        "gpusweep: {}: no GPU can be read ({}); judging by holders alone",
                        snap.host,
                        snap.gpu_error.as_deref().unwrap_or("no GPUs")
                    );
                }
                if watch.observe(&snap, elapsed) {
                    if progress {
                        eprint!("\r{}\r", " ".repeat(last_line));
                    }
                    return Ok((true, watch));
                }
            }
            HostEvent::Status {
                host,
                status: ConnStatus::Down(e),
            } => {
                if let Some(l) = fleet.labels.get(host) {
                    watch.hosts.insert(l.clone(), Verdict::Unknown(e));
                }
            }
            _ => {}
        }
        if progress {
            let rem = watch.remaining();
            let line = truncate(
                &format!("waiting {}: {}", fmt_ms(elapsed), rem.join("; ")),
                160,
            );
            eprint!(
                "\r{line}{}",
                " ".repeat(last_line.saturating_sub(line.chars().count()))
            );
            last_line = line.chars().count();
            let _ = std::io::stderr().flush();
        }
    }
}

pub fn wait(
    s: &Settings,
    gpus: Option<&str>,
    tolerance: Option<u64>,
    timeout: Option<&str>,
    poll: &str,
) -> anyhow::Result<i32> {
    let scope = scope_from(gpus)?;
    let timeout = timeout
        .map(parse_duration)
        .transpose()
        .map_err(|e| anyhow!("--timeout: {e}"))?;
    let poll = parse_duration(poll)
        .map_err(|e| anyhow!("--poll: {e}"))?
        .max(Duration::from_millis(20));
    let tolerance = tolerance
        .map(|t| t * MIB)
        .unwrap_or(s.fleet.analyze.tolerance);
    let mut opts = s.fleet.clone();
    opts.interval = poll;
    let rt = runtime()?;
    let started = Instant::now();
    let res = rt.block_on(async {
        let mut fleet = Fleet::start(&s.specs, &opts)?;
        watch_until_clean(
            &mut fleet,
            scope,
            tolerance,
            timeout,
            started,
            s.connect_timeout,
            std::io::stderr().is_terminal(),
        )
        .await
    });
    rt.shutdown_background();
    let (clean, watch) = res?;
    if clean {
        println!(
            "clean: every chosen GPU reads {} after {}",
            if tolerance == 0 {
                "zero".to_string()
            } else {
                format!("<= {} MiB", tolerance / MIB)
            },
            fmt_ms(started.elapsed().as_millis() as u64)
        );
        Ok(0)
    } else {
        println!(
            "timed out after {}; still held:",
            fmt_ms(started.elapsed().as_millis() as u64)
        );
        for r in watch.remaining() {
            println!("  {r}");
        }
        Ok(1)
    }
}

// ---------------------------------------------------------------- sweep / kill

fn confirm(question: &str, yes: bool) -> anyhow::Result<bool> {
    if yes {
        return Ok(true);
    }
    if !std::io::stdin().is_terminal() {
        bail!("refusing to signal without --yes: stdin is not a terminal");
    }
    eprint!("{question} [y/N] ");
    std::io::stderr().flush()?;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    Ok(matches!(line.trim(), "y" | "Y" | "yes" | "YES"))
}

/// Send one request per host and gather every outcome (hosts that never answer fail after `limit`).
async fn deliver_all(
    fleet: &mut Fleet,
    reqs: &[(usize, SignalRequest)],
    limit: Duration,
) -> Vec<(String, Outcome)> {
    let mut waiting: BTreeMap<u64, usize> = BTreeMap::new();
    for (i, (host, req)) in reqs.iter().enumerate() {
        let id = i as u64 + 1;
        waiting.insert(id, *host);
        fleet.send(
            *host,
            HostCmd::Signal {
                id,
                req: req.clone(),
            },
        );
    }
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    while !waiting.is_empty() {
        match tokio::time::timeout_at(deadline, fleet.events.recv()).await {
            Ok(Some(HostEvent::Outcomes { host, id, outcomes }))
                if waiting.remove(&id).is_some() =>
            {
                let label = fleet.labels[host].clone();
                out.extend(outcomes.into_iter().map(|o| (label.clone(), o)));
            }
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    for (id, host) in waiting {
        let label = fleet.labels[host].clone();
        if let Some((_, req)) = reqs.get(id as usize - 1) {
            for o in crate::source::agent_client::all_failed(req, "no answer from the host") {
                out.push((label.clone(), o));
            }
        }
    }
    out
}

fn print_outcomes(outs: &[(String, Outcome)]) {
    for (host, o) in outs {
        println!("  {host}: {}", o.describe());
    }
}

pub struct SweepArgs<'a> {
    pub gpus: Option<&'a str>,
    pub grace: &'a str,
    pub dry_run: bool,
    pub yes: bool,
    pub no_wait: bool,
    pub timeout: &'a str,
    pub tolerance: Option<u64>,
}

pub fn print_plan(plan: &Plan) {
    println!("plan: {}", sweep::plan_summary(plan));
    for i in &plan.items {
        println!(
            "  {:<10} {:>7}  {:<10} GPU {:<6} {:>10}  {}  [{}]",
            i.host,
            i.pid,
            truncate(i.user.as_deref().unwrap_or("N/A"), 10),
            crate::model::fmt_gpus(&i.gpus),
            fmt_bytes(i.bytes),
            truncate(&i.cmdline, 60),
            i.why
        );
    }
    for (pid, why) in &plan.skipped {
        println!("  skipped {pid}: {why}");
    }
}

pub fn sweep_cmd(s: &Settings, a: &SweepArgs) -> anyhow::Result<i32> {
    let scope = scope_from(a.gpus)?;
    let grace = parse_duration(a.grace).map_err(|e| anyhow!("--grace: {e}"))?;
    let timeout = parse_duration(a.timeout).map_err(|e| anyhow!("--timeout: {e}"))?;
    let tolerance = a
        .tolerance
        .map(|t| t * MIB)
        .unwrap_or(s.fleet.analyze.tolerance);
    let rt = runtime()?;
    let res = rt.block_on(async {
        let mut fleet = Fleet::start(&s.specs, &s.fleet)?;
        let snaps = first_snapshots(&mut fleet, s.connect_timeout).await;
        for snap in snaps.iter().filter(|s| s.error.is_some()) {
            eprintln!(
                "gpusweep: {}: {}",
                snap.host,
                snap.error.as_deref().unwrap_or("")
            );
        }
        if snaps.iter().all(|h| h.error.is_some()) {
            bail!("no host could be read");
        }
        let mut plan = Plan::default();
        for (i, snap) in snaps.iter().enumerate() {
            if snap.error.is_some() {
                continue;
            }
            let protected = if s.specs[i] == HostSpec::Local {
                sweep::protected_pids()
            } else {
                HashSet::from([0, 1])
            };
            let p = sweep::plan(snap, scope.gpus.as_deref(), &protected);
            plan.items.extend(p.items);
            plan.skipped.extend(p.skipped);
        }
        print_plan(&plan);
        if a.dry_run {
            return Ok(0);
        }
        let started = Instant::now();
        // A target refused or failed: exit 1 unless the GPUs end up clean anyway.
        let mut failed = false;
        if !plan.items.is_empty() {
            if !confirm(
                &format!(
                    "Send TERM to {} processes, KILL after {}?",
                    plan.items.len(),
                    fmt_ms(grace.as_millis() as u64)
                ),
                a.yes,
            )? {
                println!("nothing sent");
                return Ok(2);
            }
            let reqs: Vec<(usize, SignalRequest)> = plan
                .hosts()
                .iter()
                .filter_map(|h| {
                    fleet.index_of(h).map(|i| {
                        (
                            i,
                            plan.request(h, Sig::Term, Some(grace.as_millis() as u64)),
                        )
                    })
                })
                .collect();
            fleet.broadcast(HostCmd::Interval(Duration::from_millis(100)));
            let outs = deliver_all(&mut fleet, &reqs, grace + Duration::from_secs(30)).await;
            println!("signals:");
            print_outcomes(&outs);
            failed = any_failed(&outs);
        } else {
            println!("nothing to signal");
        }
        if a.no_wait {
            return Ok(if failed { 1 } else { 0 });
        }
        fleet.broadcast(HostCmd::Interval(Duration::from_millis(100)));
        let (clean, watch) = watch_until_clean(
            &mut fleet,
            scope,
            tolerance,
            Some(timeout),
            started,
            s.connect_timeout,
            std::io::stderr().is_terminal(),
        )
        .await?;
        if clean {
            println!(
                "clean: every chosen GPU reads zero, {} after the first signal",
                fmt_ms(started.elapsed().as_millis() as u64)
            );
            Ok(0)
        } else {
            println!(
                "not clean after {}; still held:",
                fmt_ms(started.elapsed().as_millis() as u64)
            );
            for r in watch.remaining() {
                println!("  {r}");
            }
            Ok(1)
        }
    });
    rt.shutdown_background();
    res
}

pub fn kill_cmd(
    s: &Settings,
    pids: &[u32],
    host: Option<&str>,
    signal: &str,
    grace: Option<&str>,
    yes: bool,
) -> anyhow::Result<i32> {
    let sig = Sig::parse(signal).map_err(|e| anyhow!("--signal: {e}"))?;
    let grace = grace
        .map(parse_duration)
        .transpose()
        .map_err(|e| anyhow!("--grace: {e}"))?;
    let labels: Vec<String> = s.specs.iter().map(HostSpec::label).collect();
    let idx = match host {
        Some(h) => labels
            .iter()
            .position(|l| l == h)
            .ok_or_else(|| anyhow!("--host {h:?} is not among {}", labels.join(", ")))?,
        None if labels.len() == 1 => 0,
        None => bail!(
            "several hosts: say which with --host ({})",
            labels.join(", ")
        ),
    };
    let rt = runtime()?;
    let res = rt.block_on(async {
        let mut fleet = Fleet::start(&s.specs[idx..=idx], &s.fleet)?;
        let snap = first_snapshots(&mut fleet, s.connect_timeout)
            .await
            .remove(0);
        if let Some(e) = &snap.error {
            bail!("{}: {e}", snap.host);
        }
        let mut targets = Vec::new();
        for &pid in pids {
            // On this host any PID can be named; elsewhere only what the agent reported.
            let found = snap
                .proc(pid)
                .map(|p| (p.start_time, p.display_cmd()))
                .or_else(|| {
                    (s.specs[idx] == HostSpec::Local)
                        .then(|| local_identity(pid))
                        .flatten()
                });
            match found {
                Some((start_time, cmdline)) => targets.push(TargetInfo {
                    pid,
                    start_time,
                    cmdline,
                }),
                None => println!("  {}: {pid}: no such process", snap.host),
            }
        }
        if targets.is_empty() {
            return Ok(1);
        }
        for t in &targets {
            println!("  {} {:>7}  {}", snap.host, t.pid, truncate(&t.cmdline, 80));
        }
        if !confirm(
            &format!("Send {} to {} process(es)?", sig.name(), targets.len()),
            yes,
        )? {
            println!("nothing sent");
            return Ok(2);
        }
        let req = SignalRequest {
            targets,
            signal: sig,
            grace_ms: grace.map(|g| g.as_millis() as u64),
        };
        let limit = grace.unwrap_or_default() + Duration::from_secs(30);
        let outs = deliver_all(&mut fleet, &[(0, req)], limit).await;
        print_outcomes(&outs);
        Ok(
            if outs.iter().all(|(_, o)| o.ok()) && outs.len() == pids.len() {
                0
            } else {
                1
            },
        )
    });
    rt.shutdown_background();
    res
}

fn local_identity(pid: u32) -> Option<(u64, String)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let p = crate::source::procfs::parse_stat(&stat)?;
    let cmd =
        crate::source::procfs::read_cmdline(std::path::Path::new(&format!("/proc/{pid}/cmdline")));
    Some((
        p.start_time,
        if cmd.is_empty() {
            format!("[{}]", p.comm)
        } else {
            cmd
        },
    ))
}

/// Whether any target's fate means it was not dealt with.
pub fn any_failed(outs: &[(String, Outcome)]) -> bool {
    outs.iter().any(|(_, o)| {
        matches!(
            o.fate,
            Fate::Refused { .. } | Fate::Failed { .. } | Fate::Survived
        )
    })
}

// ---------------------------------------------------------------- smem

pub struct SmemArgs<'a> {
    pub tile: Option<&'a str>,
    pub dtype: &'a str,
    pub stages: u64,
    pub epilogue: u64,
    pub cc: Option<&'a str>,
    pub json: bool,
}

pub fn smem_cmd(s: &Settings, a: &SmemArgs, explicit_hosts: bool) -> anyhow::Result<i32> {
    let dtype = Dtype::parse(a.dtype).ok_or_else(|| anyhow!("--dtype: unknown {:?}", a.dtype))?;
    let tile = a
        .tile
        .map(Tile::parse)
        .transpose()
        .map_err(|e| anyhow!("--tile: {e}"))?;
    if a.stages == 0 {
        bail!("--stages: at least 1");
    }
    // Which compute capabilities: --cc, else the chosen hosts' GPUs, else all.
    let mut ccs: Vec<(String, String)> = Vec::new(); // (cc, where)
    if let Some(cc) = a.cc {
        if smem::limits(cc).is_none() {
            bail!(
                "--cc {cc}: unknown compute capability (known: {})",
                smem::TABLE
                    .iter()
                    .map(|r| r.cc)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        ccs.push((cc.to_string(), String::new()));
    } else {
        let rt = runtime()?;
        let snaps = rt.block_on(async {
            let mut fleet = Fleet::start(&s.specs, &s.fleet)?;
            anyhow::Ok(first_snapshots(&mut fleet, s.connect_timeout).await)
        })?;
        rt.shutdown_background();
        let mut by: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for snap in &snaps {
            for g in &snap.gpus {
                if let Some(cc) = &g.compute_capability {
                    by.entry(cc.clone())
                        .or_default()
                        .push(format!("{}:{}", snap.host, g.index));
                }
            }
        }
        for (cc, w) in by {
            ccs.push((cc, w.join(" ")));
        }
        if ccs.is_empty() {
            if explicit_hosts || s.demo {
                eprintln!(
                    "gpusweep: no GPU compute capability could be read; showing every known one"
                );
            }
            ccs = smem::TABLE
                .iter()
                .map(|r| (r.cc.to_string(), String::new()))
                .collect();
        }
    }
    let mut rows = Vec::new();
    for (cc, at) in &ccs {
        let Some(l) = smem::limits(cc) else {
            rows.push(
                serde_json::json!({"cc": cc, "gpus": at, "error": "unknown compute capability"}),
            );
            continue;
        };
        let fit = tile.map(|t| smem::fit(l, t, dtype, a.stages, a.epilogue));
        rows.push(serde_json::json!({"cc": cc, "gpus": at, "limits": l, "fit": fit}));
        if !a.json {
            println!(
                "CC {:<5} {:<34} per SM {:>7} B  per block {:>7} B (opt-in), {} B default  regs/SM {}{}",
                l.cc,
                l.family,
                smem::group(l.per_sm as u64),
                smem::group(l.per_block_optin as u64),
                smem::group(l.per_block_default as u64),
                l.registers_per_sm,
                if at.is_empty() {
                    String::new()
                } else {
                    format!("  [{at}]")
                }
            );
            if let Some(f) = &fit {
                println!(
                    "    tile {} {}: {}",
                    a.tile.unwrap_or(""),
                    dtype.name(),
                    f.sentence()
                );
            }
        }
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "dtype": dtype.name(), "stages": a.stages, "epilogue": a.epilogue, "rows": rows })
            )?
        );
    }
    Ok(0)
}

// ---------------------------------------------------------------- agent

pub fn agent_cmd(s: &Settings, demo_host: &str) -> anyhow::Result<i32> {
    let src: Box<dyn crate::source::Source> = if s.demo {
        Box::new(crate::source::demo::DemoHost::new(
            demo_host,
            s.fleet.demo_clock.clone(),
        ))
    } else {
        Box::new(crate::source::LocalSource::new(
            hosts::local_hostname(),
            s.fleet.procfs.clone(),
            s.fleet.audit.clone(),
            s.fleet.load_nvml,
        )?)
    };
    Ok(crate::agent::serve(src, s.fleet.interval))
}
