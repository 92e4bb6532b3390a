//! ListSessions' `filter`: a small subset of AIP-160.
//!
//! Terms `user = "…"` and `metadata.KEY = "…"`, joined by upper-case
//! `AND`. Values are always double-quoted, with `\"` and `\\` escapes;
//! `KEY` is letters, digits and `_ - . /`. Anything else (unquoted values,
//! `and`, `OR`, `!=`, other fields) is refused, naming the filter.

use super::{Error, Result};

/// The field errors name.
const FIELD: &str = "filter";

/// The longest filter accepted.
pub const MAX_FILTER_LEN: usize = 4096;

/// A parsed filter: every term must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionFilter {
    /// `user = "…"`.
    pub user: Option<String>,
    /// `metadata.KEY = "…"` terms, in the order written.
    pub metadata: Vec<(String, String)>,
}

impl SessionFilter {
    /// Parses `text`; an empty (or all-blank) filter matches every session.
    pub fn parse(text: &str) -> Result<SessionFilter> {
        if text.len() > MAX_FILTER_LEN {
            return Err(Error::invalid(
                FIELD,
                format!("must be at most {MAX_FILTER_LEN} bytes"),
            ));
        }
        let mut filter = SessionFilter::default();
        let mut rest = text.trim_start();
        if rest.is_empty() {
            return Ok(filter);
        }
        loop {
            let (name, after_name) = field_name(rest)?;
            let after_eq = after_name
                .trim_start()
                .strip_prefix('=')
                .ok_or_else(|| refuse(format!("expects `=` after {name:?}")))?;
            let (value, after_value) = quoted(after_eq.trim_start())?;
            match name.strip_prefix("metadata.") {
                Some(key) if valid_key(key) => filter.metadata.push((key.to_owned(), value)),
                Some(key) => {
                    return Err(refuse(format!(
                        "metadata key {key:?} may hold only letters, digits and _ - . /"
                    )));
                }
                None if name == "user" => {
                    if filter.user.replace(value).is_some() {
                        return Err(refuse("names `user` twice".to_owned()));
                    }
                }
                None => {
                    return Err(refuse(format!(
                        "cannot filter on {name:?}: only `user` and `metadata.KEY`"
                    )));
                }
            }
            rest = after_value.trim_start();
            if rest.is_empty() {
                return Ok(filter);
            }
            rest = rest
                .strip_prefix("AND")
                .filter(|after| after.starts_with(char::is_whitespace))
                .ok_or_else(|| {
                    refuse(format!(
                        "terms are joined only by upper-case `AND`, not {:?}",
                        rest.split_whitespace().next().unwrap_or(rest)
                    ))
                })?
                .trim_start();
        }
    }

    /// Whether the filter restricts anything.
    pub fn is_empty(&self) -> bool {
        self.user.is_none() && self.metadata.is_empty()
    }
}

fn refuse(reason: String) -> Error {
    Error::invalid(FIELD, reason)
}

/// A field name: `user` or `metadata.KEY`, up to the first blank or `=`.
fn field_name(text: &str) -> Result<(&str, &str)> {
    let end = text
        .find(|c: char| c.is_whitespace() || c == '=')
        .unwrap_or(text.len());
    let (name, rest) = text.split_at(end);
    if name.is_empty() {
        return Err(refuse(
            "expects a field name, `user` or `metadata.KEY`".to_owned(),
        ));
    }
    Ok((name, rest))
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 256
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/'))
}

/// A double-quoted value with `\"` and `\\` escapes, and what follows it.
fn quoted(text: &str) -> Result<(String, &str)> {
    let Some(body) = text.strip_prefix('"') else {
        return Err(refuse("values must be double-quoted".to_owned()));
    };
    let mut value = String::new();
    let mut chars = body.char_indices();
    while let Some((at, c)) = chars.next() {
        match c {
            '"' => return Ok((value, &body[at + 1..])),
            '\\' => match chars.next() {
                Some((_, escaped @ ('"' | '\\'))) => value.push(escaped),
                _ => {
                    return Err(refuse(
                        "only `\\\"` and `\\\\` escapes are allowed".to_owned(),
                    ));
                }
            },
            c => value.push(c),
        }
    }
    Err(refuse("has an unterminated quoted value".to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(error: Error) -> String {
        match error {
            Error::InvalidArgument { field, .. } => field,
            other => panic!("not INVALID_ARGUMENT: {other:?}"),
        }
    }

    #[test]
    fn terms_parse() -> Result<()> {
        assert!(SessionFilter::parse("")?.is_empty());
        assert!(SessionFilter::parse("  ")?.is_empty());
        let filter = SessionFilter::parse(
            r#"user = "alice" AND metadata.app = "weather"  AND metadata.tier="a \"b\" \\""#,
        )?;
        assert_eq!(filter.user.as_deref(), Some("alice"));
        assert_eq!(
            filter.metadata,
            [
                ("app".to_owned(), "weather".to_owned()),
                ("tier".to_owned(), r#"a "b" \"#.to_owned()),
            ]
        );
        let filter = SessionFilter::parse(r#"metadata.x/y = "" "#)?;
        assert_eq!(filter.metadata, [("x/y".to_owned(), String::new())]);
        Ok(())
    }

    #[test]
    fn anything_else_is_refused_naming_the_filter() {
        for text in [
            r#"user = alice"#,
            r#"user = "a" and metadata.x = "b""#,
            r#"user = "a" OR user = "b""#,
            r#"user != "a""#,
            r#"title = "a""#,
            r#"metadata. = "a""#,
            r#"metadata.a b = "a""#,
            r#"user = "a" AND"#,
            r#"user = "a"AND user = "b""#,
            r#"user = "a"#,
            r#"user = "a\n""#,
            r#"user = "a" user = "b""#,
            r#"user = "a" AND user = "b""#,
            r#"= "a""#,
        ] {
            let error = SessionFilter::parse(text).expect_err(text);
            assert_eq!(field_of(error), "filter", "{text}");
        }
    }
}
