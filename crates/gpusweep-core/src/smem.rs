//! Shared-memory limits per compute capability and a GEMM tile fit calculator.
//!
//! The limits come from a table keyed by NVML's compute capability, never from the CUDA driver API: `cuInit`
//! alone makes a GPU read 4 MiB used. The 9.0 row matches what the driver API returned on a real H200
//! (232448 B per block opt-in, 233472 B per SM, 49152 B default, 65536 registers per SM).

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SmemLimits {
    pub cc: &'static str,
    pub family: &'static str,
    /// Shared memory per SM, bytes.
    pub per_sm: u32,
    /// Most a block may ask for with cudaFuncSetAttribute (opt-in), bytes.
    pub per_block_optin: u32,
    /// What a block gets without opting in.
    pub per_block_default: u32,
    pub registers_per_sm: u32,
}

const KB: u32 = 1024;

pub const TABLE: &[SmemLimits] = &[
    row("7.0", "Volta (V100)", 96, 96),
    row("7.2", "Volta (Xavier)", 96, 96),
    row("7.5", "Turing (T4, RTX 20)", 64, 64),
    row("8.0", "Ampere (A100)", 164, 163),
    row("8.6", "Ampere (A10, RTX 30)", 100, 99),
    row("8.7", "Ampere (Orin)", 164, 163),
    row("8.9", "Ada (L4, L40S, RTX 40)", 100, 99),
    row("9.0", "Hopper (H100, H200)", 228, 227),
    row("10.0", "Blackwell (B200, GB200)", 228, 227),
    row("10.3", "Blackwell (B300, GB300)", 228, 227),
    row("11.0", "Blackwell (Thor)", 228, 227),
    row("12.0", "Blackwell (RTX 50, RTX PRO 6000)", 128, 99),
    row("12.1", "Blackwell (GB10, DGX Spark)", 128, 99),
];

const fn row(cc: &'static str, family: &'static str, sm_kb: u32, block_kb: u32) -> SmemLimits {
    SmemLimits {
        cc,
        family,
        per_sm: sm_kb * KB,
        per_block_optin: block_kb * KB,
        per_block_default: 48 * KB,
        registers_per_sm: 65536,
    }
}

/// Hopper's opt-in limit: the reference tiles are tuned for it.
pub const HOPPER_PER_BLOCK: u32 = 227 * KB;

pub fn limits(cc: &str) -> Option<&'static SmemLimits> {
    let cc = normalize_cc(cc)?;
    TABLE.iter().find(|r| r.cc == cc)
}

/// A compute capability as people write it, as "major.minor": "9.0", "12" (major only), "sm_90",
/// "sm90a", "sm120", "compute_120f". `None` when it is no capability at all.
pub fn normalize_cc(s: &str) -> Option<String> {
    let t = s.trim().to_ascii_lowercase();
    let (arch, rest) = match t
        .strip_prefix("sm_")
        .or_else(|| t.strip_prefix("compute_"))
        .or_else(|| t.strip_prefix("sm"))
    {
        Some(r) => (true, r),
        None => (false, t.as_str()),
    };
    // Architecture suffixes: sm_90a (arch-specific), sm_120f (family).
    let rest = rest.trim_end_matches(['a', 'f']);
    if let Some((maj, min)) = rest.split_once('.') {
        let (maj, min) = (maj.parse::<u32>().ok()?, min.parse::<u32>().ok()?);
        return (min < 10).then(|| format!("{maj}.{min}"));
    }
    let n = rest.parse::<u32>().ok()?;
    // "sm_90" packs major and minor in one number; a bare "12" or "9" is a major version.
    if arch || n >= 20 {
        (n >= 10).then(|| format!("{}.{}", n / 10, n % 10))
    } else {
        Some(format!("{n}.0"))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    Fp32,
    Bf16,
    Fp16,
    Fp8,
    Fp4,
}

impl Dtype {
    pub fn bits(self) -> u64 {
        match self {
            Dtype::Fp32 => 32,
            Dtype::Bf16 | Dtype::Fp16 => 16,
            Dtype::Fp8 => 8,
            Dtype::Fp4 => 4,
        }
    }
    pub fn parse(s: &str) -> Option<Dtype> {
        Some(match s.to_ascii_lowercase().as_str() {
            "fp32" | "f32" | "float" | "float32" | "tf32" => Dtype::Fp32,
            "bf16" | "bfloat16" => Dtype::Bf16,
            "fp16" | "f16" | "half" | "float16" => Dtype::Fp16,
            "fp8" | "e4m3" | "e5m2" | "fp8_e4m3" | "fp8_e5m2" | "float8_e4m3fn" | "float8_e5m2"
            | "mxfp8" => Dtype::Fp8,
            "fp4" | "e2m1" | "nvfp4" | "mxfp4" | "fp4_e2m1" => Dtype::Fp4,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Fp32 => "fp32",
            Dtype::Bf16 => "bf16",
            Dtype::Fp16 => "fp16",
            Dtype::Fp8 => "fp8",
            Dtype::Fp4 => "fp4",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Tile {
    pub m: u64,
    pub n: u64,
    pub k: u64,
}

/// Why a tile could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TileError {
    #[error("tile {0:?}: expected MxNxK, for example 128x256x64")]
    Shape(String),
    #[error("tile {tile:?}: {part:?} is not a size between 1 and 4096")]
    Size { tile: String, part: String },
}

impl Tile {
    /// "128x256x128"
    pub fn parse(s: &str) -> Result<Tile, TileError> {
        let parts: Vec<&str> = s.split(['x', 'X', '*']).collect();
        let [m, n, k] = parts.as_slice() else {
            return Err(TileError::Shape(s.to_string()));
        };
        let num = |v: &str| -> Result<u64, TileError> {
            v.trim()
                .parse::<u64>()
                .ok()
                .filter(|&x| x > 0 && x <= 4096)
                .ok_or_else(|| TileError::Size {
                    tile: s.to_string(),
                    part: v.to_string(),
                })
        };
        Ok(Tile {
            m: num(m)?,
            n: num(n)?,
            k: num(k)?,
        })
    }
}

/// The barrier bytes each pipeline stage needs besides its A and B tiles.
pub(crate) const STAGE_BARRIER_BYTES: u64 = 16;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fit {
    pub cc: String,
    pub available: u64,
    pub bytes_per_stage: u64,
    pub epilogue: u64,
    pub stages_wanted: u64,
    pub needed: u64,
    /// The most stages that fit (0 when not even one does).
    pub max_stages: u64,
    pub fits: bool,
    /// How many bytes too many, when it does not fit.
    pub short_by: u64,
}

/// bytes per stage = tileM*tileK*size(A) + tileN*tileK*size(B) + 16, plus the epilogue carve-out once.
pub(crate) fn bytes_per_stage(tile: Tile, a: Dtype, b: Dtype) -> u64 {
    (tile.m * tile.k * a.bits()).div_ceil(8)
        + (tile.n * tile.k * b.bits()).div_ceil(8)
        + STAGE_BARRIER_BYTES
}

pub fn fit(lim: &SmemLimits, tile: Tile, dtype: Dtype, stages: u64, epilogue: u64) -> Fit {
    let per = bytes_per_stage(tile, dtype, dtype);
    let available = u64::from(lim.per_block_optin);
    let needed = per * stages + epilogue;
    let max_stages = available.saturating_sub(epilogue) / per;
    Fit {
        cc: lim.cc.to_string(),
        available,
        bytes_per_stage: per,
        epilogue,
        stages_wanted: stages,
        needed,
        max_stages,
        fits: needed <= available,
        short_by: needed.saturating_sub(available),
    }
}

/// `12345` -> `12,345`.
pub fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl Fit {
    pub fn sentence(&self) -> String {
        if self.fits {
            let room = if self.max_stages > self.stages_wanted {
                format!("room for up to {} stages", self.max_stages)
            } else {
                "no room for another stage".to_string()
            };
            format!(
                "fits on CC {}: {} stage{} of {} B need {} B of {} B ({room})",
                self.cc,
                self.stages_wanted,
                if self.stages_wanted == 1 { "" } else { "s" },
                group(self.bytes_per_stage),
                group(self.needed),
                group(self.available),
            )
        } else {
            format!(
                "does NOT fit on CC {}: {} stage{} of {} B need {} B, only {} B per block available ({} B short; {})",
                self.cc,
                self.stages_wanted,
                if self.stages_wanted == 1 { "" } else { "s" },
                group(self.bytes_per_stage),
                group(self.needed),
                group(self.available),
                group(self.short_by),
                match self.max_stages {
                    0 => "not even one stage fits".to_string(),
                    1 => "at most 1 stage fits".to_string(),
                    n => format!("at most {n} stages fit"),
                }
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_issue_example_does_not_fit_on_sm120_but_fits_on_hopper() {
        let tile = Tile::parse("128x256x128").expect("tile");
        let f = fit(limits("12.0").expect("12.0"), tile, Dtype::Bf16, 2, 0);
        assert_eq!(f.bytes_per_stage, 98_320);
        assert_eq!(f.available, 101_376);
        assert!(!f.fits);
        assert_eq!(f.max_stages, 1);
        assert_eq!(f.short_by, 2 * 98_320 - 101_376);
        let h = fit(limits("9.0").expect("9.0"), tile, Dtype::Bf16, 2, 0);
        assert!(h.fits);
        assert_eq!(h.max_stages, 2);
        assert!(f.sentence().contains("does NOT fit"));
        assert!(f.sentence().contains("98,320"));
    }

    #[test]
    fn hopper_row_matches_the_real_h200() {
        let l = limits("9.0").expect("row");
        assert_eq!(
            (l.per_block_optin, l.per_sm, l.per_block_default),
            (232_448, 233_472, 49_152)
        );
    }

    #[test]
    fn every_cc_from_7_to_12_1_is_known() {
        for cc in [
            "7.0", "7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "12.1",
        ] {
            assert!(limits(cc).is_some(), "{cc}");
        }
        assert!(limits("6.1").is_none());
    }

    #[test]
    fn capabilities_are_read_as_people_write_them() {
        for (s, cc) in [
            ("12", "12.0"),
            ("12.0", "12.0"),
            ("sm_90", "9.0"),
            ("SM90a", "9.0"),
            ("sm120", "12.0"),
            ("sm_120f", "12.0"),
            ("compute_103", "10.3"),
            ("9", "9.0"),
            ("90", "9.0"),
            (" 8.6 ", "8.6"),
        ] {
            assert_eq!(normalize_cc(s).as_deref(), Some(cc), "{s}");
            assert!(limits(s).is_some(), "{s}");
        }
        for bad in ["", "sm_", "x", "9.10", "sm_5"] {
            assert_eq!(normalize_cc(bad), None, "{bad}");
        }
        assert_eq!(Dtype::parse("BF16"), Some(Dtype::Bf16));
        assert_eq!(Dtype::parse("Float8_E4M3FN"), Some(Dtype::Fp8));
    }

    #[test]
    fn the_sentence_says_what_room_is_left() {
        let t = Tile::parse("128x256x128").expect("tile");
        let h = fit(limits("9.0").expect("9.0"), t, Dtype::Bf16, 2, 0);
        assert!(
            h.sentence().contains("no room for another stage"),
            "{}",
            h.sentence()
        );
        let small = fit(limits("9.0").expect("9.0"), t, Dtype::Fp8, 1, 0);
        assert!(
            small.sentence().contains("1 stage of"),
            "{}",
            small.sentence()
        );
        assert!(
            small.sentence().contains("up to 4 stages"),
            "{}",
            small.sentence()
        );
    }

    #[test]
    fn fp4_halves_bytes_and_epilogue_counts_once() {
        let t = Tile {
            m: 128,
            n: 128,
            k: 128,
        };
        assert_eq!(bytes_per_stage(t, Dtype::Fp4, Dtype::Fp4), 8192 + 8192 + 16);
        let f = fit(limits("9.0").expect("row"), t, Dtype::Fp4, 4, 32768);
        assert_eq!(f.needed, 4 * 16400 + 32768);
    }

    #[test]
    fn tile_parse_errors_are_clear() {
        assert!(Tile::parse("128x256").is_err_and(|e| e.to_string().contains("MxNxK")));
        assert!(Tile::parse("0x1x1").is_err());
        assert!(Tile::parse("axbxc").is_err());
        assert_eq!(
            Tile::parse("64X64x32"),
            Ok(Tile {
                m: 64,
                n: 64,
                k: 32
            })
        );
        assert_eq!(group(101_376), "101,376");
        assert_eq!(group(16), "16");
    }
}
