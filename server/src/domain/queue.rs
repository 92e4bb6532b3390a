//! Queued input: messages a user sends while the session is busy (a run
//! holds its lease, or its queue holds a waiting input), kept in the
//! session's queue until the lease holder takes them into the history.
//! The requests and the rules that need no stored state; storage applies
//! them (`store/ops/queue.rs`).

use serde::{Deserialize, Serialize};

use super::digest::RequestKey;
use super::fields::{MAX_KEY_LEN, check_len};
use super::{Error, Message, Result, StoredMessage, Timestamp};

/// The most messages one input holds.
pub const MAX_INPUT_MESSAGES: usize = 100;
/// The most inputs a session's queue holds waiting.
pub const MAX_WAITING_INPUTS: i64 = 100;

/// What SubmitInput does while the session is busy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputMode {
    /// Queue it at the back.
    Queue,
    /// Queue it, and cancel the run holding the lease.
    Interrupt,
    /// Refuse it.
    Reject,
}

impl InputMode {
    /// The protocol's enum value.
    pub fn code(self) -> i32 {
        match self {
            InputMode::Queue => 1,
            InputMode::Interrupt => 2,
            InputMode::Reject => 3,
        }
    }

    /// The mode of a protocol value; UNSPECIFIED (0) is QUEUE.
    pub fn from_code(code: i32) -> Option<InputMode> {
        match code {
            0 | 1 => Some(InputMode::Queue),
            2 => Some(InputMode::Interrupt),
            3 => Some(InputMode::Reject),
            _ => None,
        }
    }
}

/// An input in a session's queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuedInput {
    pub input_id: String,
    pub session_id: String,
    /// Its place in the session's submission order, from 1, never reused.
    pub position: i64,
    pub messages: Vec<Message>,
    pub mode: InputMode,
    pub create_time: Timestamp,
}

/// SubmitInput's fields.
#[derive(Clone, Debug, Serialize)]
pub struct SubmitInput {
    pub messages: Vec<Message>,
    pub mode: InputMode,
    /// Idempotency key (empty: none), per tenant and session. Not part of
    /// the fingerprint.
    #[serde(skip)]
    pub request_id: String,
}

impl SubmitInput {
    pub fn validate(&self) -> Result<()> {
        if self.messages.is_empty() {
            return Err(Error::invalid("messages", "is required: 1 to 100 messages"));
        }
        if self.messages.len() > MAX_INPUT_MESSAGES {
            return Err(Error::LimitExceeded {
                field: "messages".into(),
                limit: "max_input_messages",
                description: format!(
                    "holds {} messages; an input holds at most {MAX_INPUT_MESSAGES}",
                    self.messages.len()
                ),
            });
        }
        check_len("request_id", &self.request_id, MAX_KEY_LEN, false)
    }

    /// Its idempotency key in `session_id`: keys of SubmitInput are per
    /// tenant and session, so the session's id is part of the key.
    pub fn request_key(&self, session_id: &str) -> Option<RequestKey> {
        RequestKey::of("SubmitInput", &self.request_id, self)
            .map(|key| key.within(&format!("input\u{1f}{session_id}")))
    }
}

/// SubmitInput's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submitted {
    /// The session was busy: the input was queued.
    pub queued: bool,
    pub input: Option<QueuedInput>,
    /// The stored messages, when appended at once.
    pub messages: Vec<StoredMessage>,
    /// The last revision the call wrote.
    pub revision: i64,
}

/// A queued input moved into the history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taken {
    pub input: QueuedInput,
    pub messages: Vec<StoredMessage>,
    pub revision: i64,
    pub next_sequence: i64,
}

/// Checks an input id naming an existing one.
pub fn require_input_id(id: &str) -> Result<()> {
    check_len("input_id", id, MAX_KEY_LEN, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Role;

    #[test]
    fn an_input_holds_one_to_a_hundred_messages() {
        let input = |n: usize| SubmitInput {
            messages: vec![Message::text(Role::User, "hi"); n],
            mode: InputMode::Queue,
            request_id: String::new(),
        };
        assert!(
            matches!(input(0).validate(), Err(Error::InvalidArgument { field, .. }) if field == "messages")
        );
        assert!(input(1).validate().is_ok());
        assert!(input(100).validate().is_ok());
        assert!(
            matches!(input(101).validate(), Err(Error::LimitExceeded { field, .. }) if field == "messages")
        );
    }

    #[test]
    fn keys_are_per_session() {
        let input = SubmitInput {
            messages: vec![Message::text(Role::User, "hi")],
            mode: InputMode::Queue,
            request_id: "r".into(),
        };
        assert_ne!(input.request_key("a"), input.request_key("b"));
        assert_eq!(input.request_key("a"), input.request_key("a"));
        assert_eq!(
            input.request_key("a").map(|key| key.request_id),
            Some("r".to_owned()),
            "errors name the caller's key"
        );
        for code in 0..4 {
            assert!(InputMode::from_code(code).is_some());
        }
        assert_eq!(InputMode::from_code(9), None);
    }
}
