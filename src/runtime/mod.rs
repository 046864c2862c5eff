//! The runtime: the fleet (one collector per host, keyed by `HostId`), the one poll loop shared by the
//! fleet and the agent, settings resolution and the config file. Analysis runs here, once per reading.

pub mod config;
pub mod fleet;
pub mod poll;
pub mod settings;

pub use fleet::{Fleet, FleetOptions, HostEvent};

/// How often hosts are read while something waits for them to become clean (a sweep, a re-watch, `wait`).
pub const FAST_POLL: std::time::Duration = std::time::Duration::from_millis(100);
pub use settings::{Overrides, Settings};
