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

#[cfg(test)]
mod tests {
    use super::*;

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
