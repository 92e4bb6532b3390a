//! The configured request-shape limits, checked on the wire types before
//! anything is converted or stored. Each refusal is RESOURCE_EXHAUSTED with
//! `ErrorInfo.metadata.limit` naming the flag and a field violation naming
//! the field.

use std::collections::BTreeMap;

use prost::Message as _;
use sessionstore_client::v1 as pb;

use crate::domain::{Error, Result};

/// The limits the service enforces, as configured (`--max-…` flags; each
/// refusal names its flag).
#[derive(Clone, Debug)]
pub struct Limits {
    /// New messages one AppendExchange may carry.
    pub max_messages_per_exchange: usize,
    /// The largest encoded message.
    pub max_message_bytes: usize,
    /// Entries in one metadata map.
    pub max_metadata_entries: usize,
    /// The longest page (a larger `page_size` is served this many).
    pub max_page_size: usize,
    /// What all streams together may hold read ahead of their readers.
    pub max_stream_buffer_bytes: usize,
}

fn exceeded(field: impl Into<String>, limit: &'static str, description: String) -> Error {
    Error::LimitExceeded {
        field: field.into(),
        limit,
        description,
    }
}

/// Checks the messages of one AppendExchange: how many are new
/// (`messages` and `response_messages`; a `full_history` is the whole
/// conversation and is bounded by the request size instead), and each
/// message's size and metadata.
pub fn check_exchange(limits: &Limits, request: &pb::AppendExchangeRequest) -> Result<()> {
    let count = request.messages.len() + request.response_messages.len();
    if count > limits.max_messages_per_exchange {
        return Err(exceeded(
            "messages",
            "max_messages_per_exchange",
            format!(
                "the exchange carries {count} messages (messages and response_messages); the most allowed is {} (--max-messages-per-exchange)",
                limits.max_messages_per_exchange
            ),
        ));
    }
    for (field, messages) in [
        ("messages", &request.messages),
        ("full_history", &request.full_history),
        ("response_messages", &request.response_messages),
    ] {
        check_each(limits, field, messages)?;
    }
    if let Some(new) = &request.create_if_missing {
        check_metadata(limits, "create_if_missing.metadata", &new.metadata)?;
    }
    Ok(())
}

/// Checks a history given whole (CreateSession's `initial_history`, a
/// rehydrated conversation): each message, not their number, which the
/// request size bounds.
pub fn check_history(limits: &Limits, field: &str, messages: &[pb::Message]) -> Result<()> {
    check_each(limits, field, messages)
}

fn check_each(limits: &Limits, field: &str, messages: &[pb::Message]) -> Result<()> {
    for (index, message) in messages.iter().enumerate() {
        check_message(limits, &format!("{field}[{index}]"), message)?;
    }
    Ok(())
}

/// Checks one message's encoded size and its metadata.
pub fn check_message(limits: &Limits, field: &str, message: &pb::Message) -> Result<()> {
    let size = message.encoded_len();
    if size > limits.max_message_bytes {
        return Err(exceeded(
            field,
            "max_message_bytes",
            format!(
                "is {size} bytes encoded; the most allowed is {} (--max-message-bytes)",
                limits.max_message_bytes
            ),
        ));
    }
    check_metadata(limits, &format!("{field}.metadata"), &message.metadata)
}

/// Checks the number of entries in a metadata map.
pub fn check_metadata(
    limits: &Limits,
    field: &str,
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    if metadata.len() > limits.max_metadata_entries {
        return Err(exceeded(
            field,
            "max_metadata_entries",
            format!(
                "has {} entries; the most allowed is {} (--max-metadata-entries)",
                metadata.len(),
                limits.max_metadata_entries
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_messages_per_exchange: 2,
            max_message_bytes: 100,
            max_metadata_entries: 1,
            max_page_size: 1000,
            max_stream_buffer_bytes: 1 << 20,
        }
    }

    fn text(content: &str) -> pb::Message {
        pb::Message {
            role: pb::Role::User.into(),
            content: content.to_owned(),
            ..Default::default()
        }
    }

    fn limit_of(result: Result<()>) -> (String, &'static str) {
        match result {
            Err(Error::LimitExceeded { field, limit, .. }) => (field, limit),
            other => panic!("expected a limit, got {other:?}"),
        }
    }

    #[test]
    fn each_limit_names_itself_and_the_field() {
        let limits = limits();
        let three = pb::AppendExchangeRequest {
            messages: vec![text("a"), text("b"), text("c")],
            ..Default::default()
        };
        assert_eq!(
            limit_of(check_exchange(&limits, &three)),
            ("messages".to_owned(), "max_messages_per_exchange")
        );
        let big = pb::AppendExchangeRequest {
            response_messages: vec![text("ok"), text(&"x".repeat(200))],
            ..Default::default()
        };
        assert_eq!(
            limit_of(check_exchange(&limits, &big)),
            ("response_messages[1]".to_owned(), "max_message_bytes")
        );
        let mut tagged = text("a");
        tagged.metadata.insert("a".into(), "1".into());
        tagged.metadata.insert("b".into(), "2".into());
        assert_eq!(
            limit_of(check_history(&limits, "initial_history", &[tagged])),
            (
                "initial_history[0].metadata".to_owned(),
                "max_metadata_entries"
            )
        );
        let long_history = pb::AppendExchangeRequest {
            full_history: vec![text("a"), text("b"), text("c")],
            ..Default::default()
        };
        assert!(
            check_exchange(&limits, &long_history).is_ok(),
            "full_history is the whole conversation, not what is new"
        );
    }
}
