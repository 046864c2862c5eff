//! The terminal UI: `app` holds the view and `update(Action)`, `store` what the hosts sent, `modes` the
//! layers on top (one file per dialog and overlay), `watch` the re-watch; `view` renders it all, `run`
//! drives both.

pub mod app;
pub mod history;
pub mod keymap;
pub mod modes;
pub mod rows;
pub mod run;
pub mod store;
pub mod targets;
pub mod view;
pub mod watch;

pub use run::run;
