//! gpusweep: who holds this GPU memory, and is it gone yet?
//!
//! Layers, each importing only those to its left (a test in `tests/layers.rs` keeps it so):
//!
//! ```text
//! core  <-  source, analyze, act  <-  runtime  <-  cli, agent, serve, tui  <-  main
//! ```
//!
//! Data flows one way: sources -> whole snapshots -> the runtime (analysis, once) -> front ends. Actions go out
//! through `act` on this host, or as agent commands to others.

pub mod act;
pub mod agent;
pub mod analyze;
pub mod cli;
/// The words every layer shares: the gpusweep-core crate.
pub use gpusweep_core as core;
pub mod runtime;
pub mod serve;
pub mod source;
pub mod tui;

/// mimalloc, not the C library's malloc, for everything built from this crate (the binary, its tests and
/// benchmarks alike). A client of ten thousand hosts parses, judges and lets go of thousands of readings a
/// second: with glibc's malloc a third of its time went to malloc, free and consolidation, and a serve kept
/// what a burst of streams freed until told to give it back. Built without transparent huge pages
/// (`no_thp` in Cargo.toml): where the kernel grants them on request, each 2 MiB region mimalloc touched was
/// resident whole, and a TUI of 16 hosts took 30 MB instead of 16. Measured in docs/validation.md (issue 29).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
