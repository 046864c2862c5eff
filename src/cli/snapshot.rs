//! `gpusweep snapshot`: one reading of every host, as a table or as the JSON contract.

use std::fmt::Write as _;
use std::io::Write;

use super::common::{first_snapshots_each, runtime};
use crate::core::format::{escape, fmt_bytes, fmt_gpus, fmt_opt, fmt_secs, truncate};
use crate::core::model::GpuState;
use crate::core::model::{Gpu, HostSnapshot, Severity};
use crate::core::trace;
use crate::runtime::{Fleet, Settings};

#[derive(Debug, clap::Args)]
pub struct SnapshotArgs {
    /// The documented JSON contract instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Leave temperature and power unread on this host, and utilization where a process is listed (N/A, and
    /// `gauges` in `missing_features`; clean means idle, so a GPU with nothing listed has it read): the
    /// verdict alone, a few ms per GPU sooner when no serve runs here.
    #[arg(long)]
    pub no_gauges: bool,
}

pub fn run(s: &Settings, a: &SnapshotArgs) -> anyhow::Result<i32> {
    let json = a.json;
    let mut opts = s.fleet_via_serve();
    opts.gauges = !a.no_gauges;
    crate::runtime::load_local_early(&s.specs, &opts);
    let rt = runtime()?;
    trace("main", "runtime up");
    // A table is printed host by host as each answers (one that hangs holds back only itself, until its
    // deadline); the JSON document once every host answered or timed out.
    let mut printed: std::io::Result<()> = Ok(());
    let snaps = rt.block_on(async {
        let mut fleet = Fleet::start(&s.specs, &opts).await?;
        trace("main", "fleet started");
        let each = |snap: &HostSnapshot| {
            if !json && printed.is_ok() {
                printed = write!(std::io::stdout().lock(), "{}", render_table(snap));
            }
        };
        anyhow::Ok(first_snapshots_each(&mut fleet, s.connect_timeout, each).await)
    })?;
    rt.shutdown_background();
    trace("main", "readings in");
    printed?;
    // A host that could not be read, or whose GPUs could not (no driver, NVML failing: unless --no-nvml
    // asks for holders alone), is an error, said on stderr: never a reading to take as whole.
    let unread: Vec<String> = snaps
        .iter()
        .filter_map(|h| crate::analyze::node::unusable(h, s.fleet.load_nvml))
        .collect();
    for why in &unread {
        eprintln!("gpusweep: {why}");
    }
    let code = if unread.is_empty() { 0 } else { 2 };
    if json {
        write_json(
            &mut std::io::BufWriter::new(std::io::stdout().lock()),
            snaps,
        )?;
    }
    Ok(code)
}

/// The JSON contract, `{"hosts": [...]}`, written host by host and each let go once written: the whole
/// document was built as one value first (its tree several times the readings), then as one string. The text
/// is the same as before, key for key.
pub fn write_json(w: &mut dyn Write, snaps: Vec<HostSnapshot>) -> anyhow::Result<()> {
    if snaps.is_empty() {
        writeln!(w, "{{\n  \"hosts\": []\n}}")?;
        return Ok(());
    }
    w.write_all(b"{\n  \"hosts\": [\n")?;
    let n = snaps.len();
    for (i, snap) in snaps.into_iter().enumerate() {
        let text = serde_json::to_string_pretty(&serde_json::to_value(&snap)?)?;
        drop(snap);
        for (k, line) in text.lines().enumerate() {
            if k > 0 {
                w.write_all(b"\n")?;
            }
            w.write_all(b"    ")?;
            w.write_all(line.as_bytes())?;
        }
        w.write_all(if i + 1 < n { b",\n" } else { b"\n" })?;
    }
    w.write_all(b"  ]\n}\n")?;
    w.flush()?;
    Ok(())
}

fn age(snap: &HostSnapshot, started_at: Option<u64>) -> String {
    match started_at {
        Some(t) => fmt_secs((snap.taken_at_ms / 1000).saturating_sub(t)),
        None => "N/A".into(),
    }
}

/// The human table for one host.
pub fn render_table(snap: &HostSnapshot) -> String {
    let mut o = String::new();
    if let Some(e) = &snap.error {
        let _ = write!(o, "== {}\n   ERROR: {}\n\n", escape(&snap.host), escape(e));
        return o;
    }
    let src = format!("{:?}", snap.source).to_lowercase();
    let _ = write!(o, "== {} ({src}", escape(&snap.host));
    // A simulated host read through an agent, a serve or Prometheus says so as the demo itself does.
    if snap.simulated && src != "demo" {
        o.push_str(", DEMO: simulated");
    }
    if let Some(d) = &snap.driver_version {
        let _ = write!(o, ", driver {}", escape(d));
    }
    o.push_str(")\n");
    if let Some(e) = &snap.gpu_error {
        let _ = writeln!(o, "   GPUs: {}", escape(e));
    }
    gpu_table(&mut o, snap);
    process_table(&mut o, snap);
    job_table(&mut o, snap);
    notes(&mut o, snap);
    findings(&mut o, snap);
    o
}

fn gpu_table(o: &mut String, snap: &HostSnapshot) {
    if snap.gpus.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "   {:<3} {:<26} {:>22} {:>8} {:>5} {:>5} {:>6} {:>4}  {:<8} LISTED",
        "GPU", "NAME", "USED / TOTAL", "RESERVED", "UTIL", "TEMP", "POWER", "CC", "STATE"
    );
    for g in &snap.gpus {
        let st = g.state.unwrap_or(GpuState::Unknown);
        let _ = writeln!(
            o,
            "   {:<3} {:<26} {:>22} {:>8} {:>5} {:>5} {:>6} {:>4}  {:<8} {}",
            g.index,
            truncate(&escape(g.name.as_deref().unwrap_or("N/A")), 26),
            format!(
                "{} / {}",
                fmt_bytes(g.memory.used),
                fmt_bytes(g.memory.total)
            ),
            fmt_bytes(g.memory.reserved),
            g.utilization
                .map_or_else(|| "N/A".into(), |u| format!("{u}%")),
            g.temperature_c
                .map_or_else(|| "N/A".into(), |t| format!("{t}C")),
            g.power_mw
                .map_or_else(|| "N/A".into(), |p| format!("{}W", p / 1000)),
            fmt_opt(g.compute_capability.as_ref()),
            format!("{} {}", st.glyph(), st.word()),
            listed(g)
        );
        mig_rows(o, g);
    }
    // Where a reset may be the way out (a leak) or the driver asks for one: who would make it fail.
    for g in &snap.gpus {
        let asks = g.recovery_action.as_deref().is_some_and(|a| a != "none");
        if g.state == Some(GpuState::Leak) || asks {
            let _ = writeln!(o, "   {}", crate::analyze::reset::plan(snap, g));
        }
    }
}

/// A MIG GPU's instances, one row each under it; or why they could not be read.
fn mig_rows(o: &mut String, g: &Gpu) {
    if let Some(e) = &g.mig_error {
        let _ = writeln!(o, "       MIG instances unread: {}", escape(e));
    }
    for i in &g.mig {
        let st = i.state.unwrap_or(GpuState::Unknown);
        let procs: Vec<String> = i
            .processes
            .iter()
            .map(|p| format!("{}:{}", p.pid, fmt_bytes(p.used_bytes)))
            .collect();
        let _ = writeln!(
            o,
            "       {:<26} {:>22} {:>34}  {:<8} {}",
            truncate(&escape(&i.label()), 26),
            format!(
                "{} / {}",
                fmt_bytes(i.memory.used),
                fmt_bytes(i.memory.total)
            ),
            "",
            format!("{} {}", st.glyph(), st.word()),
            i.error
                .as_deref()
                .map_or_else(|| procs.join(" "), |e| format!("error: {}", escape(e)))
        );
    }
}

fn listed(g: &Gpu) -> String {
    if let Some(e) = &g.error {
        return format!("error: {e}");
    }
    g.processes
        .iter()
        .map(|p| format!("{}:{}", p.pid, fmt_bytes(p.used_bytes)))
        .collect::<Vec<_>>()
        .join(" ")
}

fn process_table(o: &mut String, snap: &HostSnapshot) {
    let shown: Vec<_> = snap
        .processes
        .iter()
        .filter(|p| {
            snap.holder(p.pid).is_some()
                || p.state.is_zombie()
                || !snap.listed_gpus(p.pid).is_empty()
        })
        .collect();
    if shown.is_empty() {
        return;
    }
    let _ = write!(
        o,
        "\n   {:>7} {:<10} {:<2} {:>7} {:<8} {:>10} {:>7} {:<14}  COMMAND\n",
        "PID", "USER", "S", "PPID", "GPUS", "GPU MEM", "AGE", "JOB"
    );
    for p in shown {
        let h = snap.holder(p.pid);
        let charged = snap.charged(p.pid);
        let mark = if h.is_some_and(|h| h.benign) {
            " (benign)"
        } else {
            ""
        };
        let _ = writeln!(
            o,
            "   {:>7} {:<10} {:<2} {:>7} {:<8} {:>10} {:>7} {:<14}  {}{}",
            p.pid,
            truncate(&escape(p.user.as_deref().unwrap_or("N/A")), 10),
            p.state,
            p.ppid,
            h.map_or_else(|| "-".into(), |h| fmt_gpus(&h.gpus)),
            if charged.is_some() {
                fmt_bytes(charged)
            } else {
                "-".into()
            },
            age(snap, p.started_at),
            p.job
                .as_ref()
                .map_or_else(|| "-".into(), |j| truncate(&escape(&j.short()), 14)),
            truncate(&p.display_cmd(), 70),
            mark
        );
    }
}

/// Each job: its id, ranks and GPUs, and its phase in words; its launcher's command below.
fn job_table(o: &mut String, snap: &HostSnapshot) {
    if snap.jobs.is_empty() {
        return;
    }
    o.push_str("\n   JOBS\n");
    for j in &snap.jobs {
        let helpers = if j.helpers.is_empty() {
            String::new()
        } else {
            format!(" and {} helper(s)", j.helpers.len())
        };
        let _ = writeln!(
            o,
            "   {:<22} {} rank(s){helpers} on GPU {:<8} {}{}",
            truncate(&escape(&j.id), 22),
            j.ranks.len(),
            fmt_gpus(&j.gpus),
            crate::core::format::phase_line(snap, j),
            if j.kept { " (kept on purpose)" } else { "" }
        );
        let gone = j.launcher_gone_ms.map_or_else(String::new, |t| {
            format!(
                " (its launcher is gone since {})",
                crate::core::format::fmt_clock(t)
            )
        });
        let _ = writeln!(o, "       {}{gone}", truncate(&j.name, 100));
    }
}

fn notes(o: &mut String, snap: &HostSnapshot) {
    if snap.unreadable_processes > 0 {
        let _ = writeln!(
            o,
            "   note: {} processes could not be inspected (not root)",
            snap.unreadable_processes
        );
    }
    if let Some(why) = snap.shm.as_ref().and_then(|s| s.pods_unread.as_deref()) {
        let _ = writeln!(o, "   note: {}", escape(why));
    }
    if let Some(shm) = &snap.shm {
        let _ = write!(
            o,
            "\n   /dev/shm: {} used of {}, {} GPU-stack segments; SysV shmmax {} shmmni {}\n",
            fmt_bytes(shm.used),
            fmt_bytes(shm.total),
            shm.segments.len(),
            crate::core::format::fmt_limit(shm.shmmax, shm.shmmax_unlimited),
            fmt_opt(shm.shmmni)
        );
    }
}

fn findings(o: &mut String, snap: &HostSnapshot) {
    if snap.findings.is_empty() {
        o.push_str("\n   no findings\n\n");
        return;
    }
    o.push_str("\n   FINDINGS\n");
    for f in &snap.findings {
        let sev = match f.severity {
            Severity::Leak => "!",
            Severity::Warning => "~",
            Severity::Info => "i",
        };
        let _ = write!(
            o,
            "   {sev} {:<13} {}\n       -> {}\n",
            f.kind.as_str(),
            escape(&f.detail),
            escape(&f.action)
        );
    }
    o.push('\n');
}
