//! SearchMessages' query: the words to find, and its limits.

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
    fn words_are_split_on_whitespace_and_bounded() -> Result<()> {
        assert_eq!(search_words(" tea\0time \n")?, ["tea", "time"]);
        assert!(search_words(" \0 ").is_err());
        assert!(search_words(&"w ".repeat(MAX_SEARCH_WORDS + 1)).is_err());
        assert_eq!(search_words(&"w ".repeat(MAX_SEARCH_WORDS))?.len(), 32);
        assert!(search_words(&"x".repeat(MAX_SEARCH_LEN + 1)).is_err());
        Ok(())
    }
}
