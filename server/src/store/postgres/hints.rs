//! Commit hints: `NOTIFY sessionstore_commits, '<key>:<revision>'` for
//! each committed event (`'<key>:<revision>:<run id>'` when it closes a
//! run's partial output), telling every replica's listener that a
//! session's head moved. A hint, never the payload: watchers read the log.
//!
//! A writer sends the hints of a transaction right after it commits, and
//! answers its callers after that. Not inside the transaction: PostgreSQL
//! serialises the commits of transactions that notify (they take one lock
//! before their commit record and keep it until that record is flushed),
//! so writers that notify as they commit wait for each other's disk flush
//! instead of sharing one. A statement that only notifies writes no data,
//! so PostgreSQL does not wait for its commit record to reach the disk, and
//! holds the lock for microseconds. The append writers send the hints in
//! the same round trip as their `COMMIT` ([`commit_and_begin`]); the general path,
//! whose transaction sqlx ends, sends them in one of their own ([`send`]).
//! A writer's one-trip batch (a statement committing on its own) hands its
//! hints to a task that sends them after the answers ([`Hinter`]): a
//! watcher on another replica learns of the commit a moment later, and the
//! caller is not kept waiting for a second round trip.
//!
//! A run's closing hint is always sent before the answers, so it reaches the
//! other replicas before any delta its caller publishes after the answer. A hint
//! that is lost (the connection failed just after the commit, the replica
//! stopped) loses no event: listeners re-read the watched sessions' heads
//! every `recheck_interval`.

use std::sync::Arc;

use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use sqlx::{Executor, PgConnection};

use crate::wire::{Effect, EncodedEvent};

/// The channel carrying commit hints.
pub(super) const CHANNEL: &str = "sessionstore_commits";

/// Hints per statement.
const HINTS_PER_STATEMENT: usize = 1000;

/// The hints of `events`, committed: (internal session key, event).
pub(super) fn of<'a>(
    events: impl IntoIterator<Item = &'a (i64, Arc<EncodedEvent>)>,
) -> Vec<String> {
    events
        .into_iter()
        .map(|(session_key, event)| hint(*session_key, event))
        .collect()
}

/// Commits `conn`'s open transaction (begun with a plain `BEGIN`), sends
/// `hints`, and begins the next transaction, all in one round trip:
/// `COMMIT; SELECT pg_notify(…); COMMIT; BEGIN` as one simple query. The
/// hints run in an implicit transaction of their own, after the commit,
/// which the second `COMMIT` ends (PostgreSQL warns that no transaction
/// block was open: the append writers' connections do not log warnings).
/// `Err` only if the commit failed. `Ok(true)` if the next transaction
/// was begun; `Ok(false)` if the hints failed after the commit (logged,
/// as in [`send`]): PostgreSQL runs nothing after a statement that fails,
/// so no transaction was begun.
pub(super) async fn commit_and_begin(
    conn: &mut PgConnection,
    hints: &[String],
    begin: bool,
) -> Result<bool, sqlx::Error> {
    let mut sql = String::from("COMMIT");
    let mut statements = if begin { 2 } else { 1 };
    for chunk in hints.chunks(HINTS_PER_STATEMENT) {
        sql.push_str("; ");
        sql.push_str(&statement(chunk));
        statements += 1;
    }
    if !hints.is_empty() {
        sql.push_str("; COMMIT");
        statements += 1;
    }
    if begin {
        sql.push_str("; BEGIN");
    }
    let mut results = conn.execute_many(sql.as_str());
    // The first result is the commit's.
    match results.next().await {
        Some(Ok(_)) => {}
        Some(Err(error)) => return Err(error),
        None => return Err(sqlx::Error::Protocol("COMMIT went unanswered".into())),
    }
    let mut answered = 1;
    while let Some(result) = results.next().await {
        match result {
            Ok(_) => answered += 1,
            Err(error) => {
                lost(&error);
                return Ok(false);
            }
        }
    }
    Ok(begin && answered == statements)
}

/// Whether the hints of `events` must reach the other replicas before the
/// callers are answered: one closes a run, whose caller may publish the
/// next run's deltas right after its answer (see the module's comment).
pub(super) fn close_runs<'a>(
    events: impl IntoIterator<Item = &'a (i64, Arc<EncodedEvent>)>,
) -> bool {
    events
        .into_iter()
        .any(|(_, event)| matches!(event.effect, Effect::ClosesRun(_)))
}

/// Sends commit hints from a task of its own, on a connection of the
/// store's pool, so that a writer that committed in one round trip answers
/// its callers without waiting for a second. Hints queued while it sends
/// go together in its next statement. (Hints of a run's close are not
/// handed here: [`close_runs`].) At most [`HINTER_QUEUE`] batches wait;
/// past that (the database unreachable for a while) a batch's hints are
/// dropped, as if lost on the way.
#[derive(Clone)]
pub(super) struct Hinter {
    queue: tokio::sync::mpsc::Sender<Vec<String>>,
}

/// Batches of hints a [`Hinter`] holds before it drops new ones.
const HINTER_QUEUE: usize = 4096;

impl Hinter {
    /// Starts the task; it stops once every clone is dropped.
    pub(super) fn start(pool: sqlx::AnyPool) -> Hinter {
        let (queue, mut hints) = tokio::sync::mpsc::channel::<Vec<String>>(HINTER_QUEUE);
        tokio::spawn(async move {
            // Kept between sends: taking one from the pool costs a round
            // trip of its own (its liveness check).
            let mut held: Option<sqlx::pool::PoolConnection<sqlx::Any>> = None;
            while let Some(first) = hints.recv().await {
                let mut all = first;
                while let Ok(more) = hints.try_recv() {
                    all.extend(more);
                }
                let conn = match held.as_mut() {
                    Some(conn) => conn,
                    None => match pool.acquire().await {
                        Ok(conn) => held.insert(conn),
                        Err(error) => {
                            lost(&error);
                            continue;
                        }
                    },
                };
                if !send(&mut **conn, &all).await
                    && let Some(mut conn) = held.take()
                {
                    conn.close_on_drop();
                }
            }
        });
        Hinter { queue }
    }

    /// Queues `hints` to be sent.
    pub(super) fn send(&self, hints: Vec<String>) {
        if !hints.is_empty() && self.queue.try_send(hints).is_err() {
            tracing::debug!("commit hints dropped: too many wait to be sent");
        }
    }
}

/// Sends `hints` on `conn` (the general path's, the hint task's or an
/// append writer's), outside any transaction, in one round trip. `false`
/// if that failed: the connection may be broken.
///
/// A boxed future rather than an `async fn`: the compiler cannot prove an
/// `async fn` generic over the executor's lifetime `Send` inside the
/// spawned tasks that call it.
pub(super) fn send<'c, C: Executor<'c> + 'c>(conn: C, hints: &[String]) -> BoxFuture<'c, bool> {
    let statements: Vec<String> = hints.chunks(HINTS_PER_STATEMENT).map(statement).collect();
    Box::pin(async move {
        if statements.is_empty() {
            return true;
        }
        match conn.execute(statements.join("; ").as_str()).await {
            Ok(_) => true,
            Err(error) => {
                lost(&error);
                false
            }
        }
    })
}

fn lost(error: &sqlx::Error) {
    tracing::warn!(
        %error,
        "cannot send commit hints; other replicas find the commits at their next recheck"
    );
}

/// One statement sending `hints`, as literals: it shares a simple query
/// (which takes no parameters) with the `COMMIT` before it.
fn statement(hints: &[String]) -> String {
    let values: Vec<String> = hints
        .iter()
        .map(|hint| format!("({})", literal(hint)))
        .collect();
    format!(
        "SELECT pg_notify('{CHANNEL}', hint) FROM (VALUES {}) AS hints (hint)",
        values.join(", ")
    )
}

/// `text` as an escape string constant (`E'…'`), which reads the same
/// whatever `standard_conforming_strings` says.
fn literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 4);
    out.push_str("E'");
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("''"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// The hint of `event`, committed in the session with internal key
/// `session_key`.
fn hint(session_key: i64, event: &EncodedEvent) -> String {
    match &event.effect {
        // Other replicas drop the buffered deltas of a run that closed.
        // (A notification's payload cannot hold U+0000: such a run's hint
        // says only that the head moved.)
        Effect::ClosesRun(run_id) if !run_id.contains('\0') => {
            format!("{session_key}:{}:{run_id}", event.revision)
        }
        _ => format!("{session_key}:{}", event.revision),
    }
}

/// A parsed commit hint.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Hint<'a> {
    pub session_key: i64,
    pub revision: i64,
    pub closed_run: Option<&'a str>,
}

pub(super) fn parse(payload: &str) -> Option<Hint<'_>> {
    let (key, rest) = payload.split_once(':')?;
    let (revision, closed_run) = match rest.split_once(':') {
        Some((revision, run)) => (revision, Some(run)),
        None => (rest, None),
    };
    Some(Hint {
        session_key: key.parse().ok()?,
        revision: revision.parse().ok()?,
        closed_run,
    })
}

#[cfg(test)]
mod tests {
    use super::{Hint, hint, literal, parse, statement};
    use crate::domain::{Change, SessionEvent, Timestamp};
    use crate::wire::EncodedEvent;

    #[test]
    fn hints_parse() {
        let hint = |session_key, revision, closed_run| Hint {
            session_key,
            revision,
            closed_run,
        };
        assert_eq!(parse("12:34"), Some(hint(12, 34, None)));
        assert_eq!(parse("12:34:run:1"), Some(hint(12, 34, Some("run:1"))));
        assert_eq!(parse("12"), None);
        assert_eq!(parse("a:1"), None);
    }

    #[test]
    fn a_hint_names_the_run_its_event_closes() {
        let event = |revision, change| {
            EncodedEvent::new(SessionEvent {
                revision,
                time: Timestamp(1),
                change,
            })
        };
        let ended = event(
            7,
            Change::RunEnded {
                run_id: "run:1".into(),
                expired: false,
            },
        );
        assert_eq!(hint(12, &ended), "12:7:run:1");
        assert_eq!(
            parse(&hint(12, &ended)).and_then(|h| h.closed_run),
            Some("run:1")
        );
        assert_eq!(hint(12, &event(8, Change::SessionDeleted)), "12:8");
        let unsendable = event(
            9,
            Change::RunEnded {
                run_id: "run\0".into(),
                expired: true,
            },
        );
        assert_eq!(hint(12, &unsendable), "12:9");
    }

    #[test]
    fn hints_are_quoted_as_escape_strings() {
        assert_eq!(literal("1:2:run"), "E'1:2:run'");
        assert_eq!(literal(r"1:2:it's a \ run"), r"E'1:2:it''s a \\ run'");
        assert_eq!(
            statement(&["1:2".into(), "3:4".into()]),
            "SELECT pg_notify('sessionstore_commits', hint) FROM (VALUES (E'1:2'), (E'3:4')) AS hints (hint)"
        );
    }
}
