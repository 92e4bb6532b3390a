//! ExportTranscript: renders a session page by page (see
//! [`domain::transcript`](crate::domain::transcript)) and streams the text
//! in bounded chunks, so any size exports in bounded memory.

use futures_core::Stream;
use sessionstore_client::v1 as pb;

use super::{message_pages, sequence_of};
use crate::domain::transcript::{
    markdown_header, markdown_message, openai_messages, openai_system,
};
use crate::domain::{Error, Result, Session};
use crate::read_ahead::{ReadAhead, Share};
use crate::store::{SessionHandle, Store};

/// Transcript bytes per streamed chunk (a single larger message travels alone).
const CHUNK_BYTES: usize = 64 * 1024;

/// What to render.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Markdown,
    OpenAiJson,
}

/// Collects rendered text and hands out full chunks.
#[derive(Default)]
struct Chunker {
    buffer: String,
}

impl Chunker {
    fn push(&mut self, text: &str) -> Option<pb::ExportTranscriptResponse> {
        self.buffer.push_str(text);
        (self.buffer.len() >= CHUNK_BYTES).then(|| self.take())
    }

    fn take(&mut self) -> pb::ExportTranscriptResponse {
        pb::ExportTranscriptResponse {
            data: std::mem::take(&mut self.buffer).into_bytes(),
        }
    }
}

fn json(value: &serde_json::Value) -> Result<String> {
    serde_json::to_string(value).map_err(Error::storage)
}

/// Streams the transcript of the session's messages as they are when the
/// export starts (up to its current length).
pub fn stream<S: Store>(
    store: S,
    handle: SessionHandle,
    session: Session,
    format: Format,
    share: Share,
) -> impl Stream<Item = Result<pb::ExportTranscriptResponse>> + Send + 'static {
    async_stream::try_stream! {
        let end = handle.next_sequence;
        let mut out = Chunker::default();
        // JSON objects written so far (for the commas between them).
        let mut written = 0_usize;
        let opening = match format {
            Format::Markdown => markdown_header(&session),
            Format::OpenAiJson if session.system_prompt.is_empty() => "[".to_owned(),
            Format::OpenAiJson => {
                written += 1;
                let prompt = json(&openai_system(&session.system_prompt))?;
                format!("[\n{prompt}")
            }
        };
        if let Some(chunk) = out.push(&opening) {
            yield chunk;
        }
        // Read ahead within the stream's byte bounds (`read_ahead`).
        let mut messages = ReadAhead::ranges(message_pages(store, handle), sequence_of, share, -1, end);
        while let Some(stored) = messages.next().await? {
            let text = match format {
                Format::Markdown => markdown_message(&stored.message, stored.redacted),
                Format::OpenAiJson => {
                    let mut text = String::new();
                    for object in openai_messages(&stored.message, stored.redacted) {
                        text.push_str(if written == 0 { "\n" } else { ",\n" });
                        text.push_str(&json(&object)?);
                        written += 1;
                    }
                    text
                }
            };
            if let Some(chunk) = out.push(&text) {
                yield chunk;
            }
        }
        if format == Format::OpenAiJson {
            out.push("\n]\n");
        }
        if !out.buffer.is_empty() {
            yield out.take();
        }
    }
}
