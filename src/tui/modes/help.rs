//! The key help: any key closes it.

use crate::tui::app::{App, Effect};

pub fn key(_app: &mut App) -> Vec<Effect> {
    vec![]
}
