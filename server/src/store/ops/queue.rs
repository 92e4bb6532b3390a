//! Queued input: submitted while the session is busy, taken into the
//! history by the run holding the lease (in position order, each once),
//! or withdrawn. A session not busy takes a submission as an append.

use sqlx::Row;

use super::{NewRow, SessionRow, Tx, Write};
use crate::domain::control::{CancelRun, KeptReply};
use crate::domain::queue::{
    InputMode, MAX_WAITING_INPUTS, QueuedInput, SubmitInput, Submitted, Taken,
};
use crate::domain::{Change, Error, NewExchange, Result, ids};
use crate::store::text::escape;
use crate::wire;

/// SubmitInput on a session.
#[derive(Clone)]
pub struct Submit {
    pub session_id: String,
    pub input: SubmitInput,
}

/// TakeQueuedInput by the run holding the lease.
#[derive(Clone)]
pub struct TakeInput {
    pub session_id: String,
    pub run_id: String,
}

/// EndRun with `take_next`: the oldest waiting input taken, then the lease
/// freed, if the run holds it.
#[derive(Clone)]
pub struct EndRunTakingNext {
    pub session_id: String,
    pub run_id: String,
}

/// WithdrawQueuedInput.
#[derive(Clone)]
pub struct Withdraw {
    pub session_id: String,
    pub input_id: String,
}

/// An input's row states beside waiting (0, the default, which the
/// statements name as `state = 0`).
const TAKEN: i64 = 1;
const WITHDRAWN: i64 = 2;

impl Tx<'_> {
    /// How many inputs wait in the session's queue.
    async fn waiting_inputs(&mut self, row: &SessionRow) -> Result<i64> {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM queued_inputs WHERE session_key = $1 AND state = 0",
        )
        .bind(row.key)
        .fetch_one(&mut *self.conn)
        .await?;
        Ok(waiting)
    }

    async fn submit(
        &mut self,
        tenant: &str,
        mut row: SessionRow,
        input: SubmitInput,
    ) -> Result<Submitted> {
        let waiting = self.waiting_inputs(&row).await?;
        let leased = !row.session.active_run_id.is_empty();
        if !leased && waiting == 0 {
            let exchange = NewExchange {
                session_id: row.session.id.clone(),
                messages: input.messages,
                full_history: Vec::new(),
                provider_call: None,
                response_messages: Vec::new(),
                expected_next_sequence: None,
                request_id: String::new(),
                run_id: String::new(),
                state_changes: Vec::new(),
                create_if_missing: None,
            };
            let (revision, appended) = self.append_exchange(tenant, &exchange).await?;
            return Ok(Submitted {
                queued: false,
                input: None,
                messages: appended.messages,
                revision,
            });
        }
        if input.mode == InputMode::Reject {
            return Err(Error::SessionBusy {
                active_run_id: row.session.active_run_id.clone(),
                expire_time: row.session.run_expire_time,
            });
        }
        if waiting >= MAX_WAITING_INPUTS {
            return Err(Error::QueueFull(MAX_WAITING_INPUTS));
        }
        let last: Option<i64> =
            sqlx::query_scalar("SELECT MAX(position) FROM queued_inputs WHERE session_key = $1")
                .bind(row.key)
                .fetch_one(&mut *self.conn)
                .await?;
        let queued = QueuedInput {
            input_id: ids::input_id(),
            session_id: row.session.id.clone(),
            position: last.unwrap_or(0) + 1,
            messages: input.messages,
            mode: input.mode,
            create_time: self.now,
        };
        sqlx::query(
            "INSERT INTO queued_inputs (session_key, input_id, position, state, body) \
             VALUES ($1, $2, $3, 0, $4)",
        )
        .bind(row.key)
        .bind(escape(&queued.input_id))
        .bind(queued.position)
        .bind(wire::encode_queued_input(&queued))
        .execute(&mut *self.conn)
        .await?;
        let change = Change::InputQueued {
            input: queued.clone(),
        };
        self.bump(&mut row, change).await?;
        if input.mode == InputMode::Interrupt && leased {
            let cancel = CancelRun {
                run_id: row.session.active_run_id.clone(),
                reason: format!("input:{}", queued.input_id),
                publishing: false,
            };
            self.cancel_run(&mut row, cancel).await?;
        }
        Ok(Submitted {
            queued: true,
            input: Some(queued),
            messages: Vec::new(),
            revision: row.session.revision,
        })
    }

    /// Moves the session's oldest waiting input into the history for
    /// `run_id`: `None` if none waits.
    pub(super) async fn take_oldest(
        &mut self,
        row: &mut SessionRow,
        run_id: &str,
    ) -> Result<Option<Taken>> {
        let oldest: Option<Vec<u8>> = sqlx::query_scalar(
            "SELECT body FROM queued_inputs WHERE session_key = $1 AND state = 0 \
             ORDER BY position LIMIT 1",
        )
        .bind(row.key)
        .fetch_optional(&mut *self.conn)
        .await?;
        let Some(body) = oldest else {
            return Ok(None);
        };
        let input = wire::decode_queued_input(&body)?;
        let rows = input.messages.iter().cloned().map(NewRow::input);
        let messages = self.append_rows(row, rows).await?;
        let revision = row.session.revision + 1;
        sqlx::query(
            "UPDATE queued_inputs SET state = $1, end_revision = $2 \
             WHERE session_key = $3 AND input_id = $4",
        )
        .bind(TAKEN)
        .bind(revision)
        .bind(row.key)
        .bind(escape(&input.input_id))
        .execute(&mut *self.conn)
        .await?;
        let change = Change::InputTaken {
            input_id: input.input_id.clone(),
            position: input.position,
            run_id: run_id.to_owned(),
            messages: messages.clone(),
            next_sequence: row.session.next_sequence,
        };
        let revision = self.bump(row, change).await?;
        Ok(Some(Taken {
            input,
            messages,
            revision,
            next_sequence: row.session.next_sequence,
        }))
    }

    async fn withdraw(&mut self, row: &mut SessionRow, input_id: &str) -> Result<i64> {
        let found = sqlx::query(
            "SELECT position, state, end_revision FROM queued_inputs \
             WHERE session_key = $1 AND input_id = $2",
        )
        .bind(row.key)
        .bind(escape(input_id))
        .fetch_optional(&mut *self.conn)
        .await?
        .ok_or_else(|| Error::InputNotFound(input_id.to_owned()))?;
        let (position, state, end_revision): (i64, i64, i64) = (
            found.try_get("position")?,
            found.try_get("state")?,
            found.try_get("end_revision")?,
        );
        match state {
            WITHDRAWN => return Ok(end_revision),
            TAKEN => return Err(Error::InputAlreadyTaken(input_id.to_owned())),
            _ => {}
        }
        sqlx::query(
            "UPDATE queued_inputs SET state = $1, end_revision = $2 \
             WHERE session_key = $3 AND input_id = $4",
        )
        .bind(WITHDRAWN)
        .bind(row.session.revision + 1)
        .bind(row.key)
        .bind(escape(input_id))
        .execute(&mut *self.conn)
        .await?;
        let change = Change::InputWithdrawn {
            input_id: input_id.to_owned(),
            position,
        };
        self.bump(row, change).await
    }
}

/// Only the run holding the lease takes queued input.
fn check_holder(row: &SessionRow, run_id: &str) -> Result<()> {
    if row.session.active_run_id.is_empty() || row.session.active_run_id != run_id {
        return Err(Error::LeaseNotHeld(run_id.to_owned()));
    }
    Ok(())
}

impl Write for Submit {
    type Reply = Submitted;

    /// With a request id, a retry answers the first call's answer (kept
    /// with its key) before any other check, and writes nothing.
    async fn apply(self, tx: &mut Tx<'_>, tenant: &str) -> Result<Submitted> {
        let key = self.input.request_key(&self.session_id);
        if let Some(key) = &key
            && let Some(kept) = tx.kept_answer(tenant, key).await?
        {
            return match kept {
                KeptReply::Submitted(submitted) => Ok(submitted),
                KeptReply::RolledBack(_) => Err(Error::storage(std::io::Error::other(
                    "a SubmitInput key holds another call's answer",
                ))),
            };
        }
        let row = tx.load_live(tenant, &self.session_id).await?;
        let session_key = row.key;
        let submitted = tx.submit(tenant, row, self.input).await?;
        if let Some(key) = &key {
            let kept = wire::encode_kept(&KeptReply::Submitted(submitted.clone()));
            tx.keep_key(tenant, key, session_key, submitted.revision, Some(kept))
                .await?;
        }
        Ok(submitted)
    }
}

impl Write for TakeInput {
    type Reply = Taken;

    async fn apply(self, tx: &mut Tx<'_>, tenant: &str) -> Result<Taken> {
        let mut row = tx.load_live(tenant, &self.session_id).await?;
        check_holder(&row, &self.run_id)?;
        tx.take_oldest(&mut row, &self.run_id)
            .await?
            .ok_or(Error::QueueEmpty)
    }
}

impl Write for EndRunTakingNext {
    type Reply = (i64, Option<QueuedInput>);

    async fn apply(self, tx: &mut Tx<'_>, tenant: &str) -> Result<Self::Reply> {
        let mut row = tx.load_live(tenant, &self.session_id).await?;
        if row.session.active_run_id != self.run_id {
            return Ok((row.session.revision, None));
        }
        let taken = tx.take_oldest(&mut row, &self.run_id).await?;
        let revision = tx.end_run(&mut row, self.run_id).await?;
        Ok((revision, taken.map(|taken| taken.input)))
    }
}

impl Write for Withdraw {
    type Reply = i64;

    async fn apply(self, tx: &mut Tx<'_>, tenant: &str) -> Result<i64> {
        let mut row = tx.load_live(tenant, &self.session_id).await?;
        tx.withdraw(&mut row, &self.input_id).await
    }
}
