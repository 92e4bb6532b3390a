//! Per-session state entries.

use super::{Dialect, SessionRow, Tx, Write};
use crate::domain::{Change, Error, Result, StateChange, StateEntry, fields};
use crate::store::SharedStateWrite;
use crate::store::text::{escape, escape_ordered};

impl Tx<'_> {
    /// Writes a state entry of the session `session_key`, created or
    /// replaced, at `version` (the revision writing it).
    pub(super) async fn put_state(
        &mut self,
        session_key: i64,
        key: &str,
        value: &str,
        version: i64,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO session_state (session_key, key, value, version, update_time) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (session_key, key) \
             DO UPDATE SET value = excluded.value, version = excluded.version, \
             update_time = excluded.update_time",
        )
        .bind(session_key)
        .bind(escape_ordered(key))
        .bind(escape(value))
        .bind(version)
        .bind(self.now.0)
        .execute(&mut *self.conn)
        .await?;
        Ok(())
    }

    /// Writes the state changes of an append about to be decided on `row`,
    /// in the revision it will make: a session's entries at that revision,
    /// a shared scope's at their next version. Deleting a missing entry
    /// changes nothing.
    pub(super) async fn apply_state_changes(
        &mut self,
        tenant: &str,
        row: &SessionRow,
        changes: &[StateChange],
    ) -> Result<()> {
        let revision = row.session.revision + 1;
        for change in changes {
            match (change.scope.is_empty(), change.delete) {
                (true, true) => {
                    sqlx::query("DELETE FROM session_state WHERE session_key = $1 AND key = $2")
                        .bind(row.key)
                        .bind(escape_ordered(&change.key))
                        .execute(&mut *self.conn)
                        .await?;
                }
                (true, false) => {
                    if self.state_version(row, &change.key).await?.is_none() {
                        self.check_room(row).await?;
                    }
                    self.put_state(row.key, &change.key, &change.value, revision)
                        .await?;
                }
                (false, _) => self.apply_shared_change(tenant, change).await?,
            }
        }
        Ok(())
    }

    /// Writes a change to a shared scope of `tenant`: the entry at its
    /// next version, or deleted (a missing entry: nothing happens).
    pub(super) async fn apply_shared_change(
        &mut self,
        tenant: &str,
        change: &StateChange,
    ) -> Result<()> {
        if change.delete {
            sqlx::query("DELETE FROM shared_state WHERE tenant = $1 AND scope = $2 AND key = $3")
                .bind(escape(tenant))
                .bind(escape_ordered(&change.scope))
                .bind(escape_ordered(&change.key))
                .execute(&mut *self.conn)
                .await?;
            return Ok(());
        }
        let write = SharedStateWrite {
            scope: change.scope.clone(),
            key: change.key.clone(),
            value: change.value.clone(),
            expected_version: None,
        };
        self.set_shared_state(tenant, write).await?;
        Ok(())
    }

    /// Refuses a new entry in a session that holds the most allowed.
    async fn check_room(&mut self, row: &SessionRow) -> Result<()> {
        let entries: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM session_state WHERE session_key = $1")
                .bind(row.key)
                .fetch_one(&mut *self.conn)
                .await?;
        if entries >= fields::MAX_STATE_ENTRIES {
            return Err(full("session"));
        }
        Ok(())
    }

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
    ) -> Result<StateEntry> {
        let current = self.state_version(row, &key).await?;
        check_version(&key, expected_version, current)?;
        if current.is_none() {
            self.check_room(row).await?;
        }
        let version = row.session.revision + 1;
        self.put_state(row.key, &key, &value, version).await?;
        let entry = StateEntry {
            scope: String::new(),
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
        Ok(entry)
    }

    pub(super) async fn delete_state(
        &mut self,
        row: &mut SessionRow,
        key: String,
        expected_version: Option<i64>,
    ) -> Result<i64> {
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
        self.bump(row, change).await
    }
}

/// A new entry refused: the `session` or `scope` holds the most allowed.
fn full(holder: &str) -> Error {
    Error::LimitExceeded {
        field: "key".into(),
        limit: "max_state_entries",
        description: format!(
            "the {holder} already holds {} state entries, the most allowed",
            fields::MAX_STATE_ENTRIES
        ),
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

/// SetState on a shared scope of the tenant: answers the entry written.
#[derive(Clone)]
pub struct SetSharedState(pub SharedStateWrite);

/// DeleteState on a shared scope of the tenant.
#[derive(Clone)]
pub struct DeleteSharedState(pub SharedStateWrite);

impl Write for SetSharedState {
    type Reply = StateEntry;

    async fn apply(self, tx: &mut Tx<'_>, tenant: &str) -> Result<StateEntry> {
        tx.set_shared_state(tenant, self.0).await
    }
}

impl Write for DeleteSharedState {
    type Reply = ();

    async fn apply(self, tx: &mut Tx<'_>, tenant: &str) -> Result<()> {
        let entry = self.0;
        let current = tx
            .shared_version(tenant, &entry.scope, &entry.key)
            .await?
            .ok_or_else(|| Error::StateNotFound(entry.key.clone()))?;
        check_version(&entry.key, entry.expected_version, Some(current))?;
        sqlx::query("DELETE FROM shared_state WHERE tenant = $1 AND scope = $2 AND key = $3")
            .bind(escape(tenant))
            .bind(escape_ordered(&entry.scope))
            .bind(escape_ordered(&entry.key))
            .execute(&mut *tx.conn)
            .await?;
        Ok(())
    }
}

impl Tx<'_> {
    /// The current version of a shared entry, if it exists, its row
    /// locked on PostgreSQL until the transaction ends.
    async fn shared_version(
        &mut self,
        tenant: &str,
        scope: &str,
        key: &str,
    ) -> Result<Option<i64>> {
        let lock = match self.dialect {
            Dialect::Sqlite => "",
            Dialect::Postgres => " FOR UPDATE",
        };
        Ok(sqlx::query_scalar(&format!(
            "SELECT version FROM shared_state WHERE tenant = $1 AND scope = $2 AND key = $3{lock}"
        ))
        .bind(escape(tenant))
        .bind(escape_ordered(scope))
        .bind(escape_ordered(key))
        .fetch_optional(&mut *self.conn)
        .await?)
    }

    /// Writes a shared entry at its next version. A new key is a plain
    /// insert: on PostgreSQL two writers racing to create it collide on the
    /// primary key, and the loser is retried and then sees the winner's
    /// version.
    pub(super) async fn set_shared_state(
        &mut self,
        tenant: &str,
        set: SharedStateWrite,
    ) -> Result<StateEntry> {
        let SharedStateWrite {
            scope,
            key,
            value,
            expected_version,
        } = set;
        let current = self.shared_version(tenant, &scope, &key).await?;
        check_version(&key, expected_version, current)?;
        let version = match current {
            Some(current) => {
                sqlx::query(
                    "UPDATE shared_state SET value = $1, version = $2, update_time = $3 \
                     WHERE tenant = $4 AND scope = $5 AND key = $6",
                )
                .bind(escape(&value))
                .bind(current + 1)
                .bind(self.now.0)
                .bind(escape(tenant))
                .bind(escape_ordered(&scope))
                .bind(escape_ordered(&key))
                .execute(&mut *self.conn)
                .await?;
                current + 1
            }
            None => {
                let entries: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM shared_state WHERE tenant = $1 AND scope = $2",
                )
                .bind(escape(tenant))
                .bind(escape_ordered(&scope))
                .fetch_one(&mut *self.conn)
                .await?;
                if entries >= fields::MAX_STATE_ENTRIES {
                    return Err(full("scope"));
                }
                sqlx::query(
                    "INSERT INTO shared_state (tenant, scope, key, value, version, update_time) \
                     VALUES ($1, $2, $3, $4, 1, $5)",
                )
                .bind(escape(tenant))
                .bind(escape_ordered(&scope))
                .bind(escape_ordered(&key))
                .bind(escape(&value))
                .bind(self.now.0)
                .execute(&mut *self.conn)
                .await?;
                1
            }
        };
        Ok(StateEntry {
            scope,
            key,
            value,
            version,
            update_time: self.now,
        })
    }
}
