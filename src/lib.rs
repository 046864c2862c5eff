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
pub mod core;
pub mod runtime;
pub mod serve;
pub mod source;
pub mod tui;
