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
}
