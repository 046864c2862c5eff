//! gpusweep: who holds this GPU memory, and is it gone yet?
//!
//! Data flows one way: sources -> whole snapshots -> `analyze` -> app state -> pure render functions.
//! Actions (kill, sweep, re-watch) go out through `sweep`, locally or as agent commands.

pub mod agent;
pub mod analyze;
pub mod cli;
pub mod collect;
pub mod commands;
pub mod config;
pub mod hosts;
pub mod model;
pub mod smem;
pub mod source;
pub mod sweep;
pub mod tui;
pub mod watch;
