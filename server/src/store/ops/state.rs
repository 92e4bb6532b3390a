//! Per-session state entries.

use super::{SessionRow, Tx};
use crate::domain::{Change, Controlled, Error, Result, StateEntry, control};
use crate::store::text::{escape, escape_ordered};

impl Tx<'_> {
    /// The current version of a state entry, if it exists.
    pub(super) async fn state_version(
        &mut self,
        row: &SessionRow,
        key: &str,
    ) -> Result<Option<i64>> {
        Ok(sqlx::query_scalar(
            "SELECT version FROM session_state WHERE session_key = $1 AND key = $2",
        )
        .bind(row.key)
        .bind(escape_ordered(key))
        .fetch_optional(&mut *self.conn)
        .await?)
    }

    pub(super) async fn set_state(
        &mut self,
        row: &mut SessionRow,
        key: String,
        value: String,
        expected_version: Option<i64>,
    ) -> Result<Controlled> {
        let current = self.state_version(row, &key).await?;
        check_version(&key, expected_version, current)?;
        if current.is_none() {
            let entries: i64 =
                sqlx::query_scalar("SELECT COUNT(*) FROM session_state WHERE session_key = $1")
                    .bind(row.key)
                    .fetch_one(&mut *self.conn)
                    .await?;
            if entries >= control::MAX_STATE_ENTRIES {
                return Err(Error::LimitExceeded {
                    field: "key".into(),
                    limit: "max_state_entries",
                    description: format!(
                        "the session already holds {} state entries, the most allowed",
                        control::MAX_STATE_ENTRIES
                    ),
                });
            }
        }
        let version = row.session.revision + 1;
        sqlx::query(
            "INSERT INTO session_state (session_key, key, value, version, update_time) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (session_key, key) \
             DO UPDATE SET value = excluded.value, version = excluded.version, \
             update_time = excluded.update_time",
        )
        .bind(row.key)
        .bind(escape_ordered(&key))
        .bind(escape(&value))
        .bind(version)
        .bind(self.now.0)
        .execute(&mut *self.conn)
        .await?;
        let entry = StateEntry {
            key: key.clone(),
            value: value.clone(),
            version,
            update_time: self.now,
        };
        let change = Change::StateChanged {
            key,
            value,
            version,
            deleted: false,
        };
        self.bump(row, change).await?;
        Ok(Controlled::State(entry))
    }

    pub(super) async fn delete_state(
        &mut self,
        row: &mut SessionRow,
        key: String,
        expected_version: Option<i64>,
    ) -> Result<Controlled> {
        let Some(current) = self.state_version(row, &key).await? else {
            return Err(Error::StateNotFound(key));
        };
        check_version(&key, expected_version, Some(current))?;
        sqlx::query("DELETE FROM session_state WHERE session_key = $1 AND key = $2")
            .bind(row.key)
            .bind(escape_ordered(&key))
            .execute(&mut *self.conn)
            .await?;
        let change = Change::StateChanged {
            key,
            value: String::new(),
            version: row.session.revision + 1,
            deleted: true,
        };
        Ok(Controlled::Revision(self.bump(row, change).await?))
    }
}

/// Checks `expected_version` (0: must not exist) against the current version.
fn check_version(key: &str, expected: Option<i64>, current: Option<i64>) -> Result<()> {
    match expected {
        Some(expected) if expected != current.unwrap_or(0) => Err(Error::StateVersionMismatch {
            key: key.to_owned(),
            expected,
            actual: current.unwrap_or(0),
        }),
        _ => Ok(()),
    }
}
