//! The terminal UI.
pub mod view;

pub fn run(_s: &crate::commands::Settings) -> anyhow::Result<i32> {
    anyhow::bail!("the TUI is not built yet")
}
