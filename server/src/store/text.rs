//! A reversible escape for free-text columns, so any Unicode (U+0000
//! included, which PostgreSQL's TEXT rejects) is stored losslessly by every
//! backend, and equality filters still work on the stored form.
//!
//! `\` becomes `\\` and U+0000 becomes `\0`; nothing else changes.

/// The stored form of `text`.
pub fn escape(text: &str) -> String {
    if !text.contains(['\\', '\0']) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\0' => out.push_str("\\0"),
            c => out.push(c),
        }
    }
    out
}

/// The text a stored form stands for.
pub fn unescape(stored: String) -> String {
    if !stored.contains('\\') {
        return stored;
    }
    let mut out = String::with_capacity(stored.len());
    let mut chars = stored.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('0') => out.push('\0'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_leaves_plain_text_alone() {
        for text in [
            "plain",
            "",
            "a\0b",
            "back\\slash\\0",
            "\\",
            "\0\0",
            "🦀\\\0",
        ] {
            let stored = escape(text);
            assert!(!stored.contains('\0'));
            assert_eq!(unescape(stored), text);
        }
    }
}
