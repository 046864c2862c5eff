//! gpusweep's words, which every layer shares: snapshot types, host specs, the agent protocol, what a front
//! end asks of a host and how its connection stands, signal requests and outcomes, parsers and formatting,
//! shared-memory limits. No I/O beyond reading the host name, and no `unsafe`.

#![forbid(unsafe_code)]

pub mod action;
pub mod acts;
pub mod cgroup;
pub mod conn;
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
pub mod seal;
pub mod signal;
pub mod smem;
pub mod sse;
pub mod trace;
pub mod verdict;

pub use trace::trace;
