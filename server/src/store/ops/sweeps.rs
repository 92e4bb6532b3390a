//! The sweeper's own write: purging deleted sessions' tombstones.

use super::{Tx, Written};
use crate::domain::{Result, Timestamp};

impl Tx<'_> {
    pub(super) async fn purge_tombstones(
        &mut self,
        before: Timestamp,
        limit: i64,
    ) -> Result<Written> {
        // Their events, and nothing else, are still there; the foreign keys cascade.
        let purged = sqlx::query(
            "DELETE FROM sessions WHERE key IN (SELECT key FROM sessions \
             WHERE deleted = 1 AND update_time < $1 ORDER BY update_time LIMIT $2)",
        )
        .bind(before.0)
        .bind(limit)
        .execute(&mut *self.conn)
        .await?;
        Ok(Written::Swept(purged.rows_affected()))
    }
}
