//! gpusweep: who holds this GPU memory, and is it gone yet?
//!
//! The layers are crates, each depending only on those to its left (cargo keeps it so; `tests/layers.rs`
//! keeps what cargo cannot: front ends never import each other, and `unsafe` lives in gpusweep-sys alone):
//!
//! ```text
//! gpusweep-core  <-  gpusweep-analyze, gpusweep-act, gpusweep-source  <-  gpusweep-runtime  <-  this crate
//! ```
//!
//! This crate holds the front ends (cli, agent, serve, tui) and re-exports the layers under their old names
//! (`gpusweep::analyze`, `gpusweep::runtime`, ...). Data flows one way: sources -> whole snapshots -> the
//! runtime (analysis, once) -> front ends. Actions go out through `act` on this host, or as agent commands to
//! others.

#![forbid(unsafe_code)]

/// Actions on real processes: the gpusweep-act crate.
pub use gpusweep_act as act;
pub mod agent;
/// The judgement: the gpusweep-analyze crate.
pub use gpusweep_analyze as analyze;
pub mod cli;
/// The words every layer shares: the gpusweep-core crate.
pub use gpusweep_core as core;
/// The ledger, the fleet, polling and settings: the gpusweep-runtime crate.
pub use gpusweep_runtime as runtime;
pub mod serve;
/// The readings: the gpusweep-source crate.
pub use gpusweep_source as source;
pub mod tui;

/// mimalloc, not the C library's malloc, for everything built from this crate (the binary, its tests and
/// benchmarks alike). A client of ten thousand hosts parses, judges and lets go of thousands of readings a
/// second: with glibc's malloc a third of its time went to malloc, free and consolidation, and a serve kept
/// what a burst of streams freed until told to give it back. Built without transparent huge pages
/// (`no_thp` in crates/gpusweep-sys/Cargo.toml): where the kernel grants them on request, each 2 MiB region mimalloc touched was
/// resident whole, and a TUI of 16 hosts took 30 MB instead of 16. Measured in docs/validation.md (issue 29).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
