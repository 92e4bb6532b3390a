//! AIP-158 paging: page sizes and opaque page tokens.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::{Error, Result};

/// The page size when a request asks for 0 (or the maximum, if smaller).
pub const DEFAULT_PAGE_SIZE: usize = 50;

/// Applies AIP-158: 0 means the default, above `max` (the server's
/// `--max-page-size`) means `max`, negative is invalid.
pub fn page_size(requested: i32, max: usize) -> Result<usize> {
    let max = max.max(1);
    match requested {
        n if n < 0 => Err(Error::invalid("page_size", "must not be negative")),
        0 => Ok(DEFAULT_PAGE_SIZE.min(max)),
        n => Ok(usize::try_from(n).unwrap_or(max).min(max)),
    }
}

/// Encodes a cursor as an opaque token. `kind` ties a token to the list it
/// came from, so a token from another list is rejected.
pub fn encode_token(kind: &str, parts: &[&str]) -> String {
    let mut plain = String::from(kind);
    for part in parts {
        plain.push('\u{1f}');
        plain.push_str(part);
    }
    URL_SAFE_NO_PAD.encode(plain)
}

/// Decodes a token made by [`encode_token`] with the same `kind` into its
/// parts. An empty token is `None`.
pub fn decode_token(kind: &str, token: &str, expected_parts: usize) -> Result<Option<Vec<String>>> {
    if token.is_empty() {
        return Ok(None);
    }
    let invalid = || Error::invalid("page_token", "is not a token returned by this list");
    let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| invalid())?;
    let plain = String::from_utf8(bytes).map_err(|_| invalid())?;
    let mut parts = plain.split('\u{1f}');
    if parts.next() != Some(kind) {
        return Err(invalid());
    }
    let parts: Vec<String> = parts.map(str::to_owned).collect();
    if parts.len() != expected_parts {
        return Err(invalid());
    }
    Ok(Some(parts))
}

/// Parses one integer part of a decoded token.
pub fn token_int(part: &str) -> Result<i64> {
    part.parse()
        .map_err(|_| Error::invalid("page_token", "is not a token returned by this list"))
}

/// One list request's paging: its page size, and the tokens it takes and
/// gives. A token names the list (`kind`), the request's filters it was
/// made for, and the cursor: the last item's position, in one or more
/// parts. A token for another list, or for other filters, is refused
/// (`mismatch` says how), so a cursor is only ever read against the query
/// that produced it.
pub struct Pages<'a> {
    kind: &'static str,
    filters: Vec<&'a str>,
    mismatch: &'static str,
    /// Items a page holds at most.
    pub limit: usize,
}

impl<'a> Pages<'a> {
    /// Paging for a request of `page_size` ([`page_size`]), on the list
    /// `kind` with these `filters`.
    pub fn new(
        kind: &'static str,
        filters: Vec<&'a str>,
        mismatch: &'static str,
        page_size_asked: i32,
        max_page_size: usize,
    ) -> Result<Self> {
        Ok(Pages {
            kind,
            filters,
            mismatch,
            limit: page_size(page_size_asked, max_page_size)?,
        })
    }

    /// Paging over one session's list: its filter is the session id.
    pub fn of_session(
        kind: &'static str,
        session_id: &'a str,
        page_size_asked: i32,
        max_page_size: usize,
    ) -> Result<Self> {
        Pages::new(
            kind,
            vec![session_id],
            "was made for a different session",
            page_size_asked,
            max_page_size,
        )
    }

    /// Items to read: one past the page, to know whether another follows.
    pub fn fetch(&self) -> usize {
        self.limit + 1
    }

    /// The cursor `token` holds, in `parts` parts (`None` for no token).
    pub fn after_parts(&self, token: &str, parts: usize) -> Result<Option<Vec<String>>> {
        let Some(mut all) = decode_token(self.kind, token, self.filters.len() + parts)? else {
            return Ok(None);
        };
        let cursor = all.split_off(self.filters.len());
        if all
            .iter()
            .zip(&self.filters)
            .any(|(held, asked)| held != asked)
        {
            return Err(Error::invalid("page_token", self.mismatch));
        }
        Ok(Some(cursor))
    }

    /// A one-part cursor.
    pub fn after(&self, token: &str) -> Result<Option<String>> {
        Ok(self
            .after_parts(token, 1)?
            .and_then(|mut parts| parts.pop()))
    }

    /// A one-part integer cursor.
    pub fn after_int(&self, token: &str) -> Result<Option<i64>> {
        self.after(token)?.map(|part| token_int(&part)).transpose()
    }

    /// A (time, id) cursor: a list ordered by a time, ties by id.
    pub fn after_time_and_id(&self, token: &str) -> Result<Option<(i64, String)>> {
        match self.after_parts(token, 2)?.as_deref() {
            Some([time, id]) => Ok(Some((token_int(time)?, id.clone()))),
            _ => Ok(None),
        }
    }

    /// An offset cursor: 0 without a token.
    pub fn after_offset(&self, token: &str) -> Result<usize> {
        match self.after_int(token)? {
            None => Ok(0),
            Some(offset) => {
                usize::try_from(offset).map_err(|_| Error::invalid("page_token", "is malformed"))
            }
        }
    }

    /// Cuts `items`, read with [`Pages::fetch`], back to the page and
    /// returns the token of the next page, whose cursor `cursor` gives of
    /// the page's last item (empty at the end).
    pub fn next<T>(&self, items: &mut Vec<T>, cursor: impl FnOnce(&T) -> Vec<String>) -> String {
        if items.len() <= self.limit {
            return String::new();
        }
        items.truncate(self.limit);
        items.last().map_or_else(String::new, |last| {
            let cursor = cursor(last);
            let parts: Vec<&str> = self
                .filters
                .iter()
                .copied()
                .chain(cursor.iter().map(String::as_str))
                .collect();
            encode_token(self.kind, &parts)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_sizes_follow_aip_158() {
        assert_eq!(page_size(0, 1000).ok(), Some(50));
        assert_eq!(page_size(7, 1000).ok(), Some(7));
        assert_eq!(page_size(5000, 1000).ok(), Some(1000));
        assert_eq!(page_size(0, 10).ok(), Some(10));
        assert!(page_size(-1, 1000).is_err());
    }

    #[test]
    fn tokens_round_trip_and_reject_foreign_kinds() {
        let token = encode_token("messages", &["ses_1", "42"]);
        let parts = decode_token("messages", &token, 2).ok().flatten();
        assert_eq!(parts, Some(vec!["ses_1".to_owned(), "42".to_owned()]));
        assert!(decode_token("calls", &token, 2).is_err());
        assert!(decode_token("messages", "%%%", 2).is_err());
        assert!(matches!(decode_token("messages", "", 2), Ok(None)));
    }

    #[test]
    fn pages_refuse_tokens_for_other_filters_and_cut_pages() -> Result<()> {
        let pages = Pages::new("state", vec!["ses_1", ""], "other", 2, 1000)?;
        assert_eq!(pages.fetch(), 3);
        let mut items = vec![1, 2, 3];
        let token = pages.next(&mut items, |last| vec![last.to_string()]);
        assert_eq!(items, vec![1, 2]);
        assert_eq!(pages.after_int(&token).ok().flatten(), Some(2));
        let other = Pages::new("state", vec!["ses_2", ""], "other", 2, 1000)?;
        assert!(other.after(&token).is_err());
        let mut short = vec![1];
        assert_eq!(pages.next(&mut short, |last| vec![last.to_string()]), "");
        assert!(matches!(pages.after(""), Ok(None)));
        Ok(())
    }
}
