//! Request bodies for the providers' APIs (ExportTranscript's
//! `TRANSCRIPT_FORMAT_ANTHROPIC_MESSAGES`, `_OPENAI_RESPONSES`,
//! `_GEMINI_CONTENTS`): a JSON object written piece by piece, so any
//! history renders in bounded memory. The messages given are what an
//! export for a target sends (`domain::target`); rendering changes
//! nothing else about them.

use super::{Error, Message, Result};

/// Which API's request body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body {
    /// Anthropic Messages: `system`, `messages`.
    AnthropicMessages,
    /// OpenAI Responses: `instructions`, `input`.
    OpenAiResponses,
    /// Gemini: `systemInstruction`, `contents`.
    GeminiContents,
}

impl Body {
    /// The provider whose rules apply without a target.
    pub fn provider(self) -> &'static str {
        match self {
            Body::AnthropicMessages => "anthropic",
            Body::OpenAiResponses => "openai",
            Body::GeminiContents => "google",
        }
    }
}

/// Writes one body: [`BodyWriter::opening`], then each message's text
/// ([`BodyWriter::message`]), then [`BodyWriter::closing`]; the pieces
/// concatenated are the JSON object.
pub struct BodyWriter {
    body: Body,
    system_prompt: String,
}

impl BodyWriter {
    pub fn new(body: Body, system_prompt: &str) -> Self {
        BodyWriter {
            body,
            system_prompt: system_prompt.to_owned(),
        }
    }

    /// The text before the first message.
    pub fn opening(&mut self) -> Result<String> {
        Err(self.unsupported())
    }

    /// The text for one message (possibly empty: a writer may hold a turn
    /// back to join it with the next).
    pub fn message(&mut self, _message: &Message) -> Result<String> {
        Err(self.unsupported())
    }

    /// The text after the last message.
    pub fn closing(&mut self) -> Result<String> {
        Err(self.unsupported())
    }

    fn unsupported(&self) -> Error {
        let _ = &self.system_prompt;
        Error::invalid("format", format!("{:?} is not rendered yet", self.body))
    }
}
