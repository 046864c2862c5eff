//! The model and the words every layer shares: snapshot types, host specs, the agent protocol, signal
//! requests and outcomes, parsers and formatting, shared-memory limits. No I/O beyond reading the host name.

pub mod action;
pub mod cgroup;
pub mod escape;
pub mod event;
pub mod format;
pub mod host;
pub mod job;
pub mod metrics;
pub mod model;
pub mod mountinfo;
pub mod parse;
pub mod proc_state;
pub mod procstat;
pub mod protocol;
pub mod removal;
pub mod signal;
pub mod smem;
pub mod sse;
pub mod trace;

pub use trace::trace;
