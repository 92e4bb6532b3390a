//! Conversation control: run leases, rollback, edits, redaction.

use super::{ControlSession, Dialect, SessionRow, Tx, Write};
use crate::domain::control::{
    Applier, BeginRun, CancelRun, ControlOp, DeleteState, Edit, Edited, EndRun, Redact, Rollback,
    RolledBack, RunBegun, SetState,
};
use crate::domain::{
    Change, Error, Message, Result, StateEntry, StoredMessage, Timestamp, control,
};
use crate::store::rows::{MESSAGE_COLUMNS, stored_message_from_row};
use crate::store::text::escape;
use crate::wire::{self, EncodedEvent};

impl<C: ControlOp> Write for ControlSession<C> {
    type Reply = C::Reply;

    /// With a request id, a retry answers the first call's answer (kept
    /// with its key) before any other check, and writes nothing.
    async fn apply(self, tx: &mut Tx<'_>, tenant: &str) -> Result<C::Reply> {
        let key = self.control.request_key();
        if let Some(key) = &key
            && let Some(kept) = tx.kept_answer(tenant, key).await?
        {
            return C::kept(kept).ok_or_else(|| {
                Error::storage(std::io::Error::other("a key holds another call's answer"))
            });
        }
        let row = tx.load_live(tenant, &self.id).await?;
        if let Some(run_id) = self.control.transcript_run() {
            Tx::check_lease(&row, run_id)?;
        }
        let mut on = OnSession { tx, row };
        let reply = self.control.apply(&mut on).await?;
        if let Some(key) = &key {
            let kept = C::keep(&reply).map(|kept| wire::encode_kept(&kept));
            let (session_key, revision) = (on.row.key, on.row.session.revision);
            on.tx
                .keep_key(tenant, key, session_key, revision, kept)
                .await?;
        }
        Ok(reply)
    }
}

/// A control's session, loaded (and its expired lease settled) in `tx`:
/// where each control's step runs.
struct OnSession<'t, 'c> {
    tx: &'t mut Tx<'c>,
    row: SessionRow,
}

impl Applier for OnSession<'_, '_> {
    async fn begin_run(&mut self, control: BeginRun) -> Result<RunBegun> {
        let BeginRun {
            run_id,
            lease_micros,
        } = control;
        self.tx.begin_run(&mut self.row, run_id, lease_micros).await
    }

    async fn end_run(&mut self, control: EndRun) -> Result<i64> {
        self.tx.end_run(&mut self.row, control.run_id).await
    }

    async fn cancel_run(&mut self, control: CancelRun) -> Result<i64> {
        self.tx.cancel_run(&mut self.row, control).await
    }

    async fn rollback(&mut self, control: Rollback) -> Result<RolledBack> {
        self.tx.rollback(&mut self.row, control).await
    }

    async fn edit(&mut self, control: Edit) -> Result<Edited> {
        let Edit {
            message_id,
            message,
            reason,
            ..
        } = control;
        self.tx
            .edit(&mut self.row, &message_id, message, reason)
            .await
    }

    async fn redact(&mut self, control: Redact) -> Result<i64> {
        self.tx
            .redact(&mut self.row, &control.message_id, control.reason)
            .await
    }

    async fn set_state(&mut self, control: SetState) -> Result<StateEntry> {
        let SetState {
            key,
            value,
            expected_version,
        } = control;
        self.tx
            .set_state(&mut self.row, key, value, expected_version)
            .await
    }

    async fn delete_state(&mut self, control: DeleteState) -> Result<i64> {
        self.tx
            .delete_state(&mut self.row, control.key, control.expected_version)
            .await
    }

    fn revision(&mut self) -> i64 {
        self.row.session.revision
    }
}

impl Tx<'_> {
    pub(super) async fn end_run(&mut self, row: &mut SessionRow, run_id: String) -> Result<i64> {
        if row.session.active_run_id != run_id {
            return Ok(row.session.revision);
        }
        sqlx::query("UPDATE sessions SET run_id = '', run_expire_time = 0 WHERE key = $1")
            .bind(row.key)
            .execute(&mut *self.conn)
            .await?;
        let change = Change::RunEnded {
            run_id,
            expired: false,
        };
        self.bump(row, change).await
    }

    /// Records a cancel once per run: a run cancelled before answers that
    /// cancel's revision and writes nothing; otherwise the run must be
    /// active (holding the lease, or publishing deltas).
    pub(super) async fn cancel_run(
        &mut self,
        row: &mut SessionRow,
        cancel: CancelRun,
    ) -> Result<i64> {
        let CancelRun {
            run_id,
            reason,
            publishing,
        } = cancel;
        let earlier: Option<i64> = sqlx::query_scalar(
            "SELECT revision FROM run_cancels WHERE session_key = $1 AND run_id = $2",
        )
        .bind(row.key)
        .bind(escape(&run_id))
        .fetch_optional(&mut *self.conn)
        .await?;
        if let Some(revision) = earlier {
            return Ok(revision);
        }
        // Loading the session settled an expired lease: a holder is live.
        if row.session.active_run_id != run_id && !publishing {
            return Err(Error::RunNotActive(run_id));
        }
        let escaped = escape(&run_id);
        let revision = self
            .bump(row, Change::RunCancelRequested { run_id, reason })
            .await?;
        sqlx::query("INSERT INTO run_cancels (session_key, run_id, revision) VALUES ($1, $2, $3)")
            .bind(row.key)
            .bind(escaped)
            .bind(revision)
            .execute(&mut *self.conn)
            .await?;
        Ok(revision)
    }

    pub(super) async fn begin_run(
        &mut self,
        row: &mut SessionRow,
        run_id: String,
        lease_micros: i64,
    ) -> Result<RunBegun> {
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
        Ok(RunBegun {
            revision,
            expire_time,
        })
    }

    pub(super) async fn rollback(
        &mut self,
        row: &mut SessionRow,
        rollback: Rollback,
    ) -> Result<RolledBack> {
        let after_sequence = rollback.after(row.session.next_sequence);
        let Rollback {
            expected_next_sequence,
            return_removed,
            ..
        } = rollback;
        if let Some(expected) = expected_next_sequence
            && expected != row.session.next_sequence
        {
            return Err(Error::SequenceMismatch {
                expected,
                actual: row.session.next_sequence,
            });
        }
        if after_sequence >= row.session.next_sequence - 1 {
            return Ok(RolledBack {
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
        self.keep_contents_in_events(row.key, after_sequence + 1, i64::MAX)
            .await?;
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
        Ok(RolledBack {
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
    ) -> Result<Edited> {
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
        Ok(Edited {
            revision,
            message: edited,
        })
    }

    /// Erases the message `message_id` from the decisions that appended it
    /// (a denial's tool result, kept to answer the decision's retry).
    async fn redact_kept_denials(&mut self, session_key: i64, message_id: &str) -> Result<()> {
        let kept: Vec<(String, Vec<u8>)> = sqlx::query_as(
            "SELECT approval_id, tool_result FROM approvals \
             WHERE session_key = $1 AND tool_result IS NOT NULL",
        )
        .bind(session_key)
        .fetch_all(&mut *self.conn)
        .await?;
        for (approval_id, encoded) in kept {
            let mut stored = wire::decode_stored_message(&encoded)?;
            if stored.id != message_id {
                continue;
            }
            stored.message = control::redacted(&stored.message);
            stored.redacted = true;
            sqlx::query(
                "UPDATE approvals SET tool_result = $1 WHERE session_key = $2 AND approval_id = $3",
            )
            .bind(wire::encode_stored_message(&stored))
            .bind(session_key)
            .bind(approval_id)
            .execute(&mut *self.conn)
            .await?;
        }
        Ok(())
    }

    pub(super) async fn redact(
        &mut self,
        row: &mut SessionRow,
        message_id: &str,
        reason: String,
    ) -> Result<i64> {
        let old = self.find_message(row, message_id).await?;
        let marker = control::redacted(&old.message);
        self.replace_message(row, &old, &marker, true).await?;
        // Erase it from the event history too: every event that carries its
        // content (its creation, and any edits). An event's encoding holds
        // the id's bytes as they are; the JSON of an event written before
        // the log kept encodings holds it as text. A rewritten event is
        // stored encoded.
        let pattern = format!("%{}%", old.id);
        let in_encoding = match self.dialect {
            Dialect::Sqlite => "instr(wire, $3) > 0",
            Dialect::Postgres => "position($3 in wire) > 0",
        };
        let revisions: Vec<i64> = sqlx::query_scalar(&format!(
            "SELECT revision FROM events \
             WHERE session_key = $1 AND (body LIKE $2 OR {in_encoding})"
        ))
        .bind(row.key)
        .bind(pattern)
        .bind(old.id.as_bytes())
        .fetch_all(&mut *self.conn)
        .await?;
        for revision in revisions {
            let Some(event) = self.logged_event(row.key, revision, false).await? else {
                continue;
            };
            let mut event = event.decode()?;
            if control::scrub(&mut event.change, &old.id) {
                let event = EncodedEvent::new(event);
                self.rewrite_event(row.key, revision, event.encoding())
                    .await?;
            }
        }
        self.redact_kept_denials(row.key, &old.id).await?;
        let change = Change::MessageRedacted {
            message_id: old.id,
            sequence: old.sequence,
            reason,
        };
        self.bump(row, change).await
    }
}
