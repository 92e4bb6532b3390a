//! EraseUser's writes. An erasure is many transactions, none of them
//! long, so that erasing a user with thousands of sessions never holds a
//! writer for more than a batch (SQLite has one writer for every tenant):
//!
//! 1. [`EraseMark`], until it finds none: a batch of the user's live
//!    sessions become tombstones, as DeleteSession makes them (gone from
//!    every read, `session_deleted` recorded and sent to watchers), with
//!    their rows still there;
//! 2. [`EraseRows`], until it says there are no more: a bounded number of
//!    those rows deleted (DeleteSession deletes one tombstone's so too),
//!    table by table (messages first, so deleting a
//!    provider call never has messages left to update; each batch of
//!    events after the idempotency keys they name);
//! 3. [`EraseTombstones`], until it finds none: a batch of the tombstones
//!    themselves (each keeps its last event until then, for other
//!    replicas' watchers), with their search entries;
//! 4. [`EraseFinish`]: the shared scopes named, and the content-free
//!    record.
//!
//! Each step finds its rows by the user again, so an erasure cut short
//! (the server went away) is finished by the next one.

use sha2::{Digest as _, Sha256};
use sqlx::Row as _;

use super::sweeps::key_list;
use super::{Dialect, SearchWrites, SessionRow, Tx, Write};
use crate::domain::Result;
use crate::domain::erase::Erased;
use crate::store::rows::{SESSION_COLUMNS, session_from_row};
use crate::store::text::{escape, escape_ordered};

/// The keys of a user's tombstones (`$1` tenant, `$2` user).
const TOMBSTONES: &str =
    "SELECT key FROM sessions WHERE tenant = $1 AND user_name = $2 AND deleted = 1";

/// Step 1: at most `limit` live sessions of `user` made tombstones.
/// Answers how many.
#[derive(Clone)]
pub struct EraseMark {
    pub user: String,
    pub limit: i64,
}

/// Step 2: at most `limit` rows of the user's tombstones deleted. Also
/// DeleteSession's (and the sweeper's deletes'), for the one tombstone it
/// made.
#[derive(Clone)]
pub struct EraseRows {
    pub of: Tombstones,
    pub limit: i64,
    /// How many of its tables, in the order it deletes from them, an
    /// earlier batch found empty of the tombstones' rows
    /// ([`RowsErased::emptied`]): skipped. (Looking again costs PostgreSQL
    /// a walk past every index entry the batches before left dead: 2.4 s
    /// of a 200,000-message session's deletion.) Nothing writes to a
    /// tombstone, but a user's tombstones can grow while another replica
    /// erases the same user: the caller ends with a batch over every
    /// table.
    pub emptied: usize,
}

/// The tombstones whose rows [`EraseRows`] deletes.
#[derive(Clone)]
pub enum Tombstones {
    /// A user's (EraseUser).
    OfUser(String),
    /// One deleted session's, by its key.
    Session(i64),
}

/// A statement as the store runs it.
type Query<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

impl Tombstones {
    /// The statement selecting their keys: `$1` the tenant, `$2` what
    /// [`Tombstones::bind`] binds.
    fn keys(&self) -> &'static str {
        match self {
            Tombstones::OfUser(_) => TOMBSTONES,
            Tombstones::Session(_) => {
                "SELECT key FROM sessions WHERE tenant = $1 AND key = $2 AND deleted = 1"
            }
        }
    }

    /// Binds `$2` of [`Tombstones::keys`].
    fn bind<'q>(&self, query: Query<'q>) -> Query<'q> {
        match self {
            Tombstones::OfUser(user) => query.bind(escape(user)),
            Tombstones::Session(key) => query.bind(*key),
        }
    }
}

/// What one [`EraseRows`] deleted, and whether rows are left.
pub struct RowsErased {
    pub messages: i64,
    pub provider_calls: i64,
    pub more: bool,
    /// How many of its tables, in order, hold none of the tombstones'
    /// rows now: the next batch's [`EraseRows::emptied`].
    pub emptied: usize,
}

/// Step 3: at most `limit` of the user's tombstones, with their search
/// entries (and, on PostgreSQL, spilled deltas). Answers how many.
#[derive(Clone)]
pub struct EraseTombstones {
    pub user: String,
    pub limit: i64,
}

/// Step 4: the shared `scopes`, and the record of the erasure (`erased`,
/// its counts so far). Answers the scopes' entries deleted.
#[derive(Clone)]
pub struct EraseFinish {
    pub user: String,
    pub scopes: Vec<String>,
    pub erased: Erased,
}

impl Write for EraseMark {
    type Reply = i64;

    async fn apply(self, tx: &mut Tx<'_>, tenant: &str) -> Result<i64> {
        let lock = match tx.dialect {
            Dialect::Sqlite => "",
            Dialect::Postgres => " FOR UPDATE",
        };
        let found = sqlx::query(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions \
             WHERE tenant = $1 AND user_name = $2 AND deleted = 0 LIMIT $3{lock}"
        ))
        .bind(escape(tenant))
        .bind(escape(&self.user))
        .bind(self.limit)
        .fetch_all(&mut *tx.conn)
        .await?;
        let mut marked = 0;
        for row in found {
            let mut row = SessionRow {
                key: row.try_get("key")?,
                session: session_from_row(&row)?,
            };
            tx.tombstone(&mut row).await?;
            marked += 1;
        }
        Ok(marked)
    }
}

impl Write for EraseRows {
    type Reply = RowsErased;

    async fn apply(self, tx: &mut Tx<'_>, tenant: &str) -> Result<RowsErased> {
        // (table, its key columns, which rows): a tombstone's last event
        // stays until the tombstone goes.
        let mut tables = vec![
            ("messages", "session_key, sequence", ""),
            (
                "events",
                "session_key, revision",
                "AND t.revision < (SELECT s.revision FROM sessions s WHERE s.key = t.session_key) \
                 ORDER BY t.session_key, t.revision",
            ),
            ("provider_calls", call_key(tx.dialect), ""),
            (
                "idempotency_keys",
                "tenant, request_id",
                "AND t.found_through_event = 0",
            ),
            ("session_state", "session_key, key", ""),
        ];
        if tx.search == SearchWrites::Inline && tx.dialect == Dialect::Postgres {
            tables.push(("message_search", "session_key, sequence", ""));
        }
        let skipped = self.emptied.min(tables.len());
        let mut erased = RowsErased {
            messages: 0,
            provider_calls: 0,
            more: false,
            emptied: skipped,
        };
        let mut budget = self.limit;
        let tombstones = self.of.keys();
        for (table, columns, which) in tables.into_iter().skip(skipped) {
            // On PostgreSQL one session's rows in their key's order: a
            // plain scan walks again, batch after batch, past the rows
            // the batches before deleted (dead until vacuumed): a session
            // of 200,000 messages took 73 s, and 14 s in order. (SQLite
            // deletes rows outright, and there the order could make it
            // walk a table by its row id.)
            let order = match (&self.of, tx.dialect, table) {
                (
                    Tombstones::Session(_),
                    Dialect::Postgres,
                    "messages" | "provider_calls" | "session_state" | "message_search",
                ) => format!("ORDER BY {columns}"),
                _ => String::new(),
            };
            let rows = format!(
                "SELECT {} FROM {table} t WHERE t.session_key IN ({tombstones}) {which} \
                 {order} LIMIT $3",
                selected(tx.dialect, columns)
            );
            let deleted = if table == "events" {
                delete_events(tx, tenant, &self.of, (columns, which, &rows), budget).await?
            } else {
                delete_rows(tx, table, columns, &rows, tenant, &self.of, budget).await?
            };
            let deleted = i64::try_from(deleted).unwrap_or(i64::MAX);
            match table {
                "messages" => erased.messages = deleted,
                "provider_calls" => erased.provider_calls = deleted,
                _ => {}
            }
            budget -= deleted;
            if budget <= 0 {
                erased.more = true;
                break;
            }
            // Fewer than the batch allowed: none of its rows are left.
            erased.emptied += 1;
        }
        Ok(erased)
    }
}

/// Deletes a batch of a tombstone's events (`rows` selects them; `which`
/// narrows the events table) and the idempotency keys they name: how many
/// events went.
async fn delete_events(
    tx: &mut Tx<'_>,
    tenant: &str,
    of: &Tombstones,
    (columns, which, rows): (&str, &str, &str),
    budget: i64,
) -> Result<u64> {
    let tombstones = of.keys();
    Ok(match tx.dialect {
        // A batch of events goes with the idempotency keys they
        // name (migration 0019; keys written before are found by
        // session, below). On PostgreSQL in one statement, so the
        // keys are those of exactly the events it deleted, even
        // while another replica erases the same user.
        Dialect::Postgres => {
            let statement = format!(
                "WITH gone AS (DELETE FROM events WHERE {} \
                 RETURNING request_id), \
                 keys AS (DELETE FROM idempotency_keys WHERE tenant = $1 \
                 AND request_id IN (SELECT request_id FROM gone)) \
                 SELECT count(*) FROM gone",
                chosen(tx.dialect, columns, rows)
            );
            let deleted: i64 = of
                .bind(sqlx::query(&statement).bind(escape(tenant)))
                .bind(budget)
                .fetch_one(&mut *tx.conn)
                .await?
                .try_get(0)?;
            u64::try_from(deleted).unwrap_or(0)
        }
        // On SQLite (one writer) the keys first, then the same
        // events, chosen in the same order.
        Dialect::Sqlite => {
            let statement = format!(
                "DELETE FROM idempotency_keys WHERE tenant = $1 AND request_id IN \
                 (SELECT t.request_id FROM events t \
                 WHERE t.session_key IN ({tombstones}) {which} LIMIT $3)"
            );
            of.bind(sqlx::query(&statement).bind(escape(tenant)))
                .bind(budget)
                .execute(&mut *tx.conn)
                .await?;
            delete_rows(tx, "events", columns, rows, tenant, of, budget).await?
        }
    })
}

impl Write for EraseTombstones {
    type Reply = i64;

    async fn apply(self, tx: &mut Tx<'_>, tenant: &str) -> Result<i64> {
        let keys: Vec<i64> = sqlx::query_scalar(&format!("{TOMBSTONES} LIMIT $3"))
            .bind(escape(tenant))
            .bind(escape(&self.user))
            .bind(self.limit)
            .fetch_all(&mut *tx.conn)
            .await?;
        if keys.is_empty() {
            return Ok(0);
        }
        let keys_sql = key_list(&keys);
        match tx.dialect {
            Dialect::Sqlite => {
                // Their messages are gone: re-indexing each whole range
                // removes every entry (the indexer thread, which logs
                // cannot bypass), or deletes them (in memory).
                for &key in &keys {
                    tx.unindex(key, 0, 1 << 32).await?;
                }
            }
            Dialect::Postgres => {
                // What the search builder may have written since step 2,
                // and spilled deltas.
                for table in ["message_search", "delta_spill"] {
                    sqlx::query(&format!(
                        "DELETE FROM {table} WHERE session_key IN ({keys_sql})"
                    ))
                    .execute(&mut *tx.conn)
                    .await?;
                }
            }
        }
        // The tombstones, with their last events.
        tx.delete_sessions(&keys).await?;
        Ok(i64::try_from(keys.len()).unwrap_or(i64::MAX))
    }
}

impl Write for EraseFinish {
    type Reply = i64;

    async fn apply(self, tx: &mut Tx<'_>, tenant: &str) -> Result<i64> {
        let mut entries = 0;
        for scope in &self.scopes {
            let deleted = sqlx::query("DELETE FROM shared_state WHERE tenant = $1 AND scope = $2")
                .bind(escape(tenant))
                .bind(escape_ordered(scope))
                .execute(&mut *tx.conn)
                .await?
                .rows_affected();
            entries += i64::try_from(deleted).unwrap_or(i64::MAX);
        }
        let erased = self.erased;
        sqlx::query(
            "INSERT INTO erasures (tenant, user_sha256, time, sessions_deleted, \
             messages_deleted, provider_calls_deleted, state_entries_deleted) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(escape(tenant))
        .bind(sha256_hex(&self.user))
        .bind(tx.now.0)
        .bind(erased.sessions)
        .bind(erased.messages)
        .bind(erased.provider_calls)
        .bind(entries)
        .execute(&mut *tx.conn)
        .await?;
        Ok(entries)
    }
}

/// Deletes the rows of `table` whose `columns` the statement `rows`
/// selects (`$1` tenant, `$2` whose tombstones, `$3` at most how many);
/// how many went.
async fn delete_rows(
    tx: &mut Tx<'_>,
    table: &str,
    columns: &str,
    rows: &str,
    tenant: &str,
    of: &Tombstones,
    limit: i64,
) -> Result<u64> {
    let statement = format!(
        "DELETE FROM {table} WHERE {}",
        chosen(tx.dialect, columns, rows)
    );
    Ok(of
        .bind(sqlx::query(&statement).bind(escape(tenant)))
        .bind(limit)
        .execute(&mut *tx.conn)
        .await?
        .rows_affected())
}

/// What a batch's `rows` select (`t` their table): on PostgreSQL each
/// row's `ctid`, which [`chosen`] deletes by without looking each key up
/// again (a third less time for a batch of messages, measured); on
/// SQLite the key `columns`. Rows of a tombstone are never updated, so
/// the `ctid`s stay theirs for the statement.
fn selected(dialect: Dialect, columns: &str) -> &str {
    match dialect {
        Dialect::Sqlite => columns,
        Dialect::Postgres => "t.ctid",
    }
}

/// The condition that deletes the rows `rows` selects ([`selected`]).
fn chosen(dialect: Dialect, columns: &str, rows: &str) -> String {
    match dialect {
        Dialect::Sqlite => format!("({columns}) IN ({rows})"),
        Dialect::Postgres => format!("ctid = ANY(ARRAY({rows}))"),
    }
}

/// The record's stand-in for the user: it names no byte of the user, yet
/// says whether a given user was erased.
fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// A provider call's key: its row id on SQLite (`ordinal`), the primary key
/// `(session_key, ordinal)` on PostgreSQL (migration 0014).
fn call_key(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Sqlite => "ordinal",
        Dialect::Postgres => "session_key, ordinal",
    }
}
