//! Exports' and replays' pages as PostgreSQL reads them: through sqlx's
//! PostgreSQL driver itself, on a pool of their own, and the event log's
//! pages as two ordered scans.
//!
//! Everything else the backend does goes through sqlx's `Any` driver, which
//! converts every row it returns column by column into values of its own
//! (each text and bytea copied); for the long reads, thousands of rows of
//! message content, that conversion was the largest part of the server's
//! time. Here a row's columns are read where the driver holds them: the
//! message pages by the statement and row reader every backend shares
//! (`sql::messages`, `rows::message_row`, generic over the two drivers),
//! on this pool; the event log's pages by the statement below.
//!
//! The statement the other backends share for the log
//! ([`events_with_contents`]) joins each event with its messages:
//! PostgreSQL searches the messages' index once per event, sorts what it
//! found, and sends every event's columns again beside each of its
//! messages. Here the page of events is read once and the messages from
//! the first one referred to up to the last as one index range, in order
//! (BENCHMARKS.md, "What it costs the replay").
//!
//! [`events_with_contents`]: crate::store::rows::events_with_contents

use std::collections::VecDeque;

use futures_util::TryStreamExt as _;
use sqlx::postgres::PgPool;

use crate::domain::{Error, Result};
use crate::store::rows::{BorrowedRow as _, Content, EventPage, EventRow, GatheredEvent};
use crate::store::sql::limit_param;
use crate::store::{Page, ReadBound};
use crate::wire::EncodedEvent;

/// The connections for these reads beside a store pool of
/// `max_connections` (`--max-connections`): a quarter as many, at least
/// one. They are not taken from the store's pool, which stays as it was
/// for everything else (BENCHMARKS.md: taking them from it moved appends
/// in ways not understood).
pub(super) fn read_connections(max_connections: u32) -> u32 {
    (max_connections / 4).max(1)
}

/// A session's events after revision `$2` up to `$3` (`kind` 0, `key` the
/// revision), in order, then the messages from the first one they refer
/// to up to the last (`kind` 1, `key` the sequence), in order: one
/// statement, so one snapshot. The events come first, as the parts of a
/// `UNION ALL` do outside a parallel plan, and a scan of the page's
/// materialized rows is not parallel.
const EVENTS_THEN_MESSAGES: &str = "WITH page AS MATERIALIZED (\
     SELECT revision, time, body, wire, refers_from, refers_until FROM events \
     WHERE session_key = $1 AND revision > $2 AND revision <= $3 ORDER BY revision) \
     (SELECT CAST(0 AS BIGINT) AS kind, revision AS key, time, body, wire, refers_from, \
     refers_until FROM page) \
     UNION ALL \
     (SELECT 1, sequence, 0, body, wire, 0, 0 FROM messages WHERE session_key = $1 \
     AND sequence >= (SELECT min(refers_from) FROM page WHERE refers_until > refers_from) \
     AND sequence < (SELECT max(refers_until) FROM page) ORDER BY sequence)";

/// The session's events after revision `after`, within `bound`, in
/// revision order (as `sql::events`).
pub(super) async fn events(
    pool: &PgPool,
    session_key: i64,
    after: i64,
    bound: ReadBound,
) -> Result<Page<EncodedEvent>> {
    let mut rows = sqlx::query(EVENTS_THEN_MESSAGES)
        .bind(session_key)
        .bind(after)
        .bind(after.saturating_add(limit_param(bound.rows)))
        .fetch(pool);
    let mut page = PageOfEvents::new(bound);
    while let Some(row) = rows.try_next().await? {
        let more = if row.int("kind")? == 0 {
            page.event(GatheredEvent::new(&EventRow::event_columns(&row, "key")?)?)?;
            true
        } else {
            page.message(
                row.int("key")?,
                Content::of(row.str("body")?, row.bytes("wire")?),
            )?
        };
        if !more {
            // The rest of the result is discarded with the stream.
            return page.page.finish();
        }
    }
    page.finish()
}

/// Puts a page together from the rows of [`EVENTS_THEN_MESSAGES`] as they
/// arrive: an event is complete at the first message past those it refers
/// to, and the page stops at the first event its bound does not admit.
struct PageOfEvents {
    page: EventPage,
    /// Events read and not yet complete, in revision order.
    waiting: VecDeque<GatheredEvent>,
    /// The last message's sequence, once messages have begun.
    last_message: Option<i64>,
}

impl PageOfEvents {
    fn new(bound: ReadBound) -> Self {
        PageOfEvents {
            page: EventPage::new(bound),
            waiting: VecDeque::new(),
            last_message: None,
        }
    }

    /// Takes the next event.
    fn event(&mut self, event: GatheredEvent) -> Result<()> {
        if self.last_message.is_some() {
            return Err(out_of_order());
        }
        self.waiting.push_back(event);
        Ok(())
    }

    /// Takes the next message; false once the page is full.
    fn message(&mut self, sequence: i64, content: Content<'_>) -> Result<bool> {
        if self.last_message.is_some_and(|last| last >= sequence) {
            return Err(out_of_order());
        }
        self.last_message = Some(sequence);
        // Events complete before this message are added to the page.
        while let Some(first) = self.waiting.front() {
            if first.refers().is_some_and(|refers| sequence < refers.end) {
                break;
            }
            if !self.add_first()? {
                return Ok(false);
            }
        }
        if let Some(first) = self.waiting.front_mut()
            && first
                .refers()
                .is_some_and(|refers| refers.contains(&sequence))
        {
            first.add_content(sequence, content)?;
        }
        Ok(true)
    }

    /// Adds the first waiting event to the page; false if the page's bound
    /// does not admit it.
    fn add_first(&mut self) -> Result<bool> {
        match self.waiting.pop_front() {
            Some(event) => self.page.add(event),
            None => Ok(true),
        }
    }

    /// The page, once every row has been taken.
    fn finish(mut self) -> Result<Page<EncodedEvent>> {
        while !self.waiting.is_empty() {
            if !self.add_first()? {
                break;
            }
        }
        self.page.finish()
    }
}

fn out_of_order() -> Error {
    Error::storage(std::io::Error::other(
        "the event log's rows arrived out of order",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{
        AppendedExchange, Change, Message, Role, SessionEvent, StoredMessage, Timestamp,
    };
    use crate::store::rows::encode_content;

    /// An appended exchange: the event whole, its stored form, and its
    /// messages' sequences and encodings.
    type Exchange = (EncodedEvent, Vec<u8>, Vec<(i64, Vec<u8>)>);

    /// An appended exchange at `revision` of two messages from `first`.
    fn exchange(revision: i64, first: i64) -> Exchange {
        let messages: Vec<StoredMessage> = (first..first + 2)
            .map(|sequence| StoredMessage {
                id: format!("m{sequence}"),
                session_id: "s".into(),
                sequence,
                produced_by_call_id: String::new(),
                message: Message::text(Role::User, format!("message {sequence}")),
                create_time: Timestamp(sequence),
                redacted: false,
            })
            .collect();
        let contents = messages
            .iter()
            .map(|stored| (stored.sequence, encode_content(&stored.message)))
            .collect();
        let (whole, stored) = EncodedEvent::referring(SessionEvent {
            revision,
            time: Timestamp(revision),
            change: Change::ExchangeAppended(AppendedExchange {
                messages,
                provider_call: None,
                run_id: String::new(),
                next_sequence: first + 2,
                state_changes: Vec::new(),
                update_time: Timestamp(revision),
                replayed: false,
                session_created: false,
            }),
        });
        (whole, stored, contents)
    }

    fn event_row(revision: i64, wire: &[u8], refers: std::ops::Range<i64>) -> EventRow<'_> {
        EventRow {
            revision,
            time: revision,
            body: "",
            wire: Some(wire),
            refers_from: refers.start,
            refers_until: refers.end,
            content: None,
        }
    }

    /// Three exchanges; the second was written out whole (as before an
    /// edit of its messages), whose message rows are still read and skipped.
    fn rows() -> Vec<Exchange> {
        vec![exchange(1, 0), exchange(2, 2), exchange(3, 4)]
    }

    fn read(bound: ReadBound, stop_at: Option<usize>) -> Result<(Page<EncodedEvent>, usize)> {
        let rows = rows();
        let mut page = PageOfEvents::new(bound);
        for (index, (whole, stored, _)) in rows.iter().enumerate() {
            let revision = i64::try_from(index)
                .map_err(Error::storage)?
                .saturating_add(1);
            page.event(if revision == 2 {
                GatheredEvent::new(&event_row(revision, whole.encoding(), 0..0))?
            } else {
                let first = 2 * (revision - 1);
                GatheredEvent::new(&event_row(revision, stored, first..first + 2))?
            })?;
        }
        let mut taken = 0;
        for (sequence, content) in rows.iter().flat_map(|(_, _, contents)| contents) {
            taken += 1;
            if !page.message(*sequence, Content::of("", Some(content)))? {
                assert_eq!(Some(taken), stop_at, "stopped early");
                return Ok((page.page.finish()?, taken));
            }
        }
        assert_eq!(stop_at, None, "did not stop");
        Ok((page.finish()?, taken))
    }

    #[test]
    fn events_are_put_together_from_their_messages_as_they_arrive() -> Result<()> {
        let (page, _) = read(ReadBound::rows(10), None)?;
        assert!(!page.cut);
        // The same events (a spliced message's content comes last among
        // its fields, so the bytes differ in order only).
        let read: Vec<_> = page
            .rows
            .iter()
            .map(|(event, _)| event.to_pb())
            .collect::<Result<_>>()?;
        let expected: Vec<_> = rows()
            .iter()
            .map(|(whole, _, _)| whole.to_pb())
            .collect::<Result<_>>()?;
        assert_eq!(read, expected);
        Ok(())
    }

    #[test]
    fn a_page_of_events_is_framed_into_one_buffer_they_share() -> Result<()> {
        let (page, _) = read(ReadBound::rows(10), None)?;
        let mut end = None;
        for (event, _) in &page.rows {
            let buffer = event.page().ok_or_else(|| Error::storage(Missing))?;
            let framed = event.framed();
            let start = framed.as_ptr() as usize - buffer.as_ptr() as usize;
            assert!(start + framed.len() <= buffer.len(), "a slice of its page");
            // Each event right after the one before, in the same buffer.
            if let Some(end) = end {
                assert_eq!(framed.as_ptr(), end);
            }
            end = Some(framed.as_ptr().wrapping_add(framed.len()));
        }
        Ok(())
    }

    #[derive(Debug, thiserror::Error)]
    #[error("an event read in a page without its page")]
    struct Missing;

    #[test]
    fn a_page_past_its_first_buffer_goes_on_in_a_new_one() -> Result<()> {
        let all = ReadBound::rows(1000);
        let exchanges: Vec<Exchange> = (1..=400).map(|r| exchange(r, 2 * (r - 1))).collect();
        let mut page = EventPage::new(all);
        for (revision, (_, stored, contents)) in (1..).zip(&exchanges) {
            let first = 2 * (revision - 1);
            let mut event = GatheredEvent::new(&event_row(revision, stored, first..first + 2))?;
            for (sequence, content) in contents {
                event.add_content(*sequence, Content::of("", Some(content)))?;
            }
            assert!(page.add(event)?);
        }
        let page = page.finish()?;
        let buffers: std::collections::HashSet<_> = page
            .rows
            .iter()
            .filter_map(|(event, _)| event.page().map(|page| page.as_ptr()))
            .collect();
        assert!(buffers.len() > 1, "more than one buffer");
        assert_eq!(page.rows.len(), exchanges.len());
        for ((event, _), (whole, _, _)) in page.rows.iter().zip(&exchanges) {
            assert_eq!(event.to_pb()?, whole.to_pb()?);
        }
        Ok(())
    }

    #[test]
    fn a_page_stops_at_the_first_event_its_bound_does_not_admit() -> Result<()> {
        let first = read(
            ReadBound {
                rows: 10,
                bytes: usize::MAX,
                at_least_one: true,
            },
            None,
        )?
        .0
        .rows[0]
            .1;
        // Room for the first event only: at the first message past it, the
        // first is complete and so is the second (stored whole), which
        // does not fit.
        let (page, taken) = read(
            ReadBound {
                rows: 10,
                bytes: first,
                at_least_one: true,
            },
            Some(3),
        )?;
        assert!(page.cut);
        assert_eq!(taken, 3);
        assert_eq!(page.rows.len(), 1);
        assert_eq!(page.rows[0].0.to_pb()?, rows()[0].0.to_pb()?);
        Ok(())
    }

    #[test]
    fn rows_out_of_order_are_an_error() -> Result<()> {
        let (whole, stored, contents) = exchange(1, 0);
        let bound = ReadBound {
            rows: 10,
            bytes: usize::MAX,
            at_least_one: true,
        };
        let mut page = PageOfEvents::new(bound);
        page.event(GatheredEvent::new(&event_row(1, &stored, 0..2))?)?;
        page.message(1, Content::of("", Some(&contents[1].1)))?;
        assert!(
            page.message(0, Content::of("", Some(&contents[0].1)))
                .is_err()
        );
        let mut page = PageOfEvents::new(bound);
        page.message(0, Content::of("", Some(&contents[0].1)))?;
        assert!(
            page.event(GatheredEvent::new(&event_row(1, whole.encoding(), 0..0))?)
                .is_err()
        );
        Ok(())
    }
}
