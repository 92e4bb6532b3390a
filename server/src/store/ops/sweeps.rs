//! The sweeper's own write: purging deleted sessions' tombstones.

use super::{PurgeTombstones, Tx, Write};
use crate::domain::{Result, Timestamp};

impl Write for PurgeTombstones {
    type Reply = u64;

    async fn apply(self, tx: &mut Tx<'_>, _tenant: &str) -> Result<u64> {
        tx.purge_tombstones(self.before, self.limit).await
    }
}

impl Tx<'_> {
    async fn purge_tombstones(&mut self, before: Timestamp, limit: i64) -> Result<u64> {
        // Their events, and nothing else, are still there; the foreign keys cascade.
        let purged = sqlx::query(
            "DELETE FROM sessions WHERE key IN (SELECT key FROM sessions \
             WHERE deleted = 1 AND update_time < $1 ORDER BY update_time LIMIT $2)",
        )
        .bind(before.0)
        .bind(limit)
        .execute(&mut *self.conn)
        .await?;
        Ok(purged.rows_affected())
    }
}
