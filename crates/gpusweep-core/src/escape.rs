//! Untrusted text made safe for a terminal and for a suggested shell command.

/// Whether a character may not reach a terminal raw: controls (C0, DEL, C1) and the bidi controls that
/// reorder what follows them.
fn is_hostile(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{061c}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Untrusted text (cmdlines, file names, what a remote sends) made safe for a terminal: every control or
/// bidi character is written as an escape (`\x1b`, `\n`, `\u{202e}`), so it shows and does nothing.
pub fn escape(s: &str) -> std::borrow::Cow<'_, str> {
    // Printable ASCII, what nearly every label is, is checked a byte at a time (every reading's labels pass
    // here); anything else is decoded and checked character by character.
    if s.bytes().all(|b| (0x20..0x7f).contains(&b)) || !s.chars().any(is_hostile) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if is_hostile(c) && u32::from(c) < 0x100 => {
                out.push_str(&format!("\\x{:02x}", u32::from(c)));
            }
            c if is_hostile(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Single-quote for a POSIX shell, for commands gpusweep suggests (`rm -- '/dev/shm/...'`).
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
