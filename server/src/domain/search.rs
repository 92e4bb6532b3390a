//! SearchMessages' query: the words to find, and its limits.

use std::borrow::Cow;

use super::{Error, Result};

/// The most words a search may hold.
pub const MAX_SEARCH_WORDS: usize = 32;
/// The longest search query, in bytes.
pub const MAX_SEARCH_LEN: usize = 1024;

/// The words of a search query (split on whitespace; U+0000 counts as
/// whitespace), refusing an empty, too long or too wordy query.
pub fn search_words(query: &str) -> Result<Vec<String>> {
    if query.len() > MAX_SEARCH_LEN {
        return Err(Error::invalid(
            "query",
            format!("must be at most {MAX_SEARCH_LEN} bytes"),
        ));
    }
    let words: Vec<String> = query
        .replace('\0', " ")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    if words.is_empty() {
        return Err(Error::invalid("query", "is required: give words to find"));
    }
    if words.len() > MAX_SEARCH_WORDS {
        return Err(Error::invalid(
            "query",
            format!("must hold at most {MAX_SEARCH_WORDS} words"),
        ));
    }
    Ok(words)
}

/// The most words of a snippet cut by [`snippet`].
const SNIPPET_WORDS: usize = 24;
/// How many words a snippet shows before its first match, at most.
const SNIPPET_LEAD: usize = 8;

/// A search hit's snippet cut from the message's searchable text: up to
/// 24 words from a few before the first word that matches the query, each
/// matching word marked `**…**`, with `…` where the text was cut. Words are
/// what PostgreSQL's `simple` parser makes of them: runs of letters and
/// digits, compared case-insensitively; so are the query's.
pub fn snippet(text: &str, query: &[String]) -> String {
    let wanted: Vec<String> = query
        .iter()
        .flat_map(|word| words(word).map(|(_, w)| w.to_lowercase()))
        .collect();
    let found: Vec<(usize, &str)> = words(text).collect();
    let matches = |word: &str| wanted.iter().any(|w| *w == word.to_lowercase());
    let first = found
        .iter()
        .position(|(_, word)| matches(word))
        .unwrap_or(0);
    let start = first.saturating_sub(SNIPPET_LEAD);
    let end = found.len().min(start + SNIPPET_WORDS);
    let mut out = String::new();
    if start > 0 {
        out.push('…');
    }
    let Some(&(from, _)) = found.get(start) else {
        return out;
    };
    let mut at = from;
    for &(offset, word) in &found[start..end] {
        out.push_str(&text[at..offset]);
        if matches(word) {
            out.push_str("**");
            out.push_str(word);
            out.push_str("**");
        } else {
            out.push_str(word);
        }
        at = offset + word.len();
    }
    if end < found.len() {
        out.push('…');
    }
    out
}

/// The longest word the index keeps, in bytes: PostgreSQL refuses longer
/// lexemes (its `MAXSTRLEN` is 2,047), and `to_tsvector` skipped them too.
const MAX_LEXEME_BYTES: usize = 2046;
/// The highest position a word is recorded at (PostgreSQL's `MAXENTRYPOS`
/// less one): later words all count as this one, as they did before.
const MAX_POSITION: u16 = 16_383;
/// The most positions kept per word (PostgreSQL's `MAXNUMPOS`).
const MAX_POSITIONS: usize = 256;
/// The most bytes one message's words and positions take in a `tsvector`:
/// PostgreSQL refuses a larger one. The words (in their order) past it are
/// not indexed; `to_tsvector` failed the whole write instead.
const MAX_STORED_BYTES: usize = (1 << 20) - 1;

/// The words a message's searchable `text` is found by, in PostgreSQL's
/// `tsvector` input syntax (`'tea':1,4 'time':2`): the words [`snippet`]
/// sees (runs of letters and digits), lowercased, each with the positions
/// (from 1) where it occurs. Empty when the text holds no word.
///
/// Built here, not by `to_tsvector` in the database, for two reasons:
/// PostgreSQL's parser was the largest single cost of an indexed append on
/// that side (BENCHMARKS.md), and it split words its own way (an e-mail
/// address, a path or a hyphenated word also stayed whole), so a word that
/// SQLite's index and the snippets found could be missed there. Queries
/// are split the same way ([`tsquery`]).
pub fn tsvector(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 2);
    each_lexeme(text, |word, positions| {
        if !out.is_empty() {
            out.push(' ');
        }
        push_quoted(&mut out, word);
        for (index, &at) in positions.iter().enumerate() {
            out.push(if index == 0 { ':' } else { ',' });
            push_number(&mut out, usize::from(at));
        }
    });
    out
}

/// The same words as [`tsvector`], in PostgreSQL's binary form of a
/// `tsvector` (what its `tsvectorrecv` reads: the count of words, then
/// each word NUL-terminated, the count of its positions and each position,
/// big-endian). A writer that binds it as a `tsvector` spares the
/// database parsing the text form, a sixth of PostgreSQL's CPU in an
/// append run with search on (BENCHMARKS.md). The words come sorted as
/// PostgreSQL sorts them and each one's positions ascending, as it
/// requires; none holds a NUL (they are letters and digits).
pub fn tsvector_binary(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + text.len() + text.len() / 2);
    out.extend_from_slice(&[0; 4]);
    let mut count: u32 = 0;
    each_lexeme(text, |word, positions| {
        out.extend_from_slice(word.as_bytes());
        out.push(0);
        // At most MAX_POSITIONS (256) positions, each at most MAX_POSITION.
        out.extend_from_slice(&u16::try_from(positions.len()).unwrap_or(0).to_be_bytes());
        for at in positions {
            out.extend_from_slice(&at.to_be_bytes());
        }
        count += 1;
    });
    out[..4].copy_from_slice(&count.to_be_bytes());
    out
}

/// Calls `lexeme` with each word of `text` (split and lowercased as
/// [`tsvector`] says), in PostgreSQL's order of a `tsvector`'s words
/// (bytewise), and its positions, ascending: as many as PostgreSQL keeps,
/// and only the words that fit in one `tsvector`.
fn each_lexeme(text: &str, mut lexeme: impl FnMut(&str, &[u16])) {
    // (the word's first bytes as a number, the word, its position): sorted
    // by the first two, as PostgreSQL orders a tsvector's words (bytewise),
    // mostly by comparing numbers.
    let mut found: Vec<(u64, Cow<'_, str>, u16)> = Vec::with_capacity(text.len() / 4);
    let mut position: u16 = 0;
    for (_, word) in words(text) {
        let word = lowercase(word);
        if word.len() > MAX_LEXEME_BYTES {
            continue;
        }
        position = (position + 1).min(MAX_POSITION);
        let mut prefix = [0_u8; 8];
        let head = &word.as_bytes()[..word.len().min(8)];
        prefix[..head.len()].copy_from_slice(head);
        found.push((u64::from_be_bytes(prefix), word, position));
    }
    found.sort_unstable();
    let mut stored = 0;
    let mut positions = Vec::new();
    let mut rest = found.as_slice();
    while let Some((_, word, _)) = rest.first() {
        let count = rest.iter().take_while(|(_, w, _)| w == word).count();
        let (same, after) = rest.split_at(count);
        rest = after;
        positions.clear();
        for &(_, _, at) in same {
            // Positions past the last one all count as the last one.
            if positions.last() != Some(&at) && positions.len() < MAX_POSITIONS {
                positions.push(at);
            }
        }
        // What PostgreSQL stores for it: the word (to an even length),
        // the count of its positions and each position, two bytes each.
        stored += word.len().next_multiple_of(2) + 2 + 2 * positions.len();
        if stored > MAX_STORED_BYTES {
            break;
        }
        lexeme(word, &positions);
    }
}

/// A search's words as a PostgreSQL `tsquery` every word of which a
/// message must hold (`'tea' & 'time'`), split and lowercased as
/// [`tsvector`] splits a message's text. Empty when they hold no word
/// (a query of punctuation alone), which finds nothing.
pub fn tsquery(query: &[String]) -> String {
    let mut out = String::new();
    for word in query.iter().flat_map(|word| words(word)) {
        let word = lowercase(word.1);
        if word.len() > MAX_LEXEME_BYTES {
            continue;
        }
        if !out.is_empty() {
            out.push_str(" & ");
        }
        push_quoted(&mut out, &word);
    }
    out
}

/// Writes `n` in decimal (as `write!` would, without its machinery: a
/// message's words have a position each).
fn push_number(out: &mut String, n: usize) {
    let mut digits = [0_u8; 20];
    let mut at = digits.len();
    let mut n = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &digit in &digits[at..] {
        out.push(char::from(digit));
    }
}

/// `word` lowercased, borrowed where it already is (most words).
fn lowercase(word: &str) -> Cow<'_, str> {
    if word.is_ascii() && !word.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Borrowed(word)
    } else {
        Cow::Owned(word.to_lowercase())
    }
}

/// `word` quoted for PostgreSQL's `tsvector` and `tsquery` input: within
/// single quotes, a quote or a backslash is escaped by a backslash (the
/// words here are letters and digits, so this is only a safeguard).
fn push_quoted(out: &mut String, word: &str) {
    out.push('\'');
    if word.contains(['\'', '\\']) {
        for c in word.chars() {
            if c == '\'' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
    } else {
        out.push_str(word);
    }
    out.push('\'');
}

/// The words of `text` (runs of letters and digits) with their byte offsets.
fn words(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
        .map(move |word| (word.as_ptr() as usize - text.as_ptr() as usize, word))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn a_snippet_marks_every_match_and_keeps_the_text_between() {
        let text = "Penguins' Habitat: cold coasts.\nThe habitat matters.";
        assert_eq!(
            snippet(text, &query(&["HABITAT"])),
            "Penguins' **Habitat**: cold coasts.\nThe **habitat** matters"
        );
    }

    #[test]
    fn a_long_text_is_cut_around_the_first_match() {
        let text: Vec<String> = (0..100).map(|i| format!("w{i}")).collect();
        let cut = snippet(&text.join(" "), &query(&["w50"]));
        assert!(cut.starts_with("…w42 "), "{cut}");
        assert!(cut.contains(" **w50** "), "{cut}");
        assert!(cut.ends_with(" w65…"), "{cut}");
        // No match (a word only the index's parser split differently): the start.
        let start = snippet(&text.join(" "), &query(&["nowhere"]));
        assert!(
            start.starts_with("w0 w1 ") && start.ends_with(" w23…"),
            "{start}"
        );
    }

    #[test]
    fn query_words_are_split_as_the_text_is() {
        assert_eq!(
            snippet("don't stop", &query(&["don't"])),
            "**don**'**t** stop"
        );
        assert_eq!(snippet("", &query(&["x"])), "");
        assert_eq!(
            snippet("ünïcode WÖRDS", &query(&["wörds"])),
            "ünïcode **WÖRDS**"
        );
    }

    #[test]
    fn a_texts_words_are_lowercased_with_their_positions() {
        assert_eq!(tsvector("Tea time, TEA!"), "'tea':1,3 'time':2");
        // Split where the snippets split: an address is three words.
        assert_eq!(
            tsvector("mail ann@example.com"),
            "'ann':2 'com':4 'example':3 'mail':1"
        );
        assert_eq!(tsvector("Ünïcode wörds"), "'wörds':2 'ünïcode':1");
        assert_eq!(tsvector(" ,;- "), "");
        // A word too long to index is skipped and takes no position.
        let long = "x".repeat(MAX_LEXEME_BYTES + 1);
        assert_eq!(tsvector(&format!("a {long} b")), "'a':1 'b':2");
    }

    #[test]
    fn positions_are_bounded_as_postgres_bounds_them() {
        // At most 256 positions a word; past 16,383 every word is at 16,383.
        let text = "w ".repeat(usize::from(MAX_POSITION) + 10);
        let entry = tsvector(&text);
        let positions: Vec<&str> = entry["'w':".len()..].split(',').collect();
        assert_eq!(positions.len(), MAX_POSITIONS);
        assert_eq!(positions[..3], ["1", "2", "3"]);
        let late = format!("{}a b", "w ".repeat(usize::from(MAX_POSITION) + 10));
        assert!(tsvector(&late).starts_with("'a':16383 'b':16383 'w':1,2,"));
    }

    #[test]
    fn the_binary_form_holds_the_same_words_as_the_text_form() {
        let text = "Tea time, TEA";
        assert_eq!(tsvector(text), "'tea':1,3 'time':2");
        let mut expected = 2_u32.to_be_bytes().to_vec();
        expected.extend_from_slice(b"tea\0");
        expected.extend_from_slice(&[0, 2, 0, 1, 0, 3]);
        expected.extend_from_slice(b"time\0");
        expected.extend_from_slice(&[0, 1, 0, 2]);
        assert_eq!(tsvector_binary(text), expected);
        // No word: no entry.
        assert_eq!(tsvector_binary("..."), 0_u32.to_be_bytes());
        // The bounds are the text form's: as many words, as many positions.
        let late = format!("{}a b", "w ".repeat(usize::from(MAX_POSITION) + 10));
        let binary = tsvector_binary(&late);
        assert_eq!(binary[..4], 3_u32.to_be_bytes());
        assert_eq!(binary[4..10], [b'a', 0, 0, 1, 0x3f, 0xff]);
        let words: Vec<String> = (0..131_000).map(|i| format!("w{i:07}")).collect();
        let words = words.join(" ");
        let count = tsvector(&words).split(' ').count();
        assert_eq!(
            tsvector_binary(&words)[..4],
            u32::try_from(count).unwrap_or(u32::MAX).to_be_bytes()
        );
    }

    #[test]
    fn an_entry_stops_where_postgres_would_refuse_it() {
        // 131,000 words of 8 bytes, one position each: 1,572,000 bytes.
        let text: Vec<String> = (0..131_000).map(|i| format!("w{i:07}")).collect();
        let entry = tsvector(&text.join(" "));
        let kept = entry.split(' ').count();
        // Each takes 8 bytes, 2 for its count of positions and 2 for one.
        assert_eq!(kept, MAX_STORED_BYTES / 12);
        assert!(entry.starts_with("'w0000000':1 'w0000001':2 "));
    }

    #[test]
    fn a_query_needs_every_word_split_as_texts_are() {
        assert_eq!(tsquery(&query(&["Tea-Time", "x"])), "'tea' & 'time' & 'x'");
        assert_eq!(tsquery(&query(&["!!", "?"])), "");
    }

    #[test]
    fn words_are_split_on_whitespace_and_bounded() -> Result<()> {
        assert_eq!(search_words(" tea\0time \n")?, ["tea", "time"]);
        assert!(search_words(" \0 ").is_err());
        assert!(search_words(&"w ".repeat(MAX_SEARCH_WORDS + 1)).is_err());
        assert_eq!(search_words(&"w ".repeat(MAX_SEARCH_WORDS))?.len(), 32);
        assert!(search_words(&"x".repeat(MAX_SEARCH_LEN + 1)).is_err());
        Ok(())
    }
}
