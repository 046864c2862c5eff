//! A finding opened with Enter: its whole text, and the evidence behind it from the host's latest reading —
//! the process it names (state, user, start, ppid chain up to PID 1, cgroup, the device files it has
//! open, what NVML charges it, how long it has held memory), the GPU, and the blind spots that limit it.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph, Wrap};

use super::super::fg;
use crate::core::format::{escape, fmt_bytes, fmt_gpus, fmt_secs, truncate};
use crate::core::model::{Finding, HostId, HostSnapshot, Severity};
use crate::tui::app::{App, HostView};

fn ago(app: &App, unix_ms: u64) -> String {
    fmt_secs(app.view.now_ms.saturating_sub(unix_ms) / 1000)
}

/// `7306 python3 → 7300 bash → 1 systemd`, as far as the reading knows the ancestry.
fn chain(s: &HostSnapshot, pid: u32) -> String {
    let mut parts = Vec::new();
    let mut cur = pid;
    for _ in 0..32 {
        let Some(p) = s.proc(cur) else {
            parts.push(format!("{cur} (not in the reading)"));
            break;
        };
        parts.push(format!("{} {}", p.pid, escape(&p.comm)));
        if p.pid <= 1 {
            break;
        }
        cur = p.ppid;
    }
    parts.join(" → ")
}

fn process_lines(
    app: &App,
    h: &HostView,
    s: &HostSnapshot,
    pid: u32,
    role: &str,
) -> Vec<Line<'static>> {
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let mut out = vec![Line::from(Span::styled(format!(" {role} {pid}"), bold))];
    let charged = s.charged(pid);
    let listed = s.listed_gpus(pid);
    let Some(p) = s.proc(pid) else {
        out.push(Line::from(format!(
            "   not in /proc: gone{}",
            if listed.is_empty() {
                String::new()
            } else {
                format!(
                    "; NVML still lists it on GPU {} with {}",
                    fmt_gpus(&listed),
                    fmt_bytes(charged)
                )
            }
        )));
        return out;
    };
    let started = p.started_at.map_or_else(
        || "start N/A".into(),
        |t| format!("started {} ago", ago(app, t.saturating_mul(1000))),
    );
    out.push(Line::from(format!(
        "   state {}  user {}  {started}  (start time {} ticks)",
        p.state,
        escape(p.user.as_deref().unwrap_or("N/A")),
        p.start_time
    )));
    out.push(Line::from(format!("   command {}", p.display_cmd())));
    out.push(Line::from(format!("   parents {}", chain(s, pid))));
    if let Some(ns) = p.ns_pid {
        out.push(Line::from(format!("   pid {ns} in its own PID namespace")));
    }
    out.push(Line::from(format!(
        "   cgroup  {}",
        p.cgroup.as_deref().map_or("N/A".into(), escape)
    )));
    match s.holder(pid) {
        Some(x) => out.push(Line::from(format!(
            "   open    {} ({} fd{}){}",
            x.devices
                .iter()
                .map(|d| escape(d))
                .collect::<Vec<_>>()
                .join(", "),
            x.fd_count,
            if x.fd_count == 1 { "" } else { "s" },
            if x.benign {
                "; benign (holds no memory)"
            } else {
                ""
            }
        ))),
        None if p.fds_unreadable => {
            out.push(Line::from(
                "   open    N/A: its fds could not be read (permissions)",
            ));
        }
        None => out.push(Line::from("   open    no GPU device file")),
    }
    out.push(Line::from(if listed.is_empty() {
        "   NVML    not listed on any GPU".to_string()
    } else {
        format!(
            "   NVML    charges {} on GPU {}",
            fmt_bytes(charged),
            fmt_gpus(&listed)
        )
    }));
    if let Some(t) = h.held_since.get(&(pid, p.start_time)) {
        out.push(Line::from(format!(
            "   held    for at least {} (seen holding since then)",
            ago(app, *t)
        )));
    }
    out
}

/// What the reading shows behind a finding: its GPU, the processes it names, the file, the blind spots.
fn evidence(app: &App, h: &HostView, s: &HostSnapshot, fd: &Finding) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    if let Some(g) = fd.gpu.and_then(|i| s.gpu(i)) {
        lines.push(Line::from(format!(
            " GPU {}  {}  used {} of {}{}",
            g.index,
            escape(g.name.as_deref().unwrap_or("N/A")),
            fmt_bytes(g.memory.used),
            fmt_bytes(g.memory.total),
            g.processes.iter().fold(String::new(), |mut acc, l| {
                acc.push_str(&format!("; {} charged {}", l.pid, fmt_bytes(l.used_bytes)));
                acc
            })
        )));
    }
    let mut pids: Vec<(u32, &str)> = Vec::new();
    if let Some(p) = fd.pid {
        pids.push((p, "process"));
    }
    if let Some(t) = fd.target_pid.filter(|t| Some(*t) != fd.pid) {
        pids.push((t, "acts on"));
    }
    for (pid, role) in pids {
        lines.extend(process_lines(app, h, s, pid, role));
    }
    // The finding names its file: the same name, and the same inode where both are known.
    let file = fd.file.as_ref();
    if let Some((info, seg)) = s.shm.iter().find_map(|i| {
        let seg = i.segments.iter().find(|g| {
            file.is_some_and(|f| f.name == g.name && (f.ino.is_none() || f.ino == g.ino))
        })?;
        Some((i, seg))
    }) {
        lines.push(Line::from(format!(
            " file {}  {}  {}  inode {}",
            escape(&info.path_of(&seg.name)),
            fmt_bytes(Some(seg.bytes)),
            seg.age_s.map_or("age N/A".into(), |a| format!(
                "modified {} ago",
                fmt_secs(a)
            )),
            seg.ino.map_or("N/A".into(), |i| i.to_string())
        )));
        lines.push(Line::from(
            " D removes it (re-checked and logged) where removals are on",
        ));
    }
    let mut blind = Vec::new();
    if s.unreadable_processes > 0 {
        blind.push(format!(
            "{} processes' fds could not be read",
            s.unreadable_processes
        ));
    }
    if s.in_child_pid_namespace {
        blind.push("read from inside a container: host PIDs may be invisible".into());
    }
    blind.extend(
        s.missing_features
            .iter()
            .map(|m| format!("no {}", m.describe())),
    );
    if !blind.is_empty() {
        lines.push(Line::default());
        lines.push(Line::from(Span::styled(
            format!(" blind spots: {}", blind.join("; ")),
            fg(app, Color::DarkGray),
        )));
    }
    lines
}

pub fn render(app: &App, f: &mut Frame, host: HostId, fd: &Finding) {
    let area = f.area();
    let Some(h) = app.store.hosts.get(host.0) else {
        return;
    };
    let w = area.width.min(110);
    let inner_w = w.saturating_sub(2) as usize;
    let (sev, st) = match fd.severity {
        Severity::Leak => ("leak", fg(app, Color::Red).add_modifier(Modifier::BOLD)),
        Severity::Warning => ("warning", fg(app, Color::Yellow)),
        Severity::Info => ("info", fg(app, Color::Blue)),
    };
    let mut lines = vec![
        Line::from(Span::styled(format!(" {}", escape(&fd.detail)), st)),
        Line::from(Span::styled(
            format!(" → {}", escape(&fd.action)),
            Style::default().add_modifier(Modifier::ITALIC),
        )),
        Line::default(),
    ];
    match &h.snap {
        Some(s) => lines.extend(evidence(app, h, s, fd)),
        None => lines.push(Line::from(" no reading of this host now")),
    }
    lines.push(Line::default());
    lines.push(Line::from(Span::styled(
        if app.cfg.readonly {
            " any key closes"
        } else {
            " K kill what it names   any key closes"
        },
        fg(app, Color::DarkGray),
    )));
    // Rows once wrapped, for the box's height.
    let rows: usize = lines
        .iter()
        .map(|l| l.width().div_ceil(inner_w.max(1)).max(1))
        .sum();
    let hgt = (u16::try_from(rows).unwrap_or(u16::MAX).saturating_add(2)).min(area.height);
    let r = Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - hgt) / 2,
        width: w,
        height: hgt,
    };
    let title = format!(
        " {} ({sev}) on {}{} ",
        fd.kind.as_str(),
        truncate(&h.label, 30),
        if app.cfg.demo || h.simulated {
            " — DEMO: simulated"
        } else {
            ""
        }
    );
    f.render_widget(Clear, r);
    f.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(Block::bordered().title(title).border_style(st)),
        r,
    );
}
