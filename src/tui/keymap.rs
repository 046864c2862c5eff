//! Keys -> commands, by layer: the main screen, a dialog, the shared-memory overlay, the timeline, and a
//! line being typed (the process filter, a tile). Every key any layer acts on is looked up here; a layer's
//! own keys come first, then the main screen's (so moving, quitting and help work everywhere), except while
//! text is typed. Defaults are vim keys and arrows; the config file's `[keys]` table rebinds any command
//! (`kill = "x"`, `confirm = "o"`). Ctrl-C always quits.

use std::collections::{BTreeMap, HashMap};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

/// Where a key is pressed: each layer has keys of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layer {
    Main,
    Dialog,
    Smem,
    Timeline,
    /// The jobs overlay.
    Jobs,
    /// A line being typed: only its own keys are commands, every other key is text.
    Edit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cmd {
    Quit,
    Up,
    Down,
    NextPanel,
    PrevPanel,
    Open,
    Back,
    Kill,
    Sweep,
    Rewatch,
    Filter,
    Sort,
    Refresh,
    Smem,
    Help,
    Tree,
    Timeline,
    Chart,
    Jobs,
    /// The next host that leaks or cannot be read.
    NextTrouble,
    RemoveShm,
    /// A dialog: do it. A line being typed: done.
    Confirm,
    /// A dialog: do nothing. A line being typed: clear it and stop.
    Cancel,
    /// A dialog's next choice (TERM/KILL, the sweep's scope).
    NextChoice,
    PrevChoice,
    EditTile,
    NextDtype,
    MoreStages,
    FewerStages,
    /// A line being typed: take back its last character.
    Erase,
}

impl Cmd {
    /// Every command: its layer, its name in the config's `[keys]`, and what it does.
    pub const ALL: [(Cmd, Layer, &'static str, &'static str); 30] = [
        (Cmd::Up, Layer::Main, "up", "move up"),
        (Cmd::Down, Layer::Main, "down", "move down"),
        (Cmd::NextPanel, Layer::Main, "next_panel", "next panel"),
        (Cmd::PrevPanel, Layer::Main, "prev_panel", "previous panel"),
        (Cmd::Open, Layer::Main, "open", "open the selected host"),
        (Cmd::Back, Layer::Main, "back", "back / close"),
        (
            Cmd::Kill,
            Layer::Main,
            "kill",
            "kill the selected process (dialog)",
        ),
        (
            Cmd::Sweep,
            Layer::Main,
            "sweep",
            "sweep the selected GPU, host or everything (dialog)",
        ),
        (
            Cmd::Rewatch,
            Layer::Main,
            "rewatch",
            "re-watch: fast polling until every GPU reads zero",
        ),
        (
            Cmd::Filter,
            Layer::Main,
            "filter",
            "filter processes (hosts, on the hosts panel)",
        ),
        (Cmd::Sort, Layer::Main, "sort", "change the process sort"),
        (
            Cmd::Refresh,
            Layer::Main,
            "refresh",
            "refresh now (reconnects down hosts)",
        ),
        (
            Cmd::Smem,
            Layer::Main,
            "smem",
            "shared-memory panel and tile calculator",
        ),
        (
            Cmd::Timeline,
            Layer::Main,
            "timeline",
            "timeline: what happened, with times",
        ),
        (
            Cmd::Chart,
            Layer::Main,
            "chart",
            "memory chart of the host (or GPU)",
        ),
        (
            Cmd::Jobs,
            Layer::Main,
            "jobs",
            "jobs: phase, ranks, memory; S there sweeps the job",
        ),
        (
            Cmd::NextTrouble,
            Layer::Main,
            "next_trouble",
            "next host that leaks or cannot be read",
        ),
        (
            Cmd::RemoveShm,
            Layer::Main,
            "remove_shm",
            "remove the host's /dev/shm leftovers (dialog)",
        ),
        (Cmd::Tree, Layer::Main, "tree", "toggle the process tree"),
        (Cmd::Help, Layer::Main, "help", "this help"),
        (Cmd::Quit, Layer::Main, "quit", "quit"),
        (Cmd::Confirm, Layer::Dialog, "confirm", "dialog: do it"),
        (Cmd::Cancel, Layer::Dialog, "cancel", "dialog: do nothing"),
        (
            Cmd::NextChoice,
            Layer::Dialog,
            "next_choice",
            "dialog: next choice (signal, scope)",
        ),
        (
            Cmd::PrevChoice,
            Layer::Dialog,
            "prev_choice",
            "dialog: previous choice",
        ),
        (Cmd::EditTile, Layer::Smem, "edit_tile", "smem: type a tile"),
        (
            Cmd::NextDtype,
            Layer::Smem,
            "next_dtype",
            "smem: next dtype",
        ),
        (
            Cmd::MoreStages,
            Layer::Smem,
            "more_stages",
            "smem: one stage more",
        ),
        (
            Cmd::FewerStages,
            Layer::Smem,
            "fewer_stages",
            "smem: one stage fewer",
        ),
        (
            Cmd::Erase,
            Layer::Edit,
            "erase",
            "typing: erase a character",
        ),
    ];

    fn layer(self) -> Layer {
        Cmd::ALL
            .iter()
            .find(|(c, ..)| *c == self)
            .map_or(Layer::Main, |(_, l, ..)| *l)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    pub code: KeyCode,
    pub ctrl: bool,
}

impl Key {
    pub fn from_event(e: &KeyEvent) -> Key {
        Key {
            code: e.code,
            ctrl: e.modifiers.contains(KeyModifiers::CONTROL),
        }
    }

    /// "K", "x", "ctrl-r", "tab", "shift-tab", "enter", "esc", "up", "down", "left", "right", "space", "f5".
    pub fn parse(s: &str) -> Option<Key> {
        let (ctrl, rest) = match s.strip_prefix("ctrl-").or_else(|| s.strip_prefix("C-")) {
            Some(r) => (true, r),
            None => (false, s),
        };
        let code = match rest.to_ascii_lowercase().as_str() {
            "tab" => KeyCode::Tab,
            "shift-tab" | "backtab" => KeyCode::BackTab,
            "enter" | "return" => KeyCode::Enter,
            "esc" | "escape" => KeyCode::Esc,
            "up" => KeyCode::Up,
            "down" => KeyCode::Down,
            "left" => KeyCode::Left,
            "right" => KeyCode::Right,
            "space" => KeyCode::Char(' '),
            "backspace" => KeyCode::Backspace,
            f if f.starts_with('f') && f.len() > 1 && f[1..].parse::<u8>().is_ok() => {
                KeyCode::F(f[1..].parse().ok()?)
            }
            _ => {
                let mut chars = rest.chars();
                match (chars.next(), chars.next()) {
                    (Some(c), None) => KeyCode::Char(c),
                    _ => return None,
                }
            }
        };
        Some(Key { code, ctrl })
    }

    pub fn label(&self) -> String {
        let base = match self.code {
            KeyCode::Char(' ') => "space".to_string(),
            KeyCode::Char(c) => c.to_string(),
            KeyCode::Tab => "Tab".into(),
            KeyCode::BackTab => "S-Tab".into(),
            KeyCode::Enter => "Enter".into(),
            KeyCode::Esc => "Esc".into(),
            KeyCode::Up => "↑".into(),
            KeyCode::Down => "↓".into(),
            KeyCode::Left => "←".into(),
            KeyCode::Right => "→".into(),
            KeyCode::F(n) => format!("F{n}"),
            other => format!("{other:?}"),
        };
        if self.ctrl { format!("C-{base}") } else { base }
    }
}

/// Why a `[keys]` table cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeymapError {
    #[error("[keys] {name:?}: no such command (one of {known})")]
    NoSuchCommand { name: String, known: String },
    #[error("[keys] {name}: bad key {key:?} (use a character, ctrl-x, tab, enter, esc, up, f5...)")]
    BadKey { name: String, key: String },
    #[error(
        "[keys] {name} = {key:?}: that key is already {other}'s; bind {other} to another key too, or choose another"
    )]
    Taken {
        name: String,
        key: String,
        other: &'static str,
    },
    #[error("[keys]: {0} has no key left")]
    Unbound(&'static str),
}

#[derive(Debug, Clone)]
pub struct Keymap {
    map: HashMap<(Layer, Key), Cmd>,
}

fn k(c: char) -> Key {
    Key {
        code: KeyCode::Char(c),
        ctrl: false,
    }
}
fn kc(code: KeyCode) -> Key {
    Key { code, ctrl: false }
}

impl Default for Keymap {
    fn default() -> Self {
        use Layer::{Dialog, Edit, Main, Smem};
        let pairs = [
            (Main, k('q'), Cmd::Quit),
            (Main, k('k'), Cmd::Up),
            (Main, kc(KeyCode::Up), Cmd::Up),
            (Main, k('j'), Cmd::Down),
            (Main, kc(KeyCode::Down), Cmd::Down),
            (Main, kc(KeyCode::Tab), Cmd::NextPanel),
            (Main, kc(KeyCode::BackTab), Cmd::PrevPanel),
            (Main, kc(KeyCode::Enter), Cmd::Open),
            (Main, k('l'), Cmd::Open),
            (Main, kc(KeyCode::Esc), Cmd::Back),
            (Main, k('h'), Cmd::Back),
            (Main, k('K'), Cmd::Kill),
            (Main, k('S'), Cmd::Sweep),
            (Main, k('w'), Cmd::Rewatch),
            (Main, k('/'), Cmd::Filter),
            (Main, k('s'), Cmd::Sort),
            (Main, k('r'), Cmd::Refresh),
            (Main, k('m'), Cmd::Smem),
            (Main, k('?'), Cmd::Help),
            (Main, k('t'), Cmd::Tree),
            (Main, k('e'), Cmd::Timeline),
            (Main, k('c'), Cmd::Chart),
            (Main, k('J'), Cmd::Jobs),
            (Main, k('n'), Cmd::NextTrouble),
            (Main, k('D'), Cmd::RemoveShm),
            (Dialog, kc(KeyCode::Enter), Cmd::Confirm),
            (Dialog, k('y'), Cmd::Confirm),
            (Dialog, kc(KeyCode::Esc), Cmd::Cancel),
            (Dialog, k('n'), Cmd::Cancel),
            (Dialog, k('q'), Cmd::Cancel),
            (Dialog, kc(KeyCode::Tab), Cmd::NextChoice),
            (Dialog, kc(KeyCode::Right), Cmd::NextChoice),
            (Dialog, k('t'), Cmd::NextChoice),
            (Dialog, kc(KeyCode::Left), Cmd::PrevChoice),
            (Dialog, kc(KeyCode::BackTab), Cmd::PrevChoice),
            (Smem, k('e'), Cmd::EditTile),
            (Smem, kc(KeyCode::Enter), Cmd::EditTile),
            (Smem, k('d'), Cmd::NextDtype),
            (Smem, k('+'), Cmd::MoreStages),
            (Smem, k('-'), Cmd::FewerStages),
            (Edit, kc(KeyCode::Enter), Cmd::Confirm),
            (Edit, kc(KeyCode::Esc), Cmd::Cancel),
            (Edit, kc(KeyCode::Backspace), Cmd::Erase),
        ];
        Keymap {
            map: pairs.into_iter().map(|(l, k, c)| ((l, k), c)).collect(),
        }
    }
}

fn cmd_name(cmd: Cmd) -> &'static str {
    Cmd::ALL
        .iter()
        .find(|(c, ..)| *c == cmd)
        .map_or("?", |(_, _, n, _)| n)
}

impl Keymap {
    /// Defaults with the config's `[keys]` applied; a bound key replaces every default key of that command
    /// (in its layer: `confirm` rebinds Confirm in dialogs, not while typing). A key bound to two commands
    /// of one layer, or a command left without a key, is an error naming both.
    pub fn with_overrides(over: &BTreeMap<String, String>) -> Result<Keymap, KeymapError> {
        let mut km = Keymap::default();
        let mut bound: Vec<(Key, Cmd, &str)> = Vec::new();
        for (name, key) in over {
            let cmd = Cmd::ALL
                .iter()
                .find(|(_, _, n, _)| n == name)
                .map(|(c, ..)| *c)
                .ok_or_else(|| KeymapError::NoSuchCommand {
                    name: name.clone(),
                    known: Cmd::ALL.map(|c| c.2).join(", "),
                })?;
            let parsed = Key::parse(key).ok_or_else(|| KeymapError::BadKey {
                name: name.clone(),
                key: key.clone(),
            })?;
            let layer = cmd.layer();
            km.map.retain(|(l, _), c| !(*l == layer && *c == cmd));
            bound.push((parsed, cmd, name));
        }
        for (key, cmd, name) in bound {
            let at = (cmd.layer(), key);
            if let Some(other) = km.map.get(&at).copied().filter(|o| *o != cmd) {
                return Err(KeymapError::Taken {
                    name: name.to_string(),
                    key: key.label(),
                    other: cmd_name(other),
                });
            }
            km.map.insert(at, cmd);
        }
        if let Some((_, _, name, _)) = Cmd::ALL
            .iter()
            .find(|(c, ..)| !km.map.values().any(|v| v == c))
        {
            return Err(KeymapError::Unbound(name));
        }
        Ok(km)
    }

    /// The command a key gives in this layer: the layer's own keys, then the main screen's (but while text
    /// is typed, only the line's own keys). Ctrl-C always quits.
    pub fn lookup_in(&self, layer: Layer, e: &KeyEvent) -> Option<Cmd> {
        let key = Key::from_event(e);
        if key.ctrl && key.code == KeyCode::Char('c') {
            return Some(Cmd::Quit);
        }
        if let Some(c) = self.map.get(&(layer, key)) {
            return Some(*c);
        }
        if layer == Layer::Edit {
            return None;
        }
        self.map.get(&(Layer::Main, key)).copied()
    }

    /// The main screen's command for a key.
    pub fn lookup(&self, e: &KeyEvent) -> Option<Cmd> {
        self.lookup_in(Layer::Main, e)
    }

    /// The keys bound to a command in a layer, for help and hints ("j/↓", "Enter/y").
    pub fn keys_in(&self, layer: Layer, cmd: Cmd) -> String {
        let mut v: Vec<String> = self
            .map
            .iter()
            .filter(|((l, _), c)| *l == layer && **c == cmd)
            .map(|((_, k), _)| k.label())
            .collect();
        // Characters first on screens ("j/↓", "e/Enter"); named keys first in a dialog ("Enter/y").
        let named_first = matches!(layer, Layer::Dialog | Layer::Edit);
        v.sort_by_key(|s| ((s.chars().count() > 1) != named_first, s.clone()));
        v.join("/")
    }

    /// The main screen's keys for a command.
    pub fn keys_for(&self, cmd: Cmd) -> String {
        self.keys_in(Layer::Main, cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_replace_defaults_and_errors_are_clear() {
        let mut o = BTreeMap::new();
        o.insert("kill".to_string(), "x".to_string());
        let km = Keymap::with_overrides(&o).expect("ok");
        let ev = |c| KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE);
        assert_eq!(km.lookup(&ev('x')), Some(Cmd::Kill));
        assert_eq!(km.lookup(&ev('K')), None);
        assert_eq!(
            km.lookup(&KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)),
            Some(Cmd::Quit)
        );
        o.insert("explode".to_string(), "e".to_string());
        assert!(matches!(
            Keymap::with_overrides(&o),
            Err(KeymapError::NoSuchCommand { .. })
        ));
        o.remove("explode");
        o.insert("confirm".to_string(), "o".to_string());
        let km = Keymap::with_overrides(&o).expect("ok");
        assert_eq!(km.lookup_in(Layer::Dialog, &ev('o')), Some(Cmd::Confirm));
        assert_eq!(km.lookup_in(Layer::Dialog, &ev('y')), None);
        assert_eq!(
            km.lookup_in(
                Layer::Edit,
                &KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE)
            ),
            Some(Cmd::Confirm),
            "typing keeps its own Enter"
        );
        assert_eq!(km.lookup_in(Layer::Edit, &ev('q')), None, "q is text there");
        assert_eq!(
            km.lookup_in(Layer::Smem, &ev('j')),
            Some(Cmd::Down),
            "main keys work in overlays"
        );
        assert_eq!(
            Key::parse("ctrl-r").expect("ok"),
            Key {
                code: KeyCode::Char('r'),
                ctrl: true
            }
        );
        assert!(Key::parse("abc").is_none());
        assert_eq!(Keymap::default().keys_for(Cmd::Down), "j/↓");
    }
}
