//! ExportHistory's chunks, written from the messages' encodings.
//!
//! An `ExportHistoryResponse` is a list of `Message`s, and a message is
//! stored as its encoding (`rows::MessageRow::into_encoded`), so a chunk
//! is written as the protobuf encoding of that list would be: for each
//! message its field's key, its length and the stored bytes, behind the
//! chunk's gRPC prefix. Nothing is decoded and encoded again on the way
//! out; the client decodes exactly what it would have been sent before.

use std::pin::Pin;

use bytes::{BufMut as _, Bytes, BytesMut};
use futures_core::Stream;
use futures_util::StreamExt as _;
use prost::Message as _;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
use sessionstore_client::v1 as pb;
use tonic::Status;

use super::EXPORT_CHUNK_BYTES;
use crate::domain::{Message, Result};
use crate::wire;

/// Messages' encodings (`sessionstore.v1.Message`), in the order they are
/// sent.
pub(super) type Encodings = Pin<Box<dyn Stream<Item = Result<Bytes>> + Send + 'static>>;

/// `ExportHistoryResponse.messages`.
const MESSAGES_FIELD: u32 = 1;

/// Bytes before a chunk's encoding: not compressed, then its length.
const PREFIX: usize = 5;

/// Streams `encodings` (after `prompt`, if any) packed into framed
/// `ExportHistoryResponse` messages of at most [`EXPORT_CHUNK_BYTES`] (a
/// single larger message travels alone). A message counts its encoding
/// and 8 bytes, as the chunks counted before they were written here.
pub(super) fn chunks(
    mut encodings: Encodings,
    prompt: Option<Message>,
) -> impl Stream<Item = Result<Bytes>> + Send + 'static {
    async_stream::try_stream! {
        let mut chunk = Chunk::new();
        if let Some(prompt) = prompt {
            chunk.push(&wire::message_to_pb(prompt).encode_to_vec());
        }
        while let Some(encoding) = encodings.next().await {
            let encoding = encoding?;
            if chunk.counted > 0 && chunk.counted + counted(&encoding) > EXPORT_CHUNK_BYTES {
                yield chunk.finish();
            }
            chunk.push(&encoding);
        }
        if chunk.counted > 0 {
            yield chunk.finish();
        }
    }
}

/// A framed chunk's `ExportHistoryResponse`, for the generated service's
/// `export_history`.
pub(super) fn decode(framed: &[u8]) -> std::result::Result<pb::ExportHistoryResponse, Status> {
    let encoding = framed.get(PREFIX..).unwrap_or_default();
    pb::ExportHistoryResponse::decode(encoding)
        .map_err(|error| Status::internal(format!("an export chunk did not decode: {error}")))
}

/// What a message counts against [`EXPORT_CHUNK_BYTES`].
fn counted(encoding: &[u8]) -> usize {
    encoding.len() + 8
}

/// A chunk being written: the prefix (its length written last), then each
/// message as a field of `ExportHistoryResponse`.
struct Chunk {
    buf: BytesMut,
    /// What the messages in it count ([`counted`]).
    counted: usize,
}

impl Chunk {
    fn new() -> Self {
        let mut buf = BytesMut::new();
        buf.put_bytes(0, PREFIX);
        Chunk { buf, counted: 0 }
    }

    fn push(&mut self, encoding: &[u8]) {
        let len = encoding.len();
        let field = key_len(MESSAGES_FIELD) + encoded_len_varint(len as u64) + len;
        // A chunk's first message makes room for the whole chunk, so it is
        // written without growing (and copying) the buffer as it fills.
        let room = if self.counted == 0 {
            field.max(EXPORT_CHUNK_BYTES)
        } else {
            field
        };
        self.buf.reserve(room);
        encode_key(MESSAGES_FIELD, WireType::LengthDelimited, &mut self.buf);
        encode_varint(len as u64, &mut self.buf);
        self.buf.put_slice(encoding);
        self.counted += counted(encoding);
    }

    /// The chunk as one gRPC message; the next starts empty.
    fn finish(&mut self) -> Bytes {
        let mut done = std::mem::replace(self, Chunk::new()).buf;
        // A chunk is bounded by EXPORT_CHUNK_BYTES or one stored message,
        // far below 4 GiB.
        let len = u32::try_from(done.len() - PREFIX).unwrap_or(u32::MAX);
        done[1..PREFIX].copy_from_slice(&len.to_be_bytes());
        done.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Role;

    fn message(text: &str) -> pb::Message {
        wire::message_to_pb(Message::text(Role::User, text.to_owned()))
    }

    fn encodings(messages: &[pb::Message]) -> Encodings {
        let items: Vec<Result<Bytes>> = messages
            .iter()
            .map(|message| Ok(Bytes::from(message.encode_to_vec())))
            .collect();
        Box::pin(futures_util::stream::iter(items))
    }

    async fn sent(encodings: Encodings, prompt: Option<Message>) -> Vec<Bytes> {
        chunks(encodings, prompt)
            .map(|chunk| chunk.map_err(|error| error.to_string()))
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<std::result::Result<_, _>>()
            .unwrap_or_else(|error| panic!("a chunk failed: {error}"))
    }

    #[tokio::test]
    async fn a_chunk_is_what_prost_would_have_encoded() {
        let messages = vec![message("one"), message(""), message("ünï ✓ three")];
        let prompt = Message::text(Role::System, "be brief".to_owned());
        let chunks = sent(encodings(&messages), Some(prompt.clone())).await;
        assert_eq!(chunks.len(), 1);
        let mut expected = pb::ExportHistoryResponse {
            messages: vec![wire::message_to_pb(prompt)],
        };
        expected.messages.extend(messages);
        let encoding = expected.encode_to_vec();
        let chunk = &chunks[0];
        assert_eq!(chunk[0], 0, "not compressed");
        assert_eq!(
            u32::from_be_bytes([chunk[1], chunk[2], chunk[3], chunk[4]]) as usize,
            encoding.len()
        );
        assert_eq!(&chunk[PREFIX..], &encoding[..]);
        assert_eq!(decode(chunk).ok(), Some(expected));
    }

    #[tokio::test]
    async fn chunks_stay_within_their_bound_and_a_large_message_goes_alone() {
        let small = message(&"x".repeat(300 * 1024));
        let large = message(&"y".repeat(EXPORT_CHUNK_BYTES + 1));
        let messages = vec![
            small.clone(),
            small.clone(),
            small.clone(),
            small.clone(),
            large.clone(),
            small.clone(),
        ];
        let chunks = sent(encodings(&messages), None).await;
        let decoded: Vec<Vec<pb::Message>> = chunks
            .iter()
            .map(|chunk| decode(chunk).map(|chunk| chunk.messages))
            .collect::<std::result::Result<_, _>>()
            .unwrap_or_else(|status| panic!("{status:?}"));
        let counts: Vec<usize> = decoded.iter().map(Vec::len).collect();
        assert_eq!(counts, [3, 1, 1, 1]);
        assert_eq!(decoded.concat(), messages);
        for chunk in &chunks[..2] {
            assert!(chunk.len() <= EXPORT_CHUNK_BYTES + PREFIX);
        }
    }

    #[tokio::test]
    async fn nothing_to_send_sends_no_chunk() {
        assert!(sent(encodings(&[]), None).await.is_empty());
    }
}
