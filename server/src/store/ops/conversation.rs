//! Conversation control: run leases, rollback, edits, redaction.

use super::{ControlSession, SessionRow, Tx, Write};
use crate::domain::{
    Change, Control, Controlled, Error, Message, Result, StoredMessage, Timestamp, control,
};
use crate::store::rows::{MESSAGE_COLUMNS, decode, encode, stored_message_from_row};
use crate::store::text::escape;

impl Write for ControlSession {
    type Reply = Controlled;

    async fn apply(self, tx: &mut Tx<'_>, tenant: &str) -> Result<Controlled> {
        tx.control(tenant, &self.id, self.control).await
    }
}

impl Tx<'_> {
    async fn control(&mut self, tenant: &str, id: &str, control: Control) -> Result<Controlled> {
        let mut row = self.load_live(tenant, id).await?;
        if let Some(run_id) = control.transcript_run() {
            Self::check_lease(&row, run_id)?;
        }
        let controlled = match control {
            Control::BeginRun {
                run_id,
                lease_micros,
            } => self.begin_run(&mut row, run_id, lease_micros).await?,
            Control::EndRun { run_id } => {
                if row.session.active_run_id == run_id {
                    sqlx::query(
                        "UPDATE sessions SET run_id = '', run_expire_time = 0 WHERE key = $1",
                    )
                    .bind(row.key)
                    .execute(&mut *self.conn)
                    .await?;
                    let change = Change::RunEnded {
                        run_id,
                        expired: false,
                    };
                    Controlled::Revision(self.bump(&mut row, change).await?)
                } else {
                    Controlled::Revision(row.session.revision)
                }
            }
            Control::Rollback {
                after_sequence,
                expected_next_sequence,
                return_removed,
                ..
            } => {
                self.rollback(
                    &mut row,
                    after_sequence,
                    expected_next_sequence,
                    return_removed,
                )
                .await?
            }
            Control::Edit {
                message_id,
                message,
                reason,
                ..
            } => self.edit(&mut row, &message_id, message, reason).await?,
            Control::Redact {
                message_id, reason, ..
            } => self.redact(&mut row, &message_id, reason).await?,
            Control::SetState {
                key,
                value,
                expected_version,
            } => {
                self.set_state(&mut row, key, value, expected_version)
                    .await?
            }
            Control::DeleteState {
                key,
                expected_version,
            } => self.delete_state(&mut row, key, expected_version).await?,
            Control::SettleLease => Controlled::Revision(row.session.revision),
        };
        Ok(controlled)
    }

    pub(super) async fn begin_run(
        &mut self,
        row: &mut SessionRow,
        run_id: String,
        lease_micros: i64,
    ) -> Result<Controlled> {
        Self::check_lease(row, &run_id)?;
        let expire_time = Timestamp(self.now.0.saturating_add(lease_micros));
        sqlx::query("UPDATE sessions SET run_id = $1, run_expire_time = $2 WHERE key = $3")
            .bind(escape(&run_id))
            .bind(expire_time.0)
            .bind(row.key)
            .execute(&mut *self.conn)
            .await?;
        row.session.active_run_id = run_id.clone();
        row.session.run_expire_time = expire_time;
        let change = Change::RunBegun {
            run_id,
            expire_time,
        };
        let revision = self.bump(row, change).await?;
        Ok(Controlled::RunBegun {
            revision,
            expire_time,
        })
    }

    pub(super) async fn rollback(
        &mut self,
        row: &mut SessionRow,
        after_sequence: i64,
        expected_next_sequence: Option<i64>,
        return_removed: bool,
    ) -> Result<Controlled> {
        if let Some(expected) = expected_next_sequence
            && expected != row.session.next_sequence
        {
            return Err(Error::SequenceMismatch {
                expected,
                actual: row.session.next_sequence,
            });
        }
        if after_sequence >= row.session.next_sequence - 1 {
            return Ok(Controlled::RolledBack {
                revision: row.session.revision,
                next_sequence: row.session.next_sequence,
                removed: Vec::new(),
            });
        }
        let (removed, removed_messages) = if return_removed {
            let rows = sqlx::query(&format!(
                "SELECT {MESSAGE_COLUMNS} FROM messages \
                 WHERE session_key = $1 AND sequence > $2 ORDER BY sequence"
            ))
            .bind(row.key)
            .bind(after_sequence)
            .fetch_all(&mut *self.conn)
            .await?;
            let messages = rows
                .iter()
                .map(|found| stored_message_from_row(found, &row.session.id))
                .collect::<Result<Vec<_>>>()?;
            let ids = messages.iter().map(|message| message.id.clone()).collect();
            (ids, messages)
        } else {
            let ids: Vec<String> = sqlx::query_scalar(
                "SELECT id FROM messages WHERE session_key = $1 AND sequence > $2 \
                 ORDER BY sequence",
            )
            .bind(row.key)
            .bind(after_sequence)
            .fetch_all(&mut *self.conn)
            .await?;
            (ids, Vec::new())
        };
        sqlx::query("DELETE FROM messages WHERE session_key = $1 AND sequence > $2")
            .bind(row.key)
            .bind(after_sequence)
            .execute(&mut *self.conn)
            .await?;
        self.unindex(row.key, after_sequence + 1, row.session.next_sequence)
            .await?;
        let summary_cleared = removed.contains(&row.session.summary_message_id);
        if summary_cleared {
            row.session.summary_message_id.clear();
        }
        let next_sequence = after_sequence + 1;
        sqlx::query(
            "UPDATE sessions SET next_sequence = $1, message_count = $1, summary_message_id = $2 \
             WHERE key = $3",
        )
        .bind(next_sequence)
        .bind(escape(&row.session.summary_message_id))
        .bind(row.key)
        .execute(&mut *self.conn)
        .await?;
        row.session.next_sequence = next_sequence;
        let change = Change::RolledBack {
            after_sequence,
            removed_message_ids: removed,
            next_sequence,
            summary_cleared,
        };
        let revision = self.bump(row, change).await?;
        Ok(Controlled::RolledBack {
            revision,
            next_sequence,
            removed: removed_messages,
        })
    }

    pub(super) async fn edit(
        &mut self,
        row: &mut SessionRow,
        message_id: &str,
        message: Message,
        reason: String,
    ) -> Result<Controlled> {
        let old = self.find_message(row, message_id).await?;
        self.replace_message(row, &old, &message, false).await?;
        let edited = StoredMessage {
            message,
            redacted: false,
            ..old.clone()
        };
        let change = Change::MessageEdited {
            message: edited.clone(),
            previous: old.message,
            reason,
        };
        let revision = self.bump(row, change).await?;
        Ok(Controlled::Edited {
            revision,
            message: edited,
        })
    }

    pub(super) async fn redact(
        &mut self,
        row: &mut SessionRow,
        message_id: &str,
        reason: String,
    ) -> Result<Controlled> {
        let old = self.find_message(row, message_id).await?;
        let marker = control::redacted(&old.message);
        self.replace_message(row, &old, &marker, true).await?;
        // Erase it from the event history too: every event that carries its
        // content (its creation, and any edits).
        let pattern = format!("%{}%", old.id);
        let events: Vec<(i64, String)> = sqlx::query_as(
            "SELECT revision, body FROM events WHERE session_key = $1 AND body LIKE $2",
        )
        .bind(row.key)
        .bind(pattern)
        .fetch_all(&mut *self.conn)
        .await?;
        for (revision, body) in events {
            let mut change: Change = decode(&body)?;
            if control::scrub(&mut change, &old.id) {
                sqlx::query("UPDATE events SET body = $1 WHERE session_key = $2 AND revision = $3")
                    .bind(encode(&change)?)
                    .bind(row.key)
                    .bind(revision)
                    .execute(&mut *self.conn)
                    .await?;
            }
        }
        let change = Change::MessageRedacted {
            message_id: old.id,
            sequence: old.sequence,
            reason,
        };
        Ok(Controlled::Revision(self.bump(row, change).await?))
    }
}
