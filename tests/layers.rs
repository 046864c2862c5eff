//! What cargo cannot keep about the layers. The layers are crates (see docs/architecture.md):
//!
//! ```text
//! gpusweep-core  <-  gpusweep-analyze, gpusweep-act, gpusweep-source  <-  gpusweep-runtime  <-  gpusweep
//! ```
//!
//! and cargo refuses an import a crate's manifest does not allow. Two rules are left to this test: the front
//! ends inside the `gpusweep` crate (cli, agent, serve, tui) never import each other, and `unsafe` lives in
//! gpusweep-sys alone while every other crate forbids it.

use std::path::{Path, PathBuf};

/// The front ends: modules of the `gpusweep` crate that may use every layer crate, never each other.
const FRONT_ENDS: &[&str] = &["cli", "agent", "serve", "tui"];

/// Every crate root that must say `#![forbid(unsafe_code)]`: all but gpusweep-sys.
const FORBIDDING: &[&str] = &[
    "src/lib.rs",
    "src/main.rs",
    "crates/gpusweep-core/src/lib.rs",
    "crates/gpusweep-analyze/src/lib.rs",
    "crates/gpusweep-act/src/lib.rs",
    "crates/gpusweep-source/src/lib.rs",
    "crates/gpusweep-runtime/src/lib.rs",
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("the tree is readable")
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

/// The front end a file of src/ belongs to: its top-level module, when that is a front end.
fn front_end_of(src: &Path, file: &Path) -> Option<&'static str> {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.trim_end_matches(".rs");
    FRONT_ENDS.iter().copied().find(|f| *f == name)
}

/// Every top-level module a line names through `prefix` (`crate::`), comments skipped.
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
fn front_ends_never_import_each_other() {
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 20, "the tree was found");
    let mut violations = Vec::new();
    for f in &files {
        let Some(own) = front_end_of(&src, f) else {
            continue;
        };
        let text = std::fs::read_to_string(f).expect("readable");
        for (line, target) in imports(&text, "crate::") {
            if target != own && FRONT_ENDS.contains(&target.as_str()) {
                violations.push(format!(
                    "{}:{line}: {own} imports {target}",
                    f.strip_prefix(&src).expect("under src").display()
                ));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "front ends importing each other:\n{}",
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
    let src = Path::new("/x/src");
    assert_eq!(
        front_end_of(src, Path::new("/x/src/serve/hub.rs")),
        Some("serve")
    );
    assert_eq!(front_end_of(src, Path::new("/x/src/tui.rs")), Some("tui"));
    assert_eq!(front_end_of(src, Path::new("/x/src/lib.rs")), None);
}

#[test]
fn unsafe_code_lives_in_gpusweep_sys_only() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    rust_files(&root().join("crates"), &mut files);
    assert!(files.len() > 100, "the tree was found");
    let sys = root().join("crates/gpusweep-sys");
    let mut found = Vec::new();
    let mut in_sys = 0;
    for f in &files {
        let text = std::fs::read_to_string(f).expect("readable");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if code.contains("unsafe ") || code.contains("unsafe{") {
                if f.starts_with(&sys) {
                    in_sys += 1;
                } else {
                    found.push(format!("{}:{}", f.display(), n + 1));
                }
            }
        }
    }
    assert!(found.is_empty(), "unsafe outside gpusweep-sys: {found:?}");
    assert!(in_sys > 0, "gpusweep-sys was read");
    for r in FORBIDDING {
        let text = std::fs::read_to_string(root().join(r)).expect("crate root readable");
        assert!(
            text.contains("#![forbid(unsafe_code)]"),
            "{r} does not forbid unsafe code"
        );
    }
}
