//! Tool approvals: a decision asked for before a tool call of the history
//! runs, made once whichever client or replica makes it. The requests, the
//! approval itself and the rules that need no stored state; storage
//! applies them (`store/ops/approvals.rs`).

use serde::{Deserialize, Serialize};

use super::fields::{MAX_KEY_LEN, check_len};
use super::{Error, Result, StoredMessage, Timestamp};

/// The longest `title`.
pub const MAX_TITLE_BYTES: usize = 1024;
/// The longest `detail_json` and `reason`.
pub const MAX_DETAIL_BYTES: usize = 64 * 1024;

/// Where an approval stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalState {
    Pending,
    Approved,
    Denied,
    Expired,
}

impl ApprovalState {
    /// The number the database keeps (the protocol's enum value).
    pub fn code(self) -> i64 {
        match self {
            ApprovalState::Pending => 1,
            ApprovalState::Approved => 2,
            ApprovalState::Denied => 3,
            ApprovalState::Expired => 4,
        }
    }

    pub fn from_code(code: i64) -> Option<ApprovalState> {
        match code {
            1 => Some(ApprovalState::Pending),
            2 => Some(ApprovalState::Approved),
            3 => Some(ApprovalState::Denied),
            4 => Some(ApprovalState::Expired),
            _ => None,
        }
    }

    /// The protocol's enum name, as error metadata gives it.
    pub fn enum_name(self) -> &'static str {
        match self {
            ApprovalState::Pending => "APPROVAL_STATE_PENDING",
            ApprovalState::Approved => "APPROVAL_STATE_APPROVED",
            ApprovalState::Denied => "APPROVAL_STATE_DENIED",
            ApprovalState::Expired => "APPROVAL_STATE_EXPIRED",
        }
    }
}

/// An approval as stored and answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    pub approval_id: String,
    pub session_id: String,
    pub run_id: String,
    pub tool_call_id: String,
    pub title: String,
    pub detail_json: String,
    pub state: ApprovalState,
    pub decided_by: String,
    pub reason: String,
    pub create_time: Timestamp,
    /// 0 while pending.
    pub decide_time: Timestamp,
    /// 0: never.
    pub expire_time: Timestamp,
}

impl Approval {
    /// Whether it is pending with its expiry reached at `now`.
    pub fn is_due(&self, now: Timestamp) -> bool {
        self.state == ApprovalState::Pending && self.expire_time.0 > 0 && self.expire_time <= now
    }
}

/// RequestApproval's fields.
#[derive(Clone, Debug)]
pub struct RequestApproval {
    pub run_id: String,
    pub tool_call_id: String,
    pub title: String,
    pub detail_json: String,
    /// 0: never.
    pub expire_time: Timestamp,
}

impl RequestApproval {
    /// The rules that need no stored state; `now` for the expiry.
    pub fn validate(&self, now: Timestamp) -> Result<()> {
        check_len("tool_call_id", &self.tool_call_id, MAX_KEY_LEN, true)?;
        check_len("run_id", &self.run_id, MAX_KEY_LEN, false)?;
        over("title", &self.title, MAX_TITLE_BYTES)?;
        over("detail_json", &self.detail_json, MAX_DETAIL_BYTES)?;
        if self.expire_time.0 != 0 && self.expire_time <= now {
            return Err(Error::invalid("expire_time", "must be in the future"));
        }
        Ok(())
    }
}

/// A decision: approve or deny.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Decision {
    Approve,
    Deny,
}

/// DecideApproval's fields.
#[derive(Clone, Debug, Serialize)]
pub struct DecideApproval {
    pub approval_id: String,
    pub decision: Decision,
    pub reason: String,
    pub decided_by: String,
    /// Idempotency key (empty: none).
    #[serde(skip)]
    pub request_id: String,
}

impl DecideApproval {
    pub fn validate(&self) -> Result<()> {
        require_approval_id(&self.approval_id)?;
        over("reason", &self.reason, MAX_DETAIL_BYTES)?;
        check_len("decided_by", &self.decided_by, MAX_KEY_LEN, false)?;
        check_len("request_id", &self.request_id, MAX_KEY_LEN, false)
    }

    /// Whether `approval` is what this decision, sent before with the same
    /// request id, recorded: same decision, reason and decider.
    pub fn recorded_in(&self, approval: &Approval) -> bool {
        let state = match self.decision {
            Decision::Approve => ApprovalState::Approved,
            Decision::Deny => ApprovalState::Denied,
        };
        approval.state == state
            && approval.reason == self.reason
            && approval.decided_by == self.decided_by
    }
}

/// A decision recorded: the approval as decided, its revision, and a
/// denial's tool result (if one was appended).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decided {
    pub approval: Approval,
    pub revision: i64,
    pub tool_result: Option<StoredMessage>,
}

/// ListApprovals: the tenant's approvals with each filter that is set,
/// oldest first (`create_time`, then `approval_id`), after `after`.
#[derive(Clone, Debug, Default)]
pub struct ApprovalQuery {
    pub session_id: Option<String>,
    pub user: Option<String>,
    pub state: Option<ApprovalState>,
    pub after: Option<(Timestamp, String)>,
    pub limit: usize,
}

/// Checks an approval id naming an existing one.
pub fn require_approval_id(id: &str) -> Result<()> {
    check_len("approval_id", id, MAX_KEY_LEN, true)
}

/// A text field over its byte limit: `LIMIT_EXCEEDED` naming it.
fn over(field: &str, value: &str, max: usize) -> Result<()> {
    if value.len() > max {
        return Err(Error::LimitExceeded {
            field: field.into(),
            limit: if max == MAX_TITLE_BYTES {
                "max_title_bytes"
            } else {
                "max_detail_bytes"
            },
            description: format!("is {} bytes; at most {max}", value.len()),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_keep_their_codes() {
        for state in [
            ApprovalState::Pending,
            ApprovalState::Approved,
            ApprovalState::Denied,
            ApprovalState::Expired,
        ] {
            assert_eq!(ApprovalState::from_code(state.code()), Some(state));
            assert!(state.enum_name().starts_with("APPROVAL_STATE_"));
        }
        assert_eq!(ApprovalState::from_code(0), None);
    }

    #[test]
    fn a_request_is_checked_field_by_field() {
        let now = Timestamp(1_000);
        let ok = RequestApproval {
            run_id: String::new(),
            tool_call_id: "call_1".into(),
            title: "t".into(),
            detail_json: "{}".into(),
            expire_time: Timestamp(0),
        };
        assert!(ok.validate(now).is_ok());
        let past = RequestApproval {
            expire_time: now,
            ..ok.clone()
        };
        assert!(
            matches!(past.validate(now), Err(Error::InvalidArgument { field, .. }) if field == "expire_time")
        );
        let long = RequestApproval {
            title: "x".repeat(MAX_TITLE_BYTES + 1),
            ..ok
        };
        assert!(
            matches!(long.validate(now), Err(Error::LimitExceeded { field, .. }) if field == "title")
        );
    }
}
