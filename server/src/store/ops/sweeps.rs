//! The sweeper's own write: purging deleted sessions' tombstones.

use super::{Dialect, PurgeTombstones, Tx, Write};
use crate::domain::{Result, Timestamp};

impl Write for PurgeTombstones {
    type Reply = u64;

    async fn apply(self, tx: &mut Tx<'_>, _tenant: &str) -> Result<u64> {
        tx.purge_tombstones(self.before, self.limit).await
    }
}

impl Tx<'_> {
    async fn purge_tombstones(&mut self, before: Timestamp, limit: i64) -> Result<u64> {
        let keys: Vec<i64> = sqlx::query_scalar(
            "SELECT key FROM sessions WHERE deleted = 1 AND update_time < $1 \
             ORDER BY update_time LIMIT $2",
        )
        .bind(before.0)
        .bind(limit)
        .fetch_all(&mut *self.conn)
        .await?;
        if keys.is_empty() {
            return Ok(0);
        }
        if self.dialect == Dialect::Postgres {
            // What a search rebuild may have written after the deletion.
            sqlx::query(&format!(
                "DELETE FROM message_search WHERE session_key IN ({})",
                key_list(&keys)
            ))
            .execute(&mut *self.conn)
            .await?;
        }
        self.delete_sessions(&keys).await
    }

    /// Deletes the sessions `keys` (tombstones, whose history is already
    /// gone but for their last event) with every row that names them.
    /// Answers how many sessions went.
    ///
    /// The tables an append writes have no foreign keys on PostgreSQL
    /// (migration 0012: each check cost a query per row), nor, for the
    /// idempotency keys, on SQLite (0019), so their rows are deleted here
    /// by key; the other tables' rows cascade.
    pub(super) async fn delete_sessions(&mut self, keys: &[i64]) -> Result<u64> {
        let keys_sql = key_list(keys);
        self.delete_idempotency_keys(&keys_sql).await?;
        for table in APPEND_TABLES {
            sqlx::query(&format!(
                "DELETE FROM {table} WHERE session_key IN ({keys_sql})"
            ))
            .execute(&mut *self.conn)
            .await?;
        }
        let deleted = sqlx::query(&format!("DELETE FROM sessions WHERE key IN ({keys_sql})"))
            .execute(&mut *self.conn)
            .await?;
        Ok(deleted.rows_affected())
    }

    /// Deletes the idempotency keys of the sessions `keys_sql` (an SQL
    /// list of keys, [`key_list`]), before their events: those their
    /// events name (migration 0019), and those written before, which their
    /// own index by session holds.
    pub(super) async fn delete_idempotency_keys(&mut self, keys_sql: &str) -> Result<()> {
        for sql in [
            format!(
                "DELETE FROM idempotency_keys WHERE (tenant, request_id) IN \
                 (SELECT s.tenant, e.request_id FROM events e JOIN sessions s ON s.key = e.session_key \
                 WHERE e.session_key IN ({keys_sql}) AND e.request_id IS NOT NULL)"
            ),
            format!(
                "DELETE FROM idempotency_keys \
                 WHERE session_key IN ({keys_sql}) AND found_through_event = 0"
            ),
        ] {
            sqlx::query(&sql).execute(&mut *self.conn).await?;
        }
        Ok(())
    }
}

/// The tables of a session's rows that an append writes, children first
/// (a message names its provider call), after its idempotency keys
/// ([`Tx::delete_idempotency_keys`]). PostgreSQL's `message_search` is
/// the fifth; its callers delete it, as it depends on the search mode.
const APPEND_TABLES: [&str; 3] = ["messages", "provider_calls", "events"];

/// `keys` as an SQL list. Keys the database gave: integers, safe to write
/// into the SQL.
pub(super) fn key_list(keys: &[i64]) -> String {
    keys.iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
