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

/// The README's layout block (from `## Layout` to the next section).
fn readme_layout() -> String {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let from = readme
        .find("## Layout")
        .expect("README has a Layout section");
    let rest = &readme[from + 2..];
    let to = rest.find("\n## ").unwrap_or(rest.len());
    rest[..to].to_string()
}

/// Whether `text` names `word` as a word of its own (not inside another name).
fn names(text: &str, word: &str) -> bool {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(i, _)| {
        !text[..i].chars().next_back().is_some_and(is_name)
            && !text[i + word.len()..].chars().next().is_some_and(is_name)
    })
}

/// Every module a newcomer looks for: each crate's files and folders under `src/`, and the front ends'
/// (`src/`, `src/serve/`, `src/tui/`), roots and test modules aside.
fn modules_to_name() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = vec![
        root().join("src"),
        root().join("src/serve"),
        root().join("src/tui"),
    ];
    for c in std::fs::read_dir(root().join("crates")).expect("crates/") {
        dirs.push(c.expect("crate").path().join("src"));
    }
    let mut out = Vec::new();
    for d in dirs {
        for e in std::fs::read_dir(&d).expect("a source folder") {
            let p = e.expect("entry").path();
            let name = p
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("")
                .to_string();
            let skip =
                ["lib.rs", "main.rs", "mod.rs", "tests.rs", "tests"].contains(&name.as_str());
            if !skip && (p.is_dir() || p.extension().is_some_and(|e| e == "rs")) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn the_readme_layout_names_every_module_and_the_docs_no_file_that_is_gone() {
    let layout = readme_layout();
    let unnamed: Vec<String> = modules_to_name()
        .iter()
        .filter_map(|p| {
            let stem = p.file_stem()?.to_str()?;
            (!names(&layout, stem))
                .then(|| p.strip_prefix(root()).unwrap_or(p).display().to_string())
        })
        .collect();
    assert!(
        unnamed.is_empty(),
        "README's Layout does not name: {unnamed:?}"
    );
    // The other way: every `name.rs` the layout or architecture.md names is a file of the tree.
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    rust_files(&root().join("crates"), &mut files);
    rust_files(&root().join("tests"), &mut files);
    let arch =
        std::fs::read_to_string(root().join("docs/architecture.md")).expect("docs/architecture.md");
    for (doc, text) in [
        ("README.md", layout.as_str()),
        ("docs/architecture.md", arch.as_str()),
    ] {
        for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || "_./".contains(c))) {
            let Some(name) = word.strip_suffix(".rs") else {
                continue;
            };
            let name = format!("{}.rs", name.trim_start_matches('/'));
            assert!(
                files
                    .iter()
                    .any(|f| f.to_string_lossy().ends_with(&format!("/{name}"))),
                "{doc} names {name}, which is not in the tree"
            );
        }
    }
}

#[test]
fn a_word_is_named_only_on_its_own() {
    assert!(names("plan.rs (sweep plans)", "plan"));
    assert!(!names("sweep plans", "plan"));
    assert!(!names("proc_state", "state"));
}
