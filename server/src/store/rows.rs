//! Rows and their codecs: the column lists, reading sessions and messages
//! from sqlx's rows or the SQLite engine's, a message's content in either
//! of its forms (its encoding, or an older row's JSON), and event rows in
//! theirs, with the content of the messages an event refers to put back.
//! Shared by both backends' reads and writes.

use std::ops::Range;

use bytes::{Bytes, BytesMut};

use sqlx::Row;
use sqlx::any::AnyRow;
use sqlx::postgres::PgRow;

use super::text::{escape, escape_ordered, unescape, unescape_ordered};
use super::{Page, ReadBound};
use crate::domain::{
    Error, Message, Result, Session, SessionEvent, StateEntry, StoredMessage, Timestamp,
};
use crate::wire::{Effect, EncodedEvent, decode_message, encode_message};

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

/// A session's events with the content of the messages each refers to
/// (`refers_from..refers_until`, see [`EncodedEvent::referring`]): one
/// row per message referred to, or one row with NULL message columns for
/// an event that refers to none, in revision and sequence order, read as
/// one statement so that the events and the messages come from one
/// snapshot. `$1` is the session's key; `events` is the condition on the
/// event rows (`e`), a range of revisions: a limit would count the
/// joined rows, and on SQLite a limited subquery's rows are sorted again
/// in a temporary B-tree. A session's revisions are consecutive, so a
/// range of them is as many events. [`EventRows`] gathers the rows into
/// events.
pub fn events_with_contents(events: &str) -> String {
    format!(
        "SELECT e.revision, e.time, e.body, e.wire, e.refers_from, e.refers_until, \
         m.sequence AS content_sequence, m.body AS content, m.wire AS content_wire \
         FROM events AS e LEFT JOIN messages AS m ON m.session_key = e.session_key \
         AND m.sequence >= e.refers_from AND m.sequence < e.refers_until \
         WHERE e.session_key = $1 AND {events} \
         ORDER BY e.revision, m.sequence"
    )
}

/// One row of [`events_with_contents`], borrowed from the driver's row.
pub struct EventRow<'a> {
    pub revision: i64,
    pub time: i64,
    pub body: &'a str,
    pub wire: Option<&'a [u8]>,
    pub refers_from: i64,
    pub refers_until: i64,
    /// The sequence and content of a message the event refers to.
    pub content: Option<(i64, Content<'a>)>,
}

impl<'a> EventRow<'a> {
    /// The row as sqlx reads it.
    pub fn from_any(row: &'a AnyRow) -> Result<Self> {
        let sequence: Option<i64> = row.try_get("content_sequence")?;
        let content = match sequence {
            Some(sequence) => Some((
                sequence,
                Content::of(row.try_get("content")?, row.try_get("content_wire")?),
            )),
            None => None,
        };
        Ok(EventRow {
            content,
            ..EventRow::event_columns(row, "revision")?
        })
    }

    /// The event's own columns of a row of either of sqlx's drivers (its
    /// revision in the column `revision`), without a message's content.
    pub fn event_columns(row: &'a impl BorrowedRow, revision: &str) -> Result<Self> {
        Ok(EventRow {
            revision: row.int(revision)?,
            time: row.int("time")?,
            body: row.str("body")?,
            wire: row.bytes("wire")?,
            refers_from: row.int("refers_from")?,
            refers_until: row.int("refers_until")?,
            content: None,
        })
    }
}

/// A row of sqlx's `Any` or PostgreSQL driver, read by column name, its
/// text and bytes borrowed where the driver holds them.
pub trait BorrowedRow {
    fn int(&self, column: &str) -> Result<i64>;
    fn str(&self, column: &str) -> Result<&str>;
    fn string(&self, column: &str) -> Result<Option<String>>;
    fn bytes(&self, column: &str) -> Result<Option<&[u8]>>;
}

/// [`BorrowedRow`] for a driver's row type, written once.
macro_rules! borrowed_row {
    ($row:ty) => {
        impl BorrowedRow for $row {
            fn int(&self, column: &str) -> Result<i64> {
                Ok(self.try_get(column)?)
            }
            fn str(&self, column: &str) -> Result<&str> {
                Ok(self.try_get(column)?)
            }
            fn string(&self, column: &str) -> Result<Option<String>> {
                Ok(self.try_get(column)?)
            }
            fn bytes(&self, column: &str) -> Result<Option<&[u8]>> {
                Ok(self.try_get(column)?)
            }
        }
    };
}

borrowed_row!(AnyRow);
borrowed_row!(sqlx::postgres::PgRow);

/// Gathers the rows of [`events_with_contents`] into events, one event at
/// a time.
#[derive(Default)]
pub struct EventRows {
    current: Option<GatheredEvent>,
}

impl EventRows {
    /// Takes the next row. Answers the event before it once this row
    /// begins another.
    pub fn push(&mut self, row: &EventRow<'_>) -> Result<Option<GatheredEvent>> {
        let done = match &self.current {
            Some(current) if current.revision != row.revision => self.current.take(),
            _ => None,
        };
        let current = match &mut self.current {
            Some(current) => current,
            None => self.current.insert(GatheredEvent::new(row)?),
        };
        if let Some((sequence, content)) = row.content {
            current.add_content(sequence, content)?;
        }
        Ok(done)
    }

    /// The last event, once the rows are done.
    pub fn finish(&mut self) -> Option<GatheredEvent> {
        self.current.take()
    }
}

/// An event gathered from its rows.
pub struct GatheredEvent {
    revision: i64,
    stored: Gathered,
    contents: Vec<(i64, Vec<u8>)>,
    /// The bytes read for it: its encoding (or JSON) and the bodies of
    /// the messages it refers to.
    pub size: usize,
}

enum Gathered {
    /// An event stored whole.
    Whole(EncodedEvent),
    /// An event stored without the content of its messages, `refers`.
    Referring { stored: Vec<u8>, refers: Range<i64> },
}

impl GatheredEvent {
    /// The event of `row` (its event columns; not its content).
    pub fn new(row: &EventRow<'_>) -> Result<Self> {
        let size = row.wire.map_or(row.body.len(), <[u8]>::len);
        let stored = match row.wire {
            Some(wire) if row.refers_until > row.refers_from => Gathered::Referring {
                stored: wire.to_vec(),
                refers: row.refers_from..row.refers_until,
            },
            _ => Gathered::Whole(logged_event(row.revision, row.time, row.body, row.wire)?),
        };
        Ok(GatheredEvent {
            revision: row.revision,
            stored,
            contents: Vec::new(),
            size,
        })
    }

    /// The messages it refers to for their content, if any.
    pub fn refers(&self) -> Option<Range<i64>> {
        match &self.stored {
            Gathered::Whole(_) => None,
            Gathered::Referring { refers, .. } => Some(refers.clone()),
        }
    }

    /// Adds the content of the message at `sequence`, one it refers to.
    pub fn add_content(&mut self, sequence: i64, content: Content<'_>) -> Result<()> {
        self.size += content.len();
        self.contents.push((sequence, content.to_encoding()?));
        Ok(())
    }

    /// The event as WatchSession sends it.
    pub fn into_event(self) -> Result<EncodedEvent> {
        match self.stored {
            Gathered::Whole(event) => Ok(event),
            Gathered::Referring { stored, .. } => {
                EncodedEvent::with_contents(self.revision, &stored, &self.contents)
            }
        }
    }
}

/// A page of events being read. Their frames are written one after
/// another into a few large buffers, which the page's events share as
/// slices ([`EncodedEvent::in_page`]): no allocation per event, and
/// WatchSession sends a run of them as one DATA frame without copying them
/// again. A buffer that fills is kept as it is and the next begins, twice
/// as large up to [`PAGE_CHUNK_MAX`], so no frame is copied as they grow.
pub struct EventPage {
    bound: ReadBound,
    /// Each event's revision, effect, buffer (an index into `full`, or
    /// the one being written), range in it, and the bytes read for it.
    events: Vec<(i64, Effect, usize, Range<usize>, usize)>,
    full: Vec<Bytes>,
    frames: BytesMut,
    bytes: usize,
    cut: bool,
}

/// The first buffer of a page of events.
const PAGE_CHUNK_MIN: usize = 16 * 1024;
/// The largest buffer of a page of events (a larger event gets a buffer
/// of its own size). Small: a frame WatchSession has handed HTTP/2 keeps
/// its whole buffer alive while a stalled watcher holds it.
const PAGE_CHUNK_MAX: usize = 64 * 1024;
/// What an event's frame may take beyond the bytes read for it (its
/// prefix, and the keys and lengths around each message put back): a
/// guess, which only decides when a new buffer begins.
const FRAME_OVERHEAD: usize = 256;

impl EventPage {
    /// An empty page that admits what `bound` does.
    pub fn new(bound: ReadBound) -> Self {
        EventPage {
            bound,
            events: Vec::new(),
            full: Vec::new(),
            frames: BytesMut::new(),
            bytes: 0,
            cut: false,
        }
    }

    /// Adds `event` if the page's bound admits it; if not, marks the page
    /// cut and answers false.
    pub fn add(&mut self, event: GatheredEvent) -> Result<bool> {
        if !self.bound.admits(self.events.len(), self.bytes, event.size) {
            self.cut = true;
            return Ok(false);
        }
        self.bytes += event.size;
        let needed = event.size + FRAME_OVERHEAD;
        if self.frames.capacity() - self.frames.len() < needed {
            let next = (2 * self.frames.capacity()).clamp(PAGE_CHUNK_MIN, PAGE_CHUNK_MAX);
            let full =
                std::mem::replace(&mut self.frames, BytesMut::with_capacity(next.max(needed)));
            if !full.is_empty() {
                self.full.push(full.freeze());
            }
        }
        let start = self.frames.len();
        let effect = match event.stored {
            Gathered::Whole(whole) => {
                self.frames.extend_from_slice(&whole.framed());
                whole.effect
            }
            Gathered::Referring { stored, .. } => {
                EncodedEvent::write_with_contents(&stored, &event.contents, &mut self.frames)?
            }
        };
        self.events.push((
            event.revision,
            effect,
            self.full.len(),
            start..self.frames.len(),
            event.size,
        ));
        Ok(true)
    }

    /// The page's events, each a slice of one of the page's buffers.
    pub fn finish(mut self) -> Result<Page<EncodedEvent>> {
        self.full.push(self.frames.freeze());
        let mut rows = Vec::with_capacity(self.events.len());
        for (revision, effect, buffer, range, size) in self.events {
            // Always within: each range was written there.
            let event = self
                .full
                .get(buffer)
                .and_then(|buffer| EncodedEvent::in_page(revision, effect, buffer, range))
                .ok_or_else(|| Error::storage(PageOutOfBounds))?;
            rows.push((event, size));
        }
        Ok(Page {
            rows,
            cut: self.cut,
        })
    }
}

/// An event's frame past the end of its page's buffer, which
/// [`EventPage::add`] never writes.
#[derive(Debug, thiserror::Error)]
#[error("an event's frame lies outside its page")]
struct PageOutOfBounds;

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
    /// A text column that may be NULL, as stored.
    fn optional_text(&self, column: &str) -> Result<Option<String>>;
}

/// [`Columns`] over sqlx's rows: `Any`'s, and PostgreSQL's (the append
/// writers' own connections).
macro_rules! sqlx_columns {
    ($($row:ty),*) => {$(
        impl Columns for $row {
            fn int(&self, column: &str) -> Result<i64> {
                Ok(self.try_get(column)?)
            }

            fn raw_text(&self, column: &str) -> Result<String> {
                Ok(self.try_get(column)?)
            }

            fn optional_text(&self, column: &str) -> Result<Option<String>> {
                Ok(self.try_get(column)?)
            }
        }
    )*};
}

sqlx_columns!(AnyRow, PgRow);

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
pub const MESSAGE_COLUMNS: &str =
    "id, sequence, produced_by_call_id, body, create_time, redacted, wire";

/// A message's content as a row stores it: the protobuf encoding of its
/// `sessionstore.v1.Message` (`wire`, migration 0017), or, for a message
/// written before, its JSON (`body`).
#[derive(Clone, Copy)]
pub enum Content<'a> {
    Wire(&'a [u8]),
    Json(&'a str),
}

impl<'a> Content<'a> {
    /// The content of a row with these `body` and `wire` columns.
    pub fn of(body: &'a str, wire: Option<&'a [u8]>) -> Self {
        match wire {
            Some(wire) => Content::Wire(wire),
            None => Content::Json(body),
        }
    }

    /// The bytes stored, as a [`super::ReadBound`] counts them.
    pub fn len(self) -> usize {
        match self {
            Content::Wire(wire) => wire.len(),
            Content::Json(body) => body.len(),
        }
    }

    /// The message, as the domain holds it.
    pub fn message(self) -> Result<Message> {
        match self {
            Content::Wire(wire) => decode_message(wire),
            Content::Json(body) => decode(body),
        }
    }

    /// The message's encoding: copied where it is stored encoded.
    pub fn to_encoding(self) -> Result<Vec<u8>> {
        match self {
            Content::Wire(wire) => Ok(wire.to_vec()),
            Content::Json(body) => Ok(encode_message(&decode(body)?)),
        }
    }
}

/// A message's content as a new row stores it ([`Content::Wire`]).
pub fn encode_content(message: &Message) -> Vec<u8> {
    encode_message(message)
}

/// A message row as stored, before its content is decoded; read by sqlx
/// here and by the SQLite engine directly in `sqlite/reads.rs`, borrowed
/// where the driver or SQLite holds it (`B` = `&str`, `W` = `&[u8]`), and
/// owned in a page of messages ([`OwnedMessageRow`]), which is decoded
/// ([`MessageRow::into_stored`]) or sent as it is stored
/// ([`MessageRow::into_encoded`]).
pub struct MessageRow<B, W> {
    pub id: String,
    pub sequence: i64,
    pub produced_by_call_id: Option<String>,
    pub body: B,
    pub wire: Option<W>,
    pub create_time: i64,
    pub redacted: i64,
}

impl<B: AsRef<str>, W: AsRef<[u8]>> MessageRow<B, W> {
    /// The bytes its content takes, as a [`super::ReadBound`] counts them.
    pub fn content_len(&self) -> usize {
        self.content().len()
    }

    fn content(&self) -> Content<'_> {
        Content::of(self.body.as_ref(), self.wire.as_ref().map(AsRef::as_ref))
    }

    /// The message's encoding as a `Message` of the API: the bytes stored,
    /// uncopied, or, for an older row's JSON, encoded here.
    pub fn into_encoded(self) -> Result<EncodedMessage>
    where
        W: Into<Bytes>,
    {
        let encoding = match self.wire {
            Some(wire) => wire.into(),
            None => Bytes::from(encode_message(&decode(self.body.as_ref())?)),
        };
        Ok(EncodedMessage {
            sequence: self.sequence,
            encoding,
        })
    }

    /// The message this row holds, decoded.
    pub fn message(&self) -> Result<Message> {
        self.content().message()
    }

    /// The stored message this row holds.
    pub fn into_stored(self, session_id: &str) -> Result<StoredMessage> {
        let message = self.message()?;
        Ok(self.into_stored_with(session_id, message))
    }

    /// The stored message this row holds, with `message` (this row's,
    /// decoded and perhaps changed since) as its message.
    pub fn into_stored_with(self, session_id: &str, message: Message) -> StoredMessage {
        StoredMessage {
            id: self.id,
            session_id: session_id.to_owned(),
            sequence: self.sequence,
            produced_by_call_id: self.produced_by_call_id.unwrap_or_default(),
            message,
            create_time: Timestamp(self.create_time),
            redacted: self.redacted != 0,
        }
    }
}

/// A message row as a page of messages holds it: its content copied out of
/// the row it was read from, once.
pub type OwnedMessageRow = MessageRow<String, Bytes>;

impl MessageRow<&str, &[u8]> {
    /// This row, its content copied out of the row it borrows from.
    pub fn into_owned(self) -> OwnedMessageRow {
        MessageRow {
            id: self.id,
            sequence: self.sequence,
            produced_by_call_id: self.produced_by_call_id,
            body: self.body.to_owned(),
            wire: self.wire.map(Bytes::copy_from_slice),
            create_time: self.create_time,
            redacted: self.redacted,
        }
    }

    /// As [`MessageRow::into_owned`], with its encoding copied into
    /// `arena`, a page's buffer: one allocation holds many rows'
    /// encodings, each row's a slice of it (a 10,000-message export made
    /// 10,000 allocations for them, and freed them).
    pub fn into_owned_in(self, arena: &mut BytesMut) -> OwnedMessageRow {
        let wire = self.wire.map(|wire| {
            if arena.capacity() - arena.len() < wire.len() {
                *arena = BytesMut::with_capacity(wire.len().max(ARENA_BYTES));
            }
            arena.extend_from_slice(wire);
            arena.split().freeze()
        });
        MessageRow {
            id: self.id,
            sequence: self.sequence,
            produced_by_call_id: self.produced_by_call_id,
            body: self.body.to_owned(),
            wire,
            create_time: self.create_time,
            redacted: self.redacted,
        }
    }
}

/// The size of the buffers [`MessageRow::into_owned_in`] fills.
const ARENA_BYTES: usize = 64 << 10;

/// A message as ExportHistory sends it: its sequence, and its encoding as
/// a `Message` of the API.
pub struct EncodedMessage {
    pub sequence: i64,
    pub encoding: Bytes,
}

/// Reads a message row ([`MESSAGE_COLUMNS`]).
pub fn stored_message_from_row(row: &AnyRow, session_id: &str) -> Result<StoredMessage> {
    message_row(row)?.into_stored(session_id)
}

/// A message row ([`MESSAGE_COLUMNS`]) of either of sqlx's drivers, its
/// content borrowed from the driver's row.
pub fn message_row(row: &impl BorrowedRow) -> Result<MessageRow<&str, &[u8]>> {
    Ok(MessageRow {
        id: row.str("id")?.to_owned(),
        sequence: row.int("sequence")?,
        produced_by_call_id: row.string("produced_by_call_id")?,
        body: row.str("body")?,
        wire: row.bytes("wire")?,
        create_time: row.int("create_time")?,
        redacted: row.int("redacted")?,
    })
}

/// The entries of each of `scopes` (`""`: the session `session_key`'s
/// own state; else a shared scope of `tenant`), scope by scope as named,
/// each in key order, read on `conn`.
pub async fn scope_entries(
    conn: &mut sqlx::AnyConnection,
    tenant: &str,
    session_key: i64,
    scopes: &[String],
) -> Result<Vec<StateEntry>> {
    let mut entries = Vec::new();
    for scope in scopes {
        let rows = if scope.is_empty() {
            sqlx::query(
                "SELECT '' AS scope, key, value, version, update_time FROM session_state \
                 WHERE session_key = $1 ORDER BY key",
            )
            .bind(session_key)
            .fetch_all(&mut *conn)
            .await?
        } else {
            sqlx::query(
                "SELECT scope, key, value, version, update_time FROM shared_state \
                 WHERE tenant = $1 AND scope = $2 ORDER BY key",
            )
            .bind(escape(tenant))
            .bind(escape_ordered(scope))
            .fetch_all(&mut *conn)
            .await?
        };
        for row in &rows {
            entries.push(shared_state_from_row(row)?);
        }
    }
    Ok(entries)
}

/// A shared scope's entry, its scope included.
pub fn shared_state_from_row(row: &AnyRow) -> Result<StateEntry> {
    Ok(StateEntry {
        scope: unescape_ordered(row.try_get("scope")?),
        ..state_from_row(row)?
    })
}

/// A session's own state entry.
pub fn state_from_row(row: &AnyRow) -> Result<StateEntry> {
    Ok(StateEntry {
        scope: String::new(),
        key: unescape_ordered(row.try_get("key")?),
        value: text_col(row, "value")?,
        version: row.try_get("version")?,
        update_time: Timestamp(row.try_get("update_time")?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(wire: &[u8]) -> MessageRow<&str, &[u8]> {
        MessageRow {
            id: "msg_1".to_owned(),
            sequence: 1,
            produced_by_call_id: None,
            body: "",
            wire: Some(wire),
            create_time: 0,
            redacted: 0,
        }
    }

    #[test]
    fn rows_owned_in_an_arena_keep_their_own_bytes() {
        let mut arena = BytesMut::new();
        let small: Vec<Vec<u8>> = (0..100u8).map(|n| vec![n; 1000]).collect();
        let large = vec![7u8; 3 * ARENA_BYTES];
        let mut owned: Vec<OwnedMessageRow> = small
            .iter()
            .map(|wire| row(wire).into_owned_in(&mut arena))
            .collect();
        owned.push(row(&large).into_owned_in(&mut arena));
        owned.push(row(&small[1]).into_owned_in(&mut arena));
        let expected: Vec<&[u8]> = small
            .iter()
            .map(Vec::as_slice)
            .chain([large.as_slice(), small[1].as_slice()])
            .collect();
        let got: Vec<&[u8]> = owned
            .iter()
            .map(|row| row.wire.as_deref().unwrap_or_default())
            .collect();
        assert_eq!(got, expected);
    }
}
