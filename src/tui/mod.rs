//! The terminal UI: `app` holds state and `update(Action)`, `view` renders it, `run` drives both.

pub mod app;
pub mod keymap;
pub mod rows;
pub mod run;
pub mod targets;
pub mod view;

pub use run::run;
