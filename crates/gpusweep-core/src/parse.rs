//! Parsers for what operators type: durations and GPU lists. Used by clap's value parsers and by the config
//! file, so a bad value is refused where it is written, with the same words.

use std::time::Duration;

use thiserror::Error;

/// The longest duration any flag accepts: longer is a typo, not a plan.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);
/// The highest GPU index accepted (NVML numbers GPUs from 0; no host has anywhere near this many).
pub(crate) const MAX_GPU_INDEX: u32 = 1023;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParseError {
    #[error("{0:?} is not a duration (use e.g. 500ms, 2s, 1m)")]
    Duration(String),
    #[error("{0:?} is negative: a duration is zero or more (e.g. 0s, 500ms)")]
    NegativeDuration(String),
    #[error("{0:?} is longer than a year")]
    DurationTooLong(String),
    #[error("bad GPU index {0:?} (a number from 0 to {MAX_GPU_INDEX}, or a GPU UUID)")]
    GpuIndex(String),
    #[error("bad GPU range {0:?}")]
    GpuRange(String),
    #[error("empty GPU list")]
    EmptyGpuList,
}

/// "1s", "250ms", "1m30s", or a bare number of seconds; at most a year.
pub fn parse_duration(s: &str) -> Result<Duration, ParseError> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(ParseError::NegativeDuration(s.to_string()));
    }
    let d = if let Ok(secs) = t.parse::<f64>() {
        if !(secs.is_finite() && secs >= 0.0) {
            return Err(ParseError::Duration(s.to_string()));
        }
        if secs > MAX_DURATION.as_secs_f64() {
            return Err(ParseError::DurationTooLong(s.to_string()));
        }
        Duration::from_secs_f64(secs)
    } else {
        match humantime::parse_duration(t) {
            Ok(d) => d,
            Err(humantime::DurationError::NumberOverflow) => {
                return Err(ParseError::DurationTooLong(s.to_string()));
            }
            Err(_) => return Err(ParseError::Duration(s.to_string())),
        }
    };
    if d > MAX_DURATION {
        return Err(ParseError::DurationTooLong(s.to_string()));
    }
    Ok(d)
}

/// One item of `--gpus`: an index, or a GPU UUID (`GPU-...`, matched against each host's GPUs).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GpuRef {
    Index(u32),
    Uuid(String),
}

impl std::fmt::Display for GpuRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuRef::Index(i) => write!(f, "{i}"),
            GpuRef::Uuid(u) => write!(f, "{u}"),
        }
    }
}

fn index(s: &str) -> Result<u32, ParseError> {
    s.trim()
        .parse::<u32>()
        .ok()
        .filter(|i| *i <= MAX_GPU_INDEX)
        .ok_or_else(|| ParseError::GpuIndex(s.to_string()))
}

/// "0,1,4-7" -> [0,1,4,5,6,7] (sorted, no duplicates).
pub fn parse_gpu_list(s: &str) -> Result<Vec<u32>, ParseError> {
    let refs = parse_gpu_refs(s)?;
    refs.into_iter()
        .map(|r| match r {
            GpuRef::Index(i) => Ok(i),
            GpuRef::Uuid(u) => Err(ParseError::GpuIndex(u)),
        })
        .collect()
}

/// "0,2-3,GPU-a5b2e79f-..." -> indices and UUIDs, sorted, no duplicates.
pub(crate) fn parse_gpu_refs(s: &str) -> Result<Vec<GpuRef>, ParseError> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part.len() > 4
            && part
                .get(..4)
                .is_some_and(|p| p.eq_ignore_ascii_case("GPU-") || p.eq_ignore_ascii_case("MIG-"))
        {
            out.push(GpuRef::Uuid(part.to_string()));
        } else if let Some((a, b)) = part.split_once('-') {
            let (a, b) = (index(a)?, index(b)?);
            if b < a {
                return Err(ParseError::GpuRange(part.to_string()));
            }
            out.extend((a..=b).map(GpuRef::Index));
        } else {
            out.push(GpuRef::Index(index(part)?));
        }
    }
    if out.is_empty() {
        return Err(ParseError::EmptyGpuList);
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// clap value parser for durations.
pub fn duration_arg(s: &str) -> Result<Duration, ParseError> {
    parse_duration(s)
}

/// clap value parser for GPU lists.
pub fn gpu_refs_arg(s: &str) -> Result<Vec<GpuRef>, ParseError> {
    parse_gpu_refs(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_checked_and_capped() {
        assert_eq!(parse_duration("250ms").expect("ok").as_millis(), 250);
        assert_eq!(parse_duration("2").expect("ok").as_secs(), 2);
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("-1s").is_err());
        assert_eq!(
            parse_duration("500000000000y"),
            Err(ParseError::DurationTooLong("500000000000y".into()))
        );
        assert!(parse_duration("2y").is_err());
        assert!(parse_duration("1e300").is_err());
        assert!(parse_duration("NaN").is_err());
    }

    #[test]
    fn gpu_lists() {
        assert_eq!(parse_gpu_list("0,2,4-6").expect("ok"), [0, 2, 4, 5, 6]);
        assert!(parse_gpu_list("a").is_err());
        assert!(parse_gpu_list("5-1").is_err());
        assert!(parse_gpu_list("0-99999999").is_err());
        let r = parse_gpu_refs("GPU-a5b2e79f-a4e0-1241-ebeb-3cdbbcebd2a0,1").expect("ok");
        assert_eq!(
            r,
            [
                GpuRef::Index(1),
                GpuRef::Uuid("GPU-a5b2e79f-a4e0-1241-ebeb-3cdbbcebd2a0".into())
            ]
        );
    }
}
