//! ExportTranscript: renders a session page by page (see
//! [`domain::transcript`](crate::domain::transcript)) and streams the text
//! in bounded chunks, so any size exports in bounded memory.

use futures_core::Stream;
use sessionstore_client::v1 as pb;

use futures_util::StreamExt as _;

use super::Messages;
use crate::domain::bodies::{Body, BodyWriter};
use crate::domain::transcript::{
    markdown_header, markdown_message, openai_messages, openai_system,
};
use crate::domain::{Error, Result, Session};

/// Transcript bytes per streamed chunk (a single larger message travels alone).
const CHUNK_BYTES: usize = 64 * 1024;

/// What to render.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Markdown,
    OpenAiJson,
    /// A provider API's request body.
    Body(Body),
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

/// Streams the transcript of `messages` (the session's, as the export
/// reads them: up to its length when it began, and for a target what the
/// target's rules leave).
pub fn stream(
    mut messages: Messages,
    session: Session,
    format: Format,
) -> impl Stream<Item = Result<pb::ExportTranscriptResponse>> + Send + 'static {
    async_stream::try_stream! {
        let mut out = Chunker::default();
        // JSON objects written so far (for the commas between them).
        let mut written = 0_usize;
        let mut body = match format {
            Format::Body(body) => Some(BodyWriter::new(body, &session.system_prompt)),
            _ => None,
        };
        let opening = match (format, &mut body) {
            (_, Some(body)) => body.opening()?,
            (Format::Markdown, _) => markdown_header(&session),
            (_, None) if session.system_prompt.is_empty() => "[".to_owned(),
            (_, None) => {
                written += 1;
                let prompt = json(&openai_system(&session.system_prompt))?;
                format!("[\n{prompt}")
            }
        };
        if let Some(chunk) = out.push(&opening) {
            yield chunk;
        }
        while let Some(stored) = messages.next().await {
            let stored = stored?;
            let text = match (format, &mut body) {
                (_, Some(body)) => body.message(&stored.message)?,
                (Format::Markdown, _) => markdown_message(&stored.message, stored.redacted),
                (_, None) => {
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
        match (format, &mut body) {
            (_, Some(body)) => {
                out.push(&body.closing()?);
            }
            (Format::OpenAiJson, _) => {
                out.push("\n]\n");
            }
            _ => {}
        }
        if !out.buffer.is_empty() {
            yield out.take();
        }
    }
}
