//! Rows and their codecs: the column lists, reading sessions and messages
//! from sqlx's rows or the SQLite engine's, the JSON bodies, and event rows
//! in either of their forms. Shared by both backends' reads and writes.

use sqlx::Row;
use sqlx::any::AnyRow;

use super::text::unescape;
use crate::domain::{Change, Error, Result, Session, SessionEvent, StoredMessage, Timestamp};
use crate::wire::EncodedEvent;

pub fn encode<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(Error::storage)
}

pub fn decode<T: serde::de::DeserializeOwned>(text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(Error::storage)
}

/// An event row as the log holds it: its encoding (`wire`), or, for an
/// event written before the log kept encodings, its JSON (`body`), which
/// is encoded here so every reader sees one form.
pub fn logged_event(
    revision: i64,
    time: i64,
    body: &str,
    wire: Option<&[u8]>,
) -> Result<EncodedEvent> {
    match wire {
        Some(wire) => EncodedEvent::stored(revision, wire),
        None => Ok(EncodedEvent::new(SessionEvent {
            revision,
            time: Timestamp(time),
            change: decode(body)?,
        })),
    }
}

/// The change an event row records, in either form (as [`logged_event`]).
pub fn logged_change(body: &str, wire: Option<&[u8]>) -> Result<Change> {
    match wire {
        Some(wire) => Ok(EncodedEvent::stored(0, wire)?.decode()?.change),
        None => decode(body),
    }
}

/// Reads an escaped text column.
pub fn text_col(row: &AnyRow, column: &str) -> Result<String> {
    Ok(unescape(row.try_get::<String, _>(column)?))
}

/// The session columns [`session_from_row`] reads.
pub const SESSION_COLUMNS: &str = "key, id, title, system_prompt, user_name, metadata, \
     summary_message_id, revision, create_time, update_time, next_sequence, \
     parent_session_id, parent_sequence, run_id, run_expire_time, expire_time";

/// Columns by name, over sqlx's rows and the SQLite engine's (the bulk
/// append path reads session rows through both).
pub trait Columns {
    fn int(&self, column: &str) -> Result<i64>;
    /// A text column as stored (escaped).
    fn raw_text(&self, column: &str) -> Result<String>;
    /// An escaped text column, unescaped.
    fn text(&self, column: &str) -> Result<String> {
        Ok(unescape(self.raw_text(column)?))
    }
}

impl Columns for AnyRow {
    fn int(&self, column: &str) -> Result<i64> {
        Ok(self.try_get(column)?)
    }

    fn raw_text(&self, column: &str) -> Result<String> {
        Ok(self.try_get(column)?)
    }
}

/// A session as stored. The lease fields are raw: a lease past its expiry
/// still shows until it is settled (see [`Session::hide_expired_lease`]).
pub fn session_from_row(row: &impl Columns) -> Result<Session> {
    Ok(Session {
        id: row.text("id")?,
        title: row.text("title")?,
        system_prompt: row.text("system_prompt")?,
        user: row.text("user_name")?,
        metadata: decode(&row.raw_text("metadata")?)?,
        summary_message_id: row.text("summary_message_id")?,
        revision: row.int("revision")?,
        create_time: Timestamp(row.int("create_time")?),
        update_time: Timestamp(row.int("update_time")?),
        parent_session_id: row.text("parent_session_id")?,
        parent_sequence: row.int("parent_sequence")?,
        active_run_id: row.text("run_id")?,
        run_expire_time: Timestamp(row.int("run_expire_time")?),
        next_sequence: row.int("next_sequence")?,
        expire_time: Timestamp(row.int("expire_time")?),
    })
}

/// The full-text row id of a message in SQLite: one session's messages form
/// one contiguous range, so a rollback or delete removes a range.
pub(super) fn search_rowid(session_key: i64, sequence: i64) -> i64 {
    session_key.saturating_mul(1 << 32).saturating_add(sequence)
}

/// The message columns [`MessageRow`] holds, in its order.
pub const MESSAGE_COLUMNS: &str = "id, sequence, produced_by_call_id, body, create_time, redacted";

/// A message row as stored, before its body is decoded; read by sqlx here
/// and by the SQLite engine directly in `sqlite/reads.rs`.
/// The engine decodes the body where SQLite holds it (`B` = `&str`).
pub struct MessageRow<B = String> {
    pub id: String,
    pub sequence: i64,
    pub produced_by_call_id: Option<String>,
    pub body: B,
    pub create_time: i64,
    pub redacted: i64,
}

impl<B: AsRef<str>> MessageRow<B> {
    /// The stored message this row holds.
    pub fn into_stored(self, session_id: &str) -> Result<StoredMessage> {
        Ok(StoredMessage {
            id: self.id,
            session_id: session_id.to_owned(),
            sequence: self.sequence,
            produced_by_call_id: self.produced_by_call_id.unwrap_or_default(),
            message: decode(self.body.as_ref())?,
            create_time: Timestamp(self.create_time),
            redacted: self.redacted != 0,
        })
    }
}

/// Reads a message row ([`MESSAGE_COLUMNS`]).
pub fn stored_message_from_row(row: &AnyRow, session_id: &str) -> Result<StoredMessage> {
    MessageRow {
        id: row.try_get("id")?,
        sequence: row.try_get("sequence")?,
        produced_by_call_id: row.try_get("produced_by_call_id")?,
        body: row.try_get::<String, _>("body")?,
        create_time: row.try_get("create_time")?,
        redacted: row.try_get("redacted")?,
    }
    .into_stored(session_id)
}
