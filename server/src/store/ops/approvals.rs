//! Tool approvals: requested on a tool call of the history, decided once
//! (a denial appends the call's tool result in the same revision), expired
//! by the sweeper or before any call that reads or decides them.

use sqlx::Row;
use sqlx::any::AnyRow;

use super::{SessionRow, Tx, Write};
use crate::domain::approvals::{
    Approval, ApprovalState, DecideApproval, Decided, Decision, RequestApproval,
};
use crate::domain::{Change, Error, Message, Result, Role, StoredMessage, Timestamp, ids};
use crate::store::rows::{MESSAGE_COLUMNS, stored_message_from_row, text_col};
use crate::store::text::escape;
use crate::wire;

/// The columns [`approval_from_row`] reads.
pub const APPROVAL_COLUMNS: &str = "a.approval_id, s.id AS session_id, a.run_id, \
     a.tool_call_id, a.title, a.detail_json, a.state, a.decided_by, a.reason, a.create_time, \
     a.decide_time, a.expire_time";

/// An approval row joined with its session (`a`, `s`).
pub fn approval_from_row(row: &AnyRow) -> Result<Approval> {
    let state: i64 = row.try_get("state")?;
    Ok(Approval {
        approval_id: text_col(row, "approval_id")?,
        session_id: text_col(row, "session_id")?,
        run_id: text_col(row, "run_id")?,
        tool_call_id: text_col(row, "tool_call_id")?,
        title: text_col(row, "title")?,
        detail_json: text_col(row, "detail_json")?,
        state: ApprovalState::from_code(state).ok_or_else(|| {
            Error::storage(std::io::Error::other("an approval in no known state"))
        })?,
        decided_by: text_col(row, "decided_by")?,
        reason: text_col(row, "reason")?,
        create_time: Timestamp(row.try_get("create_time")?),
        decide_time: Timestamp(row.try_get("decide_time")?),
        expire_time: Timestamp(row.try_get("expire_time")?),
    })
}

/// RequestApproval on a session.
#[derive(Clone)]
pub struct AskApproval {
    pub session_id: String,
    pub request: RequestApproval,
}

/// DecideApproval on a session.
#[derive(Clone)]
pub struct Decide {
    pub session_id: String,
    pub decision: DecideApproval,
}

/// Records the expiry of a session's approvals whose time has come.
#[derive(Clone)]
pub struct ExpireApprovals {
    pub session_id: String,
}

/// Where a tool call stands in a session's history.
enum CallInHistory {
    /// Made, and not answered: the call's name.
    Open(String),
    Answered,
    Absent,
}

/// A decided approval's row: the approval, its decision's request id and
/// revision, and a denial's kept tool result.
struct DecidedRow {
    approval: Approval,
    request_id: String,
    revision: i64,
    tool_result: Option<Vec<u8>>,
}

impl Tx<'_> {
    /// Where `tool_call_id` stands: the history read newest first until a
    /// message answers or makes the call.
    async fn tool_call(&mut self, row: &SessionRow, tool_call_id: &str) -> Result<CallInHistory> {
        let rows = sqlx::query(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_key = $1 ORDER BY sequence DESC"
        ))
        .bind(row.key)
        .fetch_all(&mut *self.conn)
        .await?;
        for found in &rows {
            let message = stored_message_from_row(found, &row.session.id)?.message;
            if message.answered_tool_calls().any(|id| id == tool_call_id) {
                return Ok(CallInHistory::Answered);
            }
            if message.makes_tool_call(tool_call_id) {
                return Ok(CallInHistory::Open(call_name(&message, tool_call_id)));
            }
        }
        Ok(CallInHistory::Absent)
    }

    /// Records the expiry of the session's pending approvals whose time has
    /// come: a revision each (`approval_decided`, state EXPIRED).
    async fn expire_due(&mut self, row: &mut SessionRow) -> Result<()> {
        let due = sqlx::query(&format!(
            "SELECT {APPROVAL_COLUMNS} FROM approvals a JOIN sessions s ON s.key = a.session_key \
             WHERE a.session_key = $1 AND a.state = 1 AND a.expire_time > 0 \
             AND a.expire_time <= $2 ORDER BY a.create_time, a.approval_id"
        ))
        .bind(row.key)
        .bind(self.now.0)
        .fetch_all(&mut *self.conn)
        .await?;
        for found in &due {
            let mut approval = approval_from_row(found)?;
            approval.state = ApprovalState::Expired;
            approval.decide_time = self.now;
            sqlx::query(
                "UPDATE approvals SET state = 4, decide_time = $1 \
                 WHERE session_key = $2 AND approval_id = $3",
            )
            .bind(self.now.0)
            .bind(row.key)
            .bind(escape(&approval.approval_id))
            .execute(&mut *self.conn)
            .await?;
            let change = Change::ApprovalDecided {
                approval,
                tool_result: None,
                next_sequence: row.session.next_sequence,
            };
            self.bump(row, change).await?;
        }
        Ok(())
    }

    async fn ask_approval(
        &mut self,
        tenant: &str,
        row: &mut SessionRow,
        request: RequestApproval,
    ) -> Result<(Approval, i64)> {
        Tx::check_lease(row, &request.run_id)?;
        self.expire_due(row).await?;
        match self.tool_call(row, &request.tool_call_id).await? {
            CallInHistory::Open(_) => {}
            CallInHistory::Answered => {
                return Err(Error::ToolCallAnswered(request.tool_call_id));
            }
            CallInHistory::Absent => return Err(Error::UnknownToolCall(request.tool_call_id)),
        }
        let open: Option<String> = sqlx::query_scalar(
            "SELECT approval_id FROM approvals \
             WHERE session_key = $1 AND tool_call_id = $2 AND state IN (1, 2) LIMIT 1",
        )
        .bind(row.key)
        .bind(escape(&request.tool_call_id))
        .fetch_optional(&mut *self.conn)
        .await?;
        if let Some(approval_id) = open {
            return Err(Error::ApprovalExists {
                tool_call_id: request.tool_call_id,
                approval_id,
            });
        }
        let approval = Approval {
            approval_id: ids::approval_id(),
            session_id: row.session.id.clone(),
            run_id: request.run_id,
            tool_call_id: request.tool_call_id,
            title: request.title,
            detail_json: request.detail_json,
            state: ApprovalState::Pending,
            decided_by: String::new(),
            reason: String::new(),
            create_time: self.now,
            decide_time: Timestamp(0),
            expire_time: request.expire_time,
        };
        sqlx::query(
            "INSERT INTO approvals (session_key, approval_id, tenant, run_id, tool_call_id, \
             title, detail_json, state, create_time, expire_time) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, 1, $8, $9)",
        )
        .bind(row.key)
        .bind(escape(&approval.approval_id))
        .bind(escape(tenant))
        .bind(escape(&approval.run_id))
        .bind(escape(&approval.tool_call_id))
        .bind(escape(&approval.title))
        .bind(escape(&approval.detail_json))
        .bind(self.now.0)
        .bind(approval.expire_time.0)
        .execute(&mut *self.conn)
        .await?;
        let revision = self
            .bump(
                row,
                Change::ApprovalRequested {
                    approval: approval.clone(),
                },
            )
            .await?;
        Ok((approval, revision))
    }

    async fn decided_row(&mut self, row: &SessionRow, approval_id: &str) -> Result<DecidedRow> {
        let found = sqlx::query(&format!(
            "SELECT {APPROVAL_COLUMNS}, a.decide_request_id, a.decide_revision, a.tool_result \
             FROM approvals a JOIN sessions s ON s.key = a.session_key \
             WHERE a.session_key = $1 AND a.approval_id = $2"
        ))
        .bind(row.key)
        .bind(escape(approval_id))
        .fetch_optional(&mut *self.conn)
        .await?
        .ok_or_else(|| Error::ApprovalNotFound(approval_id.to_owned()))?;
        Ok(DecidedRow {
            approval: approval_from_row(&found)?,
            request_id: text_col(&found, "decide_request_id")?,
            revision: found.try_get("decide_revision")?,
            tool_result: found.try_get("tool_result")?,
        })
    }

    async fn decide(&mut self, row: &mut SessionRow, decision: DecideApproval) -> Result<Decided> {
        let stored = self.decided_row(row, &decision.approval_id).await?;
        let mut approval = stored.approval;
        if approval.state != ApprovalState::Pending {
            if !decision.request_id.is_empty()
                && stored.request_id == decision.request_id
                && decision.recorded_in(&approval)
            {
                let tool_result = stored
                    .tool_result
                    .as_deref()
                    .map(wire::decode_stored_message)
                    .transpose()?;
                return Ok(Decided {
                    approval,
                    revision: stored.revision,
                    tool_result,
                });
            }
            if approval.state == ApprovalState::Expired {
                return Err(Error::ApprovalExpired(approval.approval_id));
            }
            return Err(Error::ApprovalAlreadyDecided {
                state: approval.state.enum_name(),
                approval_id: approval.approval_id,
                decided_by: approval.decided_by,
            });
        }
        if approval.is_due(self.now) {
            // Its expiry is recorded before this call (by the store, or the
            // sweeper): a refused call writes nothing.
            return Err(Error::ApprovalExpired(approval.approval_id));
        }
        approval.state = match decision.decision {
            Decision::Approve => ApprovalState::Approved,
            Decision::Deny => ApprovalState::Denied,
        };
        approval.reason = decision.reason;
        approval.decided_by = decision.decided_by;
        approval.decide_time = self.now;
        let tool_result = match decision.decision {
            Decision::Approve => None,
            Decision::Deny => self.deny(row, &approval).await?,
        };
        let revision = row.session.revision + 1;
        let kept = tool_result.as_ref().map(wire::encode_stored_message);
        sqlx::query(
            "UPDATE approvals SET state = $1, decided_by = $2, reason = $3, decide_time = $4, \
             decide_request_id = $5, decide_revision = $6, tool_result = $7 \
             WHERE session_key = $8 AND approval_id = $9",
        )
        .bind(approval.state.code())
        .bind(escape(&approval.decided_by))
        .bind(escape(&approval.reason))
        .bind(self.now.0)
        .bind(escape(&decision.request_id))
        .bind(revision)
        .bind(kept)
        .bind(row.key)
        .bind(escape(&approval.approval_id))
        .execute(&mut *self.conn)
        .await?;
        let change = Change::ApprovalDecided {
            approval: approval.clone(),
            tool_result: tool_result.clone(),
            next_sequence: row.session.next_sequence,
        };
        let revision = self.bump(row, change).await?;
        Ok(Decided {
            approval,
            revision,
            tool_result,
        })
    }

    /// A denial's tool result, appended at the session's next sequence,
    /// if the call is still made and unanswered in the history.
    async fn deny(
        &mut self,
        row: &mut SessionRow,
        approval: &Approval,
    ) -> Result<Option<StoredMessage>> {
        let CallInHistory::Open(name) = self.tool_call(row, &approval.tool_call_id).await? else {
            return Ok(None);
        };
        let message = Message {
            tool_call_id: approval.tool_call_id.clone(),
            tool_error: true,
            name,
            ..Message::text(Role::Tool, approval.reason.clone())
        };
        let mut stored = self
            .append_rows(row, [super::NewRow::input(message)])
            .await?;
        Ok(stored.pop())
    }
}

/// The name of the tool call `id` that `message` makes.
fn call_name(message: &Message, id: &str) -> String {
    message
        .tool_calls
        .iter()
        .find(|call| call.id == id)
        .map(|call| call.name.clone())
        .or_else(|| {
            message.content_blocks.iter().find_map(|block| match block {
                crate::domain::ContentBlock::ToolUse {
                    id: use_id, name, ..
                } if use_id == id => Some(name.clone()),
                _ => None,
            })
        })
        .unwrap_or_default()
}

impl Write for AskApproval {
    type Reply = (Approval, i64);

    async fn apply(self, tx: &mut Tx<'_>, tenant: &str) -> Result<Self::Reply> {
        let mut row = tx.load_live(tenant, &self.session_id).await?;
        tx.ask_approval(tenant, &mut row, self.request).await
    }
}

impl Write for Decide {
    type Reply = Decided;

    async fn apply(self, tx: &mut Tx<'_>, tenant: &str) -> Result<Decided> {
        let mut row = tx.load_live(tenant, &self.session_id).await?;
        tx.decide(&mut row, self.decision).await
    }
}

impl Write for ExpireApprovals {
    type Reply = ();

    async fn apply(self, tx: &mut Tx<'_>, tenant: &str) -> Result<()> {
        let mut row = tx.load_live(tenant, &self.session_id).await?;
        tx.expire_due(&mut row).await
    }
}
