//! What storage keeps of first answers: the answers idempotency keys keep
//! (see [`KeptReply`](crate::domain::control::KeptReply)) — a tag byte
//! naming the answer's kind, then its response message's protobuf
//! encoding — and a decision's tool result (a stored message, encoded).

use super::event::{queued_input_from_pb, stored_messages_from_pb};
use super::{pb, queued_input_to_pb, stored_message_to_pb};
use crate::domain::control::{KeptReply, RolledBack};
use crate::domain::queue::{QueuedInput, Submitted};
use crate::domain::{Error, Result, StoredMessage};

/// The tag of a kept RollbackSession answer.
const ROLLED_BACK: u8 = 1;

/// The tag of a kept SubmitInput answer.
const SUBMITTED: u8 = 2;

pub fn encode_kept(reply: &KeptReply) -> Vec<u8> {
    let (tag, body) = match reply {
        KeptReply::RolledBack(rolled) => (
            ROLLED_BACK,
            prost::Message::encode_to_vec(&pb::RollbackSessionResponse {
                revision: rolled.revision,
                next_sequence: rolled.next_sequence,
                removed_messages: rolled
                    .removed
                    .iter()
                    .cloned()
                    .map(stored_message_to_pb)
                    .collect(),
            }),
        ),
        KeptReply::Submitted(submitted) => (
            SUBMITTED,
            prost::Message::encode_to_vec(&pb::SubmitInputResponse {
                queued: submitted.queued,
                input: submitted.input.clone().map(queued_input_to_pb),
                messages: submitted
                    .messages
                    .iter()
                    .cloned()
                    .map(stored_message_to_pb)
                    .collect(),
                revision: submitted.revision,
            }),
        ),
    };
    let mut encoded = Vec::with_capacity(1 + body.len());
    encoded.push(tag);
    encoded.extend_from_slice(&body);
    encoded
}

pub fn decode_kept(encoded: &[u8]) -> Result<KeptReply> {
    match encoded.split_first() {
        Some((&ROLLED_BACK, body)) => {
            let response = <pb::RollbackSessionResponse as prost::Message>::decode(body)
                .map_err(Error::storage)?;
            Ok(KeptReply::RolledBack(RolledBack {
                revision: response.revision,
                next_sequence: response.next_sequence,
                removed: stored_messages_from_pb(response.removed_messages)?,
            }))
        }
        Some((&SUBMITTED, body)) => {
            let response = <pb::SubmitInputResponse as prost::Message>::decode(body)
                .map_err(Error::storage)?;
            Ok(KeptReply::Submitted(Submitted {
                queued: response.queued,
                input: response.input.map(queued_input_from_pb).transpose()?,
                messages: stored_messages_from_pb(response.messages)?,
                revision: response.revision,
            }))
        }
        _ => Err(Error::storage(std::io::Error::other(
            "a kept answer of an unknown kind",
        ))),
    }
}

/// A queued input, as its row keeps it.
pub fn encode_queued_input(input: &QueuedInput) -> Vec<u8> {
    prost::Message::encode_to_vec(&queued_input_to_pb(input.clone()))
}

pub fn decode_queued_input(encoded: &[u8]) -> Result<QueuedInput> {
    let input = <pb::QueuedInput as prost::Message>::decode(encoded).map_err(Error::storage)?;
    queued_input_from_pb(input)
}

/// A stored message whole (its id, sequence and time too), as a decided
/// approval keeps its denial's tool result.
pub fn encode_stored_message(stored: &StoredMessage) -> Vec<u8> {
    prost::Message::encode_to_vec(&stored_message_to_pb(stored.clone()))
}

pub fn decode_stored_message(encoded: &[u8]) -> Result<StoredMessage> {
    let stored = <pb::StoredMessage as prost::Message>::decode(encoded).map_err(Error::storage)?;
    let mut decoded = stored_messages_from_pb(vec![stored])?;
    decoded
        .pop()
        .ok_or_else(|| Error::storage(std::io::Error::other("an empty stored message")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Message, Role, Timestamp};

    #[test]
    fn a_kept_rollback_decodes_as_it_was() -> Result<()> {
        let kept = KeptReply::RolledBack(RolledBack {
            revision: 7,
            next_sequence: 3,
            removed: vec![StoredMessage {
                id: "msg_1".into(),
                session_id: "ses_1".into(),
                sequence: 3,
                produced_by_call_id: String::new(),
                message: Message::text(Role::Assistant, "popped"),
                create_time: Timestamp(1_700_000_000_000_000),
                redacted: false,
            }],
        });
        assert_eq!(decode_kept(&encode_kept(&kept))?, kept);
        if let KeptReply::RolledBack(rolled) = &kept {
            for stored in &rolled.removed {
                assert_eq!(
                    decode_stored_message(&encode_stored_message(stored))?,
                    *stored
                );
            }
        }
        assert!(decode_kept(&[9, 1, 2]).is_err());
        assert!(decode_kept(&[]).is_err());
        Ok(())
    }
}
