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

/// The stored form of a key that is sorted and paged by its stored form
/// (state keys): U+0001 becomes U+0001 U+0002 and U+0000 becomes U+0001
/// U+0001. The code is prefix-free and keeps byte order, so comparing
/// stored forms compares the keys themselves.
pub fn escape_ordered(key: &str) -> String {
    if !key.contains(['\0', '\u{1}']) {
        return key.to_owned();
    }
    let mut out = String::with_capacity(key.len() + 8);
    for c in key.chars() {
        match c {
            '\0' => out.push_str("\u{1}\u{1}"),
            '\u{1}' => out.push_str("\u{1}\u{2}"),
            c => out.push(c),
        }
    }
    out
}

/// The key an [`escape_ordered`] form stands for.
pub fn unescape_ordered(stored: String) -> String {
    if !stored.contains('\u{1}') {
        return stored;
    }
    let mut out = String::with_capacity(stored.len());
    let mut chars = stored.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1}' {
            match chars.next() {
                Some('\u{1}') => out.push('\0'),
                _ => out.push('\u{1}'),
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
    fn ordered_keys_round_trip_and_keep_their_order() {
        let mut keys = vec![
            "b", "a", "a\0z", "a!", "a\\", "a\u{1}", "a\u{1}\0", "\0", "", "a\0", "\u{2}",
        ];
        for key in &keys {
            let stored = escape_ordered(key);
            assert!(!stored.contains('\0'));
            assert_eq!(unescape_ordered(stored), *key);
        }
        keys.sort_unstable();
        let mut stored: Vec<String> = keys.iter().map(|k| escape_ordered(k)).collect();
        stored.sort_unstable();
        let back: Vec<String> = stored.into_iter().map(unescape_ordered).collect();
        assert_eq!(back, keys);
    }

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
