//! Keys -> commands. Defaults are vim keys and arrows; the config file's `[keys]` table rebinds any command
//! (`kill = "x"`). Ctrl-C always quits.

use std::collections::{BTreeMap, HashMap};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

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
    RemoveShm,
}

impl Cmd {
    pub const ALL: [(Cmd, &'static str, &'static str); 19] = [
        (Cmd::Up, "up", "move up"),
        (Cmd::Down, "down", "move down"),
        (Cmd::NextPanel, "next_panel", "next panel"),
        (Cmd::PrevPanel, "prev_panel", "previous panel"),
        (Cmd::Open, "open", "open the selected host"),
        (Cmd::Back, "back", "back / close"),
        (Cmd::Kill, "kill", "kill the selected process (dialog)"),
        (
            Cmd::Sweep,
            "sweep",
            "sweep the selected GPU, host or everything (dialog)",
        ),
        (
            Cmd::Rewatch,
            "rewatch",
            "re-watch: fast polling until every GPU reads zero",
        ),
        (Cmd::Filter, "filter", "filter processes"),
        (Cmd::Sort, "sort", "change the process sort"),
        (
            Cmd::Refresh,
            "refresh",
            "refresh now (reconnects down hosts)",
        ),
        (Cmd::Smem, "smem", "shared-memory panel and tile calculator"),
        (
            Cmd::Timeline,
            "timeline",
            "timeline: what happened, with times",
        ),
        (Cmd::Chart, "chart", "memory chart of the host (or GPU)"),
        (
            Cmd::RemoveShm,
            "remove_shm",
            "remove the host's /dev/shm leftovers (dialog)",
        ),
        (Cmd::Tree, "tree", "toggle the process tree"),
        (Cmd::Help, "help", "this help"),
        (Cmd::Quit, "quit", "quit"),
    ];
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
    pub fn parse(s: &str) -> Result<Key, String> {
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
                KeyCode::F(f[1..].parse().map_err(|_| format!("bad key {s:?}"))?)
            }
            _ => {
                let mut chars = rest.chars();
                match (chars.next(), chars.next()) {
                    (Some(c), None) => KeyCode::Char(c),
                    _ => {
                        return Err(format!(
                            "bad key {s:?} (use a character, ctrl-x, tab, enter, esc, up, f5...)"
                        ));
                    }
                }
            }
        };
        Ok(Key { code, ctrl })
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

#[derive(Debug, Clone)]
pub struct Keymap {
    map: HashMap<Key, Cmd>,
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
        let pairs = [
            (k('q'), Cmd::Quit),
            (k('k'), Cmd::Up),
            (kc(KeyCode::Up), Cmd::Up),
            (k('j'), Cmd::Down),
            (kc(KeyCode::Down), Cmd::Down),
            (kc(KeyCode::Tab), Cmd::NextPanel),
            (kc(KeyCode::BackTab), Cmd::PrevPanel),
            (kc(KeyCode::Enter), Cmd::Open),
            (k('l'), Cmd::Open),
            (kc(KeyCode::Esc), Cmd::Back),
            (k('h'), Cmd::Back),
            (k('K'), Cmd::Kill),
            (k('S'), Cmd::Sweep),
            (k('w'), Cmd::Rewatch),
            (k('/'), Cmd::Filter),
            (k('s'), Cmd::Sort),
            (k('r'), Cmd::Refresh),
            (k('m'), Cmd::Smem),
            (k('?'), Cmd::Help),
            (k('t'), Cmd::Tree),
            (k('e'), Cmd::Timeline),
            (k('c'), Cmd::Chart),
            (k('D'), Cmd::RemoveShm),
        ];
        Keymap {
            map: pairs.into_iter().collect(),
        }
    }
}

fn cmd_name(cmd: Cmd) -> &'static str {
    Cmd::ALL
        .iter()
        .find(|(c, _, _)| *c == cmd)
        .map_or("?", |(_, n, _)| n)
}

impl Keymap {
    /// Defaults with the config's `[keys]` applied; a bound key replaces every default key of that command.
    /// A key bound to two commands, or a command left without a key, is an error naming both.
    pub fn with_overrides(over: &BTreeMap<String, String>) -> Result<Keymap, String> {
        let mut km = Keymap::default();
        let mut bound: Vec<(Key, Cmd, &str)> = Vec::new();
        for (name, key) in over {
            let cmd = Cmd::ALL
                .iter()
                .find(|(_, n, _)| n == name)
                .map(|(c, _, _)| *c)
                .ok_or_else(|| {
                    format!(
                        "[keys] {name:?}: no such command (one of {})",
                        Cmd::ALL.map(|c| c.1).join(", ")
                    )
                })?;
            let key = Key::parse(key).map_err(|e| format!("[keys] {name}: {e}"))?;
            km.map.retain(|_, c| *c != cmd);
            bound.push((key, cmd, name));
        }
        for (key, cmd, name) in bound {
            if let Some(other) = km.map.get(&key).copied().filter(|o| *o != cmd) {
                return Err(format!(
                    "[keys] {name} = {:?}: that key is already {}'s; bind {} to another key too, or choose another",
                    key.label(),
                    cmd_name(other),
                    cmd_name(other)
                ));
            }
            km.map.insert(key, cmd);
        }
        if let Some((_, name, _)) = Cmd::ALL
            .iter()
            .find(|(c, _, _)| !km.map.values().any(|v| v == c))
        {
            return Err(format!("[keys]: {name} has no key left"));
        }
        Ok(km)
    }

    pub fn lookup(&self, e: &KeyEvent) -> Option<Cmd> {
        let key = Key::from_event(e);
        if key.ctrl && key.code == KeyCode::Char('c') {
            return Some(Cmd::Quit);
        }
        self.map.get(&key).copied()
    }

    /// The keys bound to a command, for help and hints ("j/↓").
    pub fn keys_for(&self, cmd: Cmd) -> String {
        let mut v: Vec<String> = self
            .map
            .iter()
            .filter(|(_, c)| **c == cmd)
            .map(|(k, _)| k.label())
            .collect();
        v.sort_by_key(|s| (s.chars().count() > 1, s.clone()));
        v.join("/")
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
        assert!(
            Keymap::with_overrides(&o)
                .unwrap_err()
                .contains("no such command")
        );
        assert_eq!(
            Key::parse("ctrl-r").expect("ok"),
            Key {
                code: KeyCode::Char('r'),
                ctrl: true
            }
        );
        assert!(Key::parse("abc").is_err());
        assert_eq!(Keymap::default().keys_for(Cmd::Down), "j/↓");
    }
}
