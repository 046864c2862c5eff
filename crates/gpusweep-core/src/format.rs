//! Formatting for people: bytes, GPU lists, durations, truncation, and escaping of untrusted text.
//! Views cut text to fit; the model never holds cut text.

use super::model::{GpuState, MIB};

impl GpuState {
    pub fn glyph(self) -> &'static str {
        match self {
            GpuState::Clean => "✓",
            GpuState::InUse => "●",
            GpuState::Leak => "!",
            GpuState::Unknown => "?",
            GpuState::Error => "✗",
            GpuState::NeedsReset => "‼",
        }
    }
    pub fn word(self) -> &'static str {
        match self {
            GpuState::Clean => "clean",
            GpuState::InUse => "in use",
            GpuState::Leak => "leak",
            GpuState::Unknown => "N/A",
            GpuState::Error => "error",
            GpuState::NeedsReset => "reset",
        }
    }
}

/// Format bytes as MiB/GiB for people; `None` is "N/A".
pub fn fmt_bytes(b: Option<u64>) -> String {
    match b {
        None => "N/A".into(),
        #[allow(clippy::cast_precision_loss)] // display only: a tenth of a GiB is all that is shown
        Some(b) if b >= 10 * 1024 * MIB => format!("{:.1} GiB", b as f64 / (1024.0 * MIB as f64)),
        Some(b) => format!("{} MiB", b / MIB),
    }
}

/// GPU indices for a table: ranges (`0-7`, `0,2,4-6`), `-` for none.
pub fn fmt_gpus(gpus: &[u32]) -> String {
    fmt_gpu_ranges(gpus)
}

/// GPU indices as ranges: `0-7`, `0,2,4-6`, or `-` for none.
pub fn fmt_gpu_ranges(gpus: &[u32]) -> String {
    let mut v = gpus.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        parts.push(match j - i {
            0 => v[i].to_string(),
            1 => format!("{},{}", v[i], v[j]),
            _ => format!("{}-{}", v[i], v[j]),
        });
        i = j + 1;
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(",")
    }
}

/// A value, or "N/A" when it could not be read.
pub fn fmt_opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "N/A".into(), |v| v.to_string())
}

/// A kernel limit: its number, "unlimited", or "N/A" when unread.
pub fn fmt_limit(v: Option<u64>, unlimited: bool) -> String {
    if unlimited {
        "unlimited".into()
    } else {
        fmt_opt(v)
    }
}

/// 75 -> "1m15s", 4000 -> "1h06m".
pub fn fmt_secs(s: u64) -> String {
    if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else if s < 86400 {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else {
        format!("{}d{:02}h", s / 86400, (s % 86400) / 3600)
    }
}

/// Milliseconds for people: "850 ms", "2.3 s".
pub fn fmt_ms(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        #[allow(clippy::cast_precision_loss)] // display only
        let s = ms as f64 / 1000.0;
        format!("{s:.1} s")
    }
}

/// A span for people: "850 ms", "12.3 s" under a minute, then "4m12s", "1h06m".
pub fn fmt_span(ms: u64) -> String {
    if ms < 60_000 {
        fmt_ms(ms)
    } else {
        fmt_secs(ms / 1000)
    }
}

/// `HH:MM:SS.mmm` of a Unix time in milliseconds, UTC.
pub fn fmt_clock_ms(ms: u64) -> String {
    let day = ms % 86_400_000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        day / 3_600_000,
        day / 60_000 % 60,
        day / 1000 % 60,
        day % 1000
    )
}

/// `HH:MM:SS UTC` of a Unix time in milliseconds.
pub fn fmt_clock(ms: u64) -> String {
    let day = ms % 86_400_000;
    format!(
        "{:02}:{:02}:{:02} UTC",
        day / 3_600_000,
        day / 60_000 % 60,
        day / 1000 % 60
    )
}

/// A duration's milliseconds, saturating (a `Duration` can hold more than `u64` milliseconds).
pub fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub use super::escape::{escape, shell_quote};

/// A command line as a narrow column should show it: each absolute path (the interpreter's, the script's, a
/// `--flag=/path`'s) by its last component, so what tells ranks apart (the script, `--local_rank 5`,
/// `TP5`) comes before the cut. `/opt/conda/bin/python3.12 -u /srv/launch.py --rank 5` reads
/// `python3.12 -u launch.py --rank 5`. For showing only: records keep the whole line.
pub fn brief_cmd(cmd: &str) -> String {
    let brief = |w: &str| -> String {
        let (key, value) = match w.split_once('=') {
            Some((k, v)) if k.starts_with('-') => (Some(k), v),
            _ => (None, w),
        };
        let value = if value.starts_with('/') && value.len() > 1 {
            value
                .trim_end_matches('/')
                .rsplit('/')
                .next()
                .filter(|b| !b.is_empty())
                .unwrap_or(value)
        } else {
            value
        };
        key.map_or_else(|| value.to_string(), |k| format!("{k}={value}"))
    };
    cmd.split(' ').map(brief).collect::<Vec<_>>().join(" ")
}

/// Cut `s` to at most `max` bytes of UTF-8, never inside a character, with `...` when cut (a reader that
/// counts bytes, as node-problem-detector does, never cuts it again).
pub fn truncate_bytes(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let room = max.saturating_sub(3);
    let mut end = room;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let mut t = s[..end].to_string();
    t.push_str(&"..."[..max.min(3)]);
    t
}

/// Cut `s` to at most `max` characters, with an ellipsis when cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else if max == 0 {
        String::new()
    } else {
        let mut t: String = s.chars().take(max - 1).collect();
        t.push('…');
        t
    }
}

/// A job's phase in words, a display sentence (it lived in `core::job`, which then imported this module
/// while the model imported the job).
/// "loading 412 GiB of 1120 GiB on 8 GPUs, 2m10s", "settled at 1120 GiB after a 4m12s warm-up".
pub fn phase_line(snap: &super::model::HostSnapshot, j: &super::job::JobReport) -> String {
    use super::job::Phase;
    let total: Option<u64> = j
        .gpus
        .iter()
        .map(|g| snap.gpu(*g).and_then(|g| g.memory.total))
        .sum();
    let n = j.gpus.len();
    let since_start = fmt_span(snap.taken_at_ms.saturating_sub(j.started_ms));
    match j.phase {
        Phase::Starting => format!(
            "starting: {} rank(s), no GPU memory charged yet",
            j.ranks.len()
        ),
        Phase::Loading => format!(
            "loading {} of {} on {n} GPU(s), {since_start}",
            fmt_bytes(j.bytes),
            fmt_bytes(total)
        ),
        Phase::Holding => format!(
            "holding {} on {n} GPU(s) (not seen rising)",
            fmt_bytes(j.bytes)
        ),
        Phase::Settled => match j.warmup_ms {
            Some(w) => format!(
                "settled at {} after a {} warm-up",
                fmt_bytes(j.settled_bytes),
                fmt_span(w)
            ),
            None => format!("settled at {}", fmt_bytes(j.settled_bytes)),
        },
        Phase::LostRank => format!(
            "lost a rank: {}",
            j.lost
                .iter()
                .map(|l| format!(
                    "{} on GPU {} {}",
                    l.pid,
                    fmt_gpus(&l.gpus),
                    l.how.describe()
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Phase::Hung => {
            let waits = if j.waiting_on.is_empty() {
                String::new()
            } else {
                format!(
                    "; waiting on {}",
                    j.waiting_on
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            format!(
                "hung: {}{waits}",
                j.phase_why
                    .as_deref()
                    .unwrap_or("its GPUs spin without work")
            )
        }
        Phase::Unknown => match &j.phase_why {
            Some(why) => format!(
                "{} rank(s) on GPU {}; {why}",
                j.ranks.len(),
                fmt_gpus(&j.gpus)
            ),
            None => format!(
                "{} rank(s) on GPU {}; its memory cannot be read",
                j.ranks.len(),
                fmt_gpus(&j.gpus)
            ),
        },
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_line_cut_to_bytes_is_never_longer_nor_broken() {
        let s = "gpu-node-7: GPU 0: 2048 MiB held by 4242 (k8s:3f2a9c1e) — résidu ünter ✓✓✓";
        for max in [0, 1, 2, 3, 5, 16, 40, 61, 62, 63, 80] {
            let t = truncate_bytes(s, max);
            assert!(t.len() <= max, "{max}: {t:?} is {} bytes", t.len());
        }
        assert_eq!(truncate_bytes("short", 80), "short");
        assert_eq!(truncate_bytes("✓✓✓✓", 7), "✓...");
    }

    #[test]
    fn a_brief_command_keeps_what_tells_ranks_apart() {
        assert_eq!(
            brief_cmd(
                "/opt/conda/envs/serve/bin/python3.12 -u /workspace/sglang/launch.py --model-path=/models/Qwen3 --rank 5"
            ),
            "python3.12 -u launch.py --model-path=Qwen3 --rank 5"
        );
        assert_eq!(
            brief_cmd("sglang::scheduler_TP3_EP3"),
            "sglang::scheduler_TP3_EP3"
        );
        assert_eq!(brief_cmd("[kworker/0:1]"), "[kworker/0:1]");
        assert_eq!(brief_cmd("/ x"), "/ x");
    }

    #[test]
    fn gpu_sets_read_as_ranges() {
        assert_eq!(fmt_gpus(&[0, 1, 2, 3, 4, 5, 6, 7]), "0-7");
        assert_eq!(fmt_gpus(&[6, 0, 2, 4, 5]), "0,2,4-6");
        assert_eq!(fmt_gpus(&[]), "-");
        assert_eq!(truncate(&fmt_gpus(&[0, 2, 4, 5, 6]), 5), "0,2,\u{2026}");
    }
    use super::*;

    #[test]
    fn bytes_and_durations() {
        assert_eq!(fmt_bytes(None), "N/A");
        assert_eq!(fmt_bytes(Some(5 * MIB)), "5 MiB");
        assert_eq!(fmt_bytes(Some(20 * 1024 * MIB)), "20.0 GiB");
        assert_eq!(fmt_secs(75), "1m15s");
        assert_eq!(fmt_secs(4000), "1h06m");
        assert_eq!(fmt_ms(850), "850 ms");
        assert_eq!(fmt_ms(2300), "2.3 s");
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("abc", 4), "abc");
        assert_eq!(fmt_gpu_ranges(&[0, 1, 2, 3, 4, 5, 6, 7]), "0-7");
        assert_eq!(fmt_gpu_ranges(&[0, 2, 4, 5, 6]), "0,2,4-6");
        assert_eq!(fmt_gpu_ranges(&[3, 4]), "3,4");
        assert_eq!(fmt_gpu_ranges(&[]), "-");
        assert_eq!(escape("a\u{1b}[2Jb\nc\u{202e}"), "a\\x1b[2Jb\\nc\\u{202e}");
        assert_eq!(escape("plain — ünïcode"), "plain — ünïcode");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
