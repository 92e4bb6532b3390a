//! `--search on|off` on PostgreSQL. `message_search` is written by the
//! writes themselves (inline), so switching off is: writes skip it, and at
//! start the table is emptied and `search_index.built` set false.
//! Switching on again is: writes index what they write, and a builder task
//! indexes every stored message, a page at a time, then sets `built`.
//! Searches wait for `built` (then SEARCH_INDEX_BEHIND).
//!
//! One replica builds at a time: it claims `search_index` until
//! `claim_until` and renews the claim each page, so another replica takes
//! over only from one that stopped. A page inserts with `ON CONFLICT DO
//! NOTHING` what a write has not indexed meanwhile, and only messages still
//! there (a message rolled back after the page was read may leave a row
//! the search's join with `messages` never shows).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::{AnyPool, Row as _};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::domain::{Error, Result, Timestamp, control, search};
use crate::store::once::TakeOnce;
use crate::store::rows::Content;

/// Messages indexed per page (and per transaction) of a build.
const PAGE: i64 = 500;

/// How long a builder's claim holds without being renewed.
const CLAIM: Duration = Duration::from_secs(30);

/// How often a waiting search, or a replica not building, looks again.
const POLL: Duration = Duration::from_millis(100);

/// How long a search waits for the index to be built.
const SEARCH_WAIT: Duration = Duration::from_secs(30);

/// Whether the index is complete, as this replica knows it.
pub(super) struct SearchIndex {
    built: Arc<AtomicBool>,
    closing: watch::Sender<bool>,
    builder: TakeOnce<JoinHandle<()>>,
}

impl SearchIndex {
    /// Search switched off: no index, and none left behind.
    pub(super) async fn switch_off(pool: &AnyPool) -> Result<()> {
        let mut tx = pool.begin().await?;
        sqlx::query("UPDATE search_index SET built = false, builder = '', claim_until = 0")
            .execute(&mut *tx)
            .await?;
        sqlx::query("TRUNCATE message_search")
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Search on: reads whether the index is built, and if not starts the
    /// builder.
    pub(super) async fn start(pool: &AnyPool, replica: &str) -> Result<Self> {
        let built: bool = sqlx::query_scalar("SELECT built FROM search_index WHERE id = 1")
            .fetch_one(pool)
            .await?;
        let built = Arc::new(AtomicBool::new(built));
        let (closing, stop) = watch::channel(false);
        let builder = if built.load(Ordering::Acquire) {
            None
        } else {
            let task = build(pool.clone(), replica.to_owned(), Arc::clone(&built), stop);
            Some(tokio::spawn(task))
        };
        Ok(SearchIndex {
            built,
            closing,
            builder: TakeOnce::maybe(builder),
        })
    }

    /// Waits until the index is built (by this replica or another), at
    /// most [`SEARCH_WAIT`].
    pub(super) async fn ready(&self, pool: &AnyPool) -> Result<()> {
        let deadline = tokio::time::Instant::now() + SEARCH_WAIT;
        while !self.built.load(Ordering::Acquire) {
            let built: bool = sqlx::query_scalar("SELECT built FROM search_index WHERE id = 1")
                .fetch_one(pool)
                .await?;
            if built {
                self.built.store(true, Ordering::Release);
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::SearchIndexBehind);
            }
            tokio::time::sleep(POLL).await;
        }
        Ok(())
    }

    /// Stops the builder, if one runs (a later start resumes the build).
    pub(super) async fn stop(&self) {
        self.closing.send_replace(true);
        self.builder.join().await;
    }
}

/// The builder task: claims the build, indexes every page, marks it built.
async fn build(
    pool: AnyPool,
    replica: String,
    built: Arc<AtomicBool>,
    mut closing: watch::Receiver<bool>,
) {
    let mut after = (0_i64, -1_i64);
    loop {
        if *closing.borrow() {
            return;
        }
        let step = async {
            if !claim(&pool, &replica).await? {
                let done: bool = sqlx::query_scalar("SELECT built FROM search_index WHERE id = 1")
                    .fetch_one(&pool)
                    .await?;
                return Ok::<_, Error>(if done { Step::Done } else { Step::Wait });
            }
            match index_page(&pool, after).await? {
                Some(last) => Ok(Step::Indexed(last)),
                None => {
                    sqlx::query(
                        "UPDATE search_index SET built = true, builder = '', claim_until = 0 \
                         WHERE builder = $1",
                    )
                    .bind(&replica)
                    .execute(&pool)
                    .await?;
                    tracing::info!("the search index is built");
                    Ok(Step::Done)
                }
            }
        };
        match step.await {
            Ok(Step::Indexed(last)) => after = last,
            Ok(Step::Done) => {
                built.store(true, Ordering::Release);
                return;
            }
            Ok(Step::Wait) => pause(&mut closing).await,
            Err(error) => {
                tracing::warn!(%error, "building the search index failed; trying again");
                pause(&mut closing).await;
            }
        }
    }
}

enum Step {
    /// A page indexed, through this (session key, sequence).
    Indexed((i64, i64)),
    /// Another replica holds the claim.
    Wait,
    Done,
}

async fn pause(closing: &mut watch::Receiver<bool>) {
    let _ = tokio::time::timeout(POLL * 10, closing.changed()).await;
}

/// Takes or renews the claim on the build; whether this replica holds it.
async fn claim(pool: &AnyPool, replica: &str) -> Result<bool> {
    let now = Timestamp::now().0;
    let until = now + i64::try_from(CLAIM.as_micros()).unwrap_or(i64::MAX);
    let claimed = sqlx::query(
        "UPDATE search_index SET builder = $1, claim_until = $2 \
         WHERE id = 1 AND NOT built AND (builder IN ('', $1) OR claim_until < $3)",
    )
    .bind(replica)
    .bind(until)
    .bind(now)
    .execute(pool)
    .await?;
    Ok(claimed.rows_affected() == 1)
}

/// Indexes the page of current messages after `after`; the last one, or
/// `None` past the end.
async fn index_page(pool: &AnyPool, after: (i64, i64)) -> Result<Option<(i64, i64)>> {
    let rows = sqlx::query(
        "SELECT m.session_key, m.sequence, m.body, m.wire FROM messages m \
         JOIN sessions s ON s.key = m.session_key AND s.deleted = 0 \
         WHERE m.redacted = 0 AND (m.session_key, m.sequence) > ($1, $2) \
         ORDER BY m.session_key, m.sequence LIMIT $3",
    )
    .bind(after.0)
    .bind(after.1)
    .bind(PAGE)
    .fetch_all(pool)
    .await?;
    let Some(last) = rows.last() else {
        return Ok(None);
    };
    let last = (last.try_get("session_key")?, last.try_get("sequence")?);
    let mut texts = Vec::with_capacity(rows.len());
    for row in &rows {
        let message = Content::of(row.try_get("body")?, row.try_get("wire")?).message()?;
        let text = control::search_text(&message);
        if !text.trim().is_empty() {
            let key: i64 = row.try_get("session_key")?;
            let sequence: i64 = row.try_get("sequence")?;
            texts.push((key, sequence, search::tsvector(&text)));
        }
    }
    if !texts.is_empty() {
        let values: Vec<String> = (0..texts.len())
            .map(|i| {
                format!(
                    "(${}::bigint, ${}::bigint, ${}::text)",
                    3 * i + 1,
                    3 * i + 2,
                    3 * i + 3
                )
            })
            .collect();
        let sql = format!(
            "INSERT INTO message_search (session_key, sequence, words) \
             SELECT v.k, v.s, CAST(v.t AS tsvector) FROM (VALUES {}) AS v (k, s, t) \
             WHERE EXISTS (SELECT 1 FROM messages m \
                           WHERE m.session_key = v.k AND m.sequence = v.s AND m.redacted = 0) \
             ON CONFLICT DO NOTHING",
            values.join(", ")
        );
        let mut insert = sqlx::query(&sql);
        for (key, sequence, text) in texts {
            insert = insert.bind(key).bind(sequence).bind(text);
        }
        insert.execute(pool).await?;
    }
    Ok(Some(last))
}
