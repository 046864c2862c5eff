//! The runtime: the fleet (one collector per host, keyed by `HostId`), the one poll loop shared by the
//! fleet and the agent, settings resolution and the config file. Analysis runs here, once per reading.

pub mod config;
pub mod fleet;
pub mod poll;
pub mod settings;

pub use fleet::{Fleet, FleetOptions, HostEvent};
pub use settings::{Overrides, Settings};
