//! The layer rule, checked on the source tree itself:
//!
//! ```text
//! core  <-  source, analyze, act  <-  runtime  <-  cli, agent, serve, tui  <-  main
//! ```
//!
//! A module may use its own layer and the layers to its left, never one beside it or to its right. Front ends
//! never import each other. There are no exceptions; a new feature finds its layer.

use std::path::{Path, PathBuf};

/// (module, rank). Modules of the same rank may not import each other.
const LAYERS: &[(&str, u8)] = &[
    ("core", 0),
    ("source", 1),
    ("analyze", 1),
    ("act", 1),
    ("runtime", 2),
    ("cli", 3),
    ("agent", 3),
    ("serve", 3),
    ("tui", 3),
    ("main", 4),
];

fn rank(module: &str) -> Option<u8> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, r)| *r)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("src/ is readable")
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The layer a file belongs to: its top-level module under src/.
fn layer_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    let name = first.trim_end_matches(".rs").to_string();
    (name != "lib").then_some(name)
}

/// Every top-level module a file names through `crate::` (or `gpusweep::` in main.rs), comments skipped.
fn imports(text: &str, prefix: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find(prefix) {
            let before = rest[..i].chars().last();
            rest = &rest[i + prefix.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push((n + 1, name));
            }
        }
    }
    out
}

#[test]
fn no_import_runs_against_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 20, "the tree was found");
    let mut violations = Vec::new();
    for f in &files {
        let Some(layer) = layer_of(&src, f) else {
            continue;
        };
        let own =
            rank(&layer).unwrap_or_else(|| panic!("{}: module {layer} has no layer", f.display()));
        let text = std::fs::read_to_string(f).expect("readable");
        let prefix = if layer == "main" {
            "gpusweep::"
        } else {
            "crate::"
        };
        for (line, target) in imports(&text, prefix) {
            if target == layer {
                continue;
            }
            let Some(r) = rank(&target) else { continue };
            if r >= own {
                violations.push(format!(
                    "{}:{line}: {layer} imports {target}",
                    f.strip_prefix(&src).expect("under src").display()
                ));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "imports against the layers:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_check_catches_what_it_should() {
    let text = "use crate::tui::view::truncate; // crate::cli in a comment\nlet x = crate::runtime::Fleet;";
    let got: Vec<String> = imports(text, "crate::")
        .into_iter()
        .map(|(_, m)| m)
        .collect();
    assert_eq!(got, ["tui", "runtime"]);
    assert!(rank("source") <= rank("analyze") && rank("analyze") <= rank("source"));
    assert!(rank("core") < rank("act"));
}

/// Files outside act/ allowed one `unsafe` block, each for a syscall no safe crate wraps.
const UNSAFE_OUTSIDE_ACT: &[(&str, &str)] = &[
    (
        "source/local/tasks.rs",
        "kcmp(2), to tell a thread's private fd table from its leader's",
    ),
    (
        "serve/memory.rs",
        "mimalloc's mi_collect, to give a burst's freed memory back to the system",
    ),
    (
        "source/local/mig_ids.rs",
        "NVML's GPU and compute instance ids of a MIG device, which nvml-wrapper loads but does not wrap",
    ),
];

#[test]
fn unsafe_code_lives_in_act_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("readable");
        let rel = f
            .strip_prefix(&src)
            .expect("under src")
            .to_string_lossy()
            .into_owned();
        let in_act = layer_of(&src, f).as_deref() == Some("act");
        let allowed = UNSAFE_OUTSIDE_ACT.iter().any(|(file, _)| *file == rel);
        let mut blocks = 0;
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if (code.contains("unsafe ") || code.contains("unsafe{")) && !in_act {
                blocks += 1;
                if !allowed || blocks > 1 {
                    found.push(format!("{}:{}", f.display(), n + 1));
                }
            }
        }
    }
    assert!(found.is_empty(), "unsafe outside act/: {found:?}");
}
