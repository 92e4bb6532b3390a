//! The answers idempotency keys keep (see
//! [`KeptReply`](crate::domain::control::KeptReply)): a tag byte naming the
//! answer's kind, then its response message's protobuf encoding.

use super::event::stored_messages_from_pb;
use super::{pb, stored_message_to_pb};
use crate::domain::control::{KeptReply, RolledBack};
use crate::domain::{Error, Result};

/// The tag of a kept RollbackSession answer.
const ROLLED_BACK: u8 = 1;

pub fn encode_kept(reply: &KeptReply) -> Vec<u8> {
    let KeptReply::RolledBack(rolled) = reply;
    let response = pb::RollbackSessionResponse {
        revision: rolled.revision,
        next_sequence: rolled.next_sequence,
        removed_messages: rolled
            .removed
            .iter()
            .cloned()
            .map(stored_message_to_pb)
            .collect(),
    };
    let mut encoded = vec![ROLLED_BACK];
    prost::Message::encode(&response, &mut encoded).unwrap_or_default();
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
        _ => Err(Error::storage(std::io::Error::other(
            "a kept answer of an unknown kind",
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Message, Role, StoredMessage, Timestamp};

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
        assert!(decode_kept(&[9, 1, 2]).is_err());
        assert!(decode_kept(&[]).is_err());
        Ok(())
    }
}
