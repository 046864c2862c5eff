//! The process panel's rows: holders, listed processes, ghosts and zombies, with their marks; filtered,
//! sorted, or as a tree. Built once per reading, not per frame.

use std::collections::{HashMap, HashSet};

use crate::core::model::{HostSnapshot, Mark, ProcState};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    Memory,
    Pid,
    Age,
    User,
}

impl SortKey {
    pub fn name(self) -> &'static str {
        match self {
            SortKey::Memory => "memory",
            SortKey::Pid => "pid",
            SortKey::Age => "age",
            SortKey::User => "user",
        }
    }
    #[must_use]
    pub fn next(self) -> SortKey {
        match self {
            SortKey::Memory => SortKey::Pid,
            SortKey::Pid => SortKey::Age,
            SortKey::Age => SortKey::User,
            SortKey::User => SortKey::Memory,
        }
    }
}

/// How the process panel shows rows.
#[derive(Debug, Clone)]
pub struct ProcView {
    pub tree: bool,
    pub filter: String,
    pub sort: SortKey,
}

/// One row of the process panel.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcRow {
    pub pid: u32,
    pub user: String,
    /// `None` for a ghost (no process behind the PID).
    pub state: Option<ProcState>,
    pub ppid: Option<u32>,
    pub gpus: Vec<u32>,
    pub bytes: Option<u64>,
    pub started_at: Option<u64>,
    pub cmd: String,
    /// The job its cgroup names, short (`slurm:4711.0`), or empty.
    pub job: String,
    pub marks: Vec<Mark>,
    pub depth: usize,
    pub start_time: Option<u64>,
    /// A dead PID: shown, never signalled.
    pub ghost: bool,
}

fn marks_for(s: &HostSnapshot, pid: u32) -> Vec<Mark> {
    let mut m = Vec::new();
    for f in s.findings.iter().filter(|f| f.pid == Some(pid)) {
        if let Some(t) = Mark::of(f.kind)
            && !m.contains(&t)
        {
            m.push(t);
        }
    }
    if s.holder(pid).is_some_and(|h| h.benign) {
        m.push(Mark::Benign);
    }
    m
}

/// Live processes worth a row (all of them in tree mode, for the ancestry).
fn live_rows(s: &HostSnapshot, tree: bool) -> Vec<ProcRow> {
    let mut rows = Vec::new();
    for p in &s.processes {
        let listed = s.listed_gpus(p.pid);
        let relevant = s.holder(p.pid).is_some() || p.state.is_zombie() || !listed.is_empty();
        if !tree && !relevant {
            continue;
        }
        let mut gpus = s.holder(p.pid).map(|h| h.gpus.clone()).unwrap_or_default();
        for g in listed {
            if !gpus.contains(&g) {
                gpus.push(g);
            }
        }
        gpus.sort_unstable();
        rows.push(ProcRow {
            pid: p.pid,
            user: p.user.clone().unwrap_or_else(|| "N/A".into()),
            state: Some(p.state),
            ppid: Some(p.ppid),
            gpus,
            bytes: s.charged(p.pid),
            started_at: p.started_at,
            cmd: crate::core::format::brief_cmd(&p.display_cmd()),
            job: p
                .job
                .as_ref()
                .map(crate::core::job::Job::short)
                .unwrap_or_default(),
            marks: marks_for(s, p.pid),
            depth: 0,
            start_time: Some(p.start_time),
            ghost: false,
        });
    }
    rows
}

/// Ghosts: listed PIDs with no process behind them.
fn ghost_rows(s: &HostSnapshot, rows: &mut Vec<ProcRow>) {
    for g in &s.gpus {
        for lp in &g.processes {
            if s.proc(lp.pid).is_none() && !rows.iter().any(|r| r.pid == lp.pid) {
                rows.push(ProcRow {
                    pid: lp.pid,
                    user: "?".into(),
                    state: None,
                    ppid: None,
                    gpus: s.listed_gpus(lp.pid),
                    bytes: s.charged(lp.pid),
                    started_at: None,
                    cmd: "(gone: NVML still charges it)".into(),
                    job: String::new(),
                    marks: marks_for(s, lp.pid),
                    depth: 0,
                    start_time: None,
                    ghost: true,
                });
            }
        }
    }
}

pub fn build_rows(s: &HostSnapshot, view: &ProcView) -> Vec<ProcRow> {
    let mut rows = live_rows(s, view.tree);
    ghost_rows(s, &mut rows);
    if !view.filter.is_empty() {
        let f = view.filter.to_lowercase();
        rows.retain(|r| {
            r.cmd.to_lowercase().contains(&f)
                || r.user.to_lowercase().contains(&f)
                || r.pid.to_string().contains(&f)
                || r.job.to_lowercase().contains(&f)
                || r.marks.iter().any(|m| m.as_str().contains(&f))
        });
    }
    match view.sort {
        SortKey::Memory => rows.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.pid.cmp(&b.pid))),
        SortKey::Pid => rows.sort_by_key(|r| r.pid),
        SortKey::Age => {
            rows.sort_by(|a, b| a.started_at.cmp(&b.started_at).then(a.pid.cmp(&b.pid)));
        }
        SortKey::User => rows.sort_by(|a, b| a.user.cmp(&b.user).then(a.pid.cmp(&b.pid))),
    }
    if view.tree {
        rows = as_tree(&rows);
    }
    rows
}

/// Depth-first order from the roots (rows whose parent is not shown), children under their parent.
fn as_tree(rows: &[ProcRow]) -> Vec<ProcRow> {
    let pids: HashSet<u32> = rows.iter().map(|r| r.pid).collect();
    let mut children: HashMap<u32, Vec<usize>> = HashMap::new();
    let mut roots = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        match r.ppid {
            Some(pp) if pids.contains(&pp) && pp != r.pid => {
                children.entry(pp).or_default().push(i);
            }
            _ => roots.push(i),
        }
    }
    let mut out = Vec::with_capacity(rows.len());
    let mut stack: Vec<(usize, usize)> = roots.into_iter().rev().map(|i| (i, 0)).collect();
    let mut seen = HashSet::new();
    while let Some((i, depth)) = stack.pop() {
        if !seen.insert(i) {
            continue;
        }
        let mut r = rows[i].clone();
        r.depth = depth;
        if let Some(kids) = children.get(&r.pid) {
            for &k in kids.iter().rev() {
                stack.push((k, depth + 1));
            }
        }
        out.push(r);
    }
    out
}
