//! Column values of engine rows, borrowed where SQLite holds them.

use crate::store::rows::Content;

/// A text column, borrowed where SQLite holds it.
pub(super) fn text<'a>(row: &'a rusqlite::Row<'_>, column: usize) -> rusqlite::Result<&'a str> {
    row.get_ref(column)?.as_str().map_err(rusqlite::Error::from)
}

/// A nullable blob column, borrowed where SQLite holds it.
pub(super) fn blob<'a>(
    row: &'a rusqlite::Row<'_>,
    column: usize,
) -> rusqlite::Result<Option<&'a [u8]>> {
    row.get_ref(column)?
        .as_blob_or_null()
        .map_err(rusqlite::Error::from)
}

/// The content of a message row whose `body` and `wire` columns are at
/// these positions, borrowed where SQLite holds it.
pub(super) fn content<'a>(
    row: &'a rusqlite::Row<'_>,
    body: usize,
    wire: usize,
) -> rusqlite::Result<Content<'a>> {
    Ok(Content::of(text(row, body)?, blob(row, wire)?))
}
