//! Request bodies for the providers' APIs (ExportTranscript's
//! `TRANSCRIPT_FORMAT_ANTHROPIC_MESSAGES`, `_OPENAI_RESPONSES`,
//! `_GEMINI_CONTENTS`): a JSON object written piece by piece, so any
//! history renders in bounded memory. The messages given are what an
//! export for a target sends (`domain::target`); rendering changes
//! nothing else about them.
//!
//! Each message is taken apart into pieces (`Piece`) in the order the body
//! sends them: when its `content_blocks` hold a text block, the blocks
//! (its `content` repeats them); otherwise its reasoning blocks, then its
//! `content` as one text, then its other blocks; then its `tool_calls`. A
//! tool message (`tool` with a `tool_call_id`) is one result, its output
//! the content (or its text blocks). The results a message carries go
//! first in a user turn and after the rest of an assistant message, and
//! in Anthropic's and Gemini's bodies the results answering an assistant
//! message open the next user turn: the writer keeps that turn open while
//! results follow (so consecutive tool messages make one turn), the only
//! thing it holds back. Gemini's `functionResponse` names the call it
//! answers: the writer keeps the names of the calls not answered yet (ids
//! and names only).
//!
//! Stored JSON (tool inputs and arguments, reasoning items) is never
//! re-encoded: an object is written byte for byte as stored, anything
//! else is wrapped as `{"_raw": "<stored text>"}` where a body needs an
//! object. Strings are JSON-escaped, so U+0000 travels as `\u0000`.

use std::borrow::Cow;
use std::collections::HashMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::ser::{Serialize, SerializeMap as _, SerializeSeq as _, Serializer};
use serde_json::value::RawValue;

use super::target::is_reasoning;
use super::{ContentBlock, Error, Message, Result, Role};

/// The `thoughtSignature` Gemini documents for a function call from
/// history it did not produce (another model's, or one whose signature
/// was not kept).
pub const SKIP_THOUGHT_SIGNATURE: &str = "skip_thought_signature_validator";

/// The key a stored tool input or argument string that is not a JSON
/// object is wrapped under where a body needs an object.
pub const RAW_KEY: &str = "_raw";

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
    /// Elements of the body's array (`messages`, `input`, `contents`)
    /// begun so far.
    written: usize,
    /// A user turn is open (Anthropic, Gemini): begun by tool results, it
    /// takes more results, and the next user message's parts close it.
    open: bool,
    /// Gemini: the name of each call not answered yet, by call id.
    names: HashMap<String, String>,
}

impl BodyWriter {
    pub fn new(body: Body, system_prompt: &str) -> Self {
        BodyWriter {
            body,
            system_prompt: system_prompt.to_owned(),
            written: 0,
            open: false,
            names: HashMap::new(),
        }
    }

    /// The text before the first message.
    pub fn opening(&mut self) -> Result<String> {
        let prompt = self.system_prompt.as_str();
        let mut out = String::from("{");
        let array = match self.body {
            Body::AnthropicMessages => {
                if !prompt.is_empty() {
                    out.push_str(&format!("\"system\":{},", json(&text(prompt))?));
                }
                "messages"
            }
            Body::OpenAiResponses => {
                if !prompt.is_empty() {
                    out.push_str(&format!("\"instructions\":{},", json(&text(prompt))?));
                }
                "input"
            }
            Body::GeminiContents => {
                if !prompt.is_empty() {
                    let instruction = obj([("parts", arr([obj([("text", text(prompt))])]))]);
                    out.push_str(&format!("\"systemInstruction\":{},", json(&instruction)?));
                }
                "contents"
            }
        };
        out.push_str(&format!("\"{array}\":["));
        Ok(out)
    }

    /// The text for one message (possibly empty: a message with nothing
    /// this body can carry is left out).
    pub fn message(&mut self, message: &Message) -> Result<String> {
        let parts = Parts::of(message);
        match self.body {
            Body::OpenAiResponses => self.responses_items(&parts),
            Body::AnthropicMessages | Body::GeminiContents => self.turns(&parts),
        }
    }

    /// The text after the last message.
    pub fn closing(&mut self) -> Result<String> {
        let mut out = self.close_turn();
        out.push_str(if self.written == 0 { "]}\n" } else { "\n]}\n" });
        Ok(out)
    }

    /// The separator before a new element of the body's array.
    fn next_element(&mut self) -> &'static str {
        self.written += 1;
        if self.written == 1 { "\n" } else { ",\n" }
    }

    fn close_turn(&mut self) -> String {
        if std::mem::take(&mut self.open) {
            "]}".to_owned()
        } else {
            String::new()
        }
    }

    /// Anthropic and Gemini: messages of user and assistant (model) turns.
    fn turns(&mut self, parts: &Parts<'_>) -> Result<String> {
        let mut out = String::new();
        if parts.assistant {
            out.push_str(&self.close_turn());
            let others = self.render_all(&parts.others);
            if !others.is_empty() {
                let role = self.assistant_role();
                out.push_str(&self.begin_turn(role));
                out.push_str(&join(&others)?);
                out.push_str("]}");
            }
            let results = self.render_all(&parts.results);
            if !results.is_empty() {
                out.push_str(&self.begin_turn("user"));
                out.push_str(&join(&results)?);
                self.open = true;
            }
            return Ok(out);
        }
        let mut rendered = self.render_all(&parts.results);
        let results = rendered.len();
        rendered.extend(self.render_all(&parts.others));
        if rendered.is_empty() {
            return Ok(out);
        }
        if self.open {
            out.push(',');
        } else {
            out.push_str(&self.begin_turn("user"));
            self.open = true;
        }
        out.push_str(&join(&rendered)?);
        if rendered.len() > results {
            // The user's own parts end the turn.
            out.push_str(&self.close_turn());
        }
        Ok(out)
    }

    fn assistant_role(&self) -> &'static str {
        match self.body {
            Body::GeminiContents => "model",
            _ => "assistant",
        }
    }

    fn begin_turn(&mut self, role: &str) -> String {
        let separator = self.next_element();
        let array = match self.body {
            Body::GeminiContents => "parts",
            _ => "content",
        };
        format!("{separator}{{\"role\":\"{role}\",\"{array}\":[")
    }

    /// The pieces as this body's content blocks or parts, leaving out
    /// what it has no part for.
    fn render_all<'a>(&mut self, pieces: &[Piece<'a>]) -> Vec<J<'a>> {
        pieces
            .iter()
            .filter_map(|piece| match self.body {
                Body::AnthropicMessages => anthropic_block(piece),
                Body::GeminiContents => self.gemini_part(piece),
                Body::OpenAiResponses => None,
            })
            .collect()
    }

    fn gemini_part<'a>(&mut self, piece: &Piece<'a>) -> Option<J<'a>> {
        match piece {
            Piece::Text { text: t, signature } => {
                if t.is_empty() && signature.is_empty() {
                    return None;
                }
                let mut part = vec![("text", text(t))];
                if !signature.is_empty() {
                    part.push(("thoughtSignature", text(signature)));
                }
                Some(J::Obj(part))
            }
            Piece::Image {
                media_type,
                url,
                data,
            } => {
                if !url.is_empty() {
                    let mut file = Vec::new();
                    if !media_type.is_empty() {
                        file.push(("mimeType", text(media_type)));
                    }
                    file.push(("fileUri", text(url)));
                    Some(obj([("fileData", J::Obj(file))]))
                } else if data.is_empty() {
                    None
                } else {
                    let inline = obj([
                        ("mimeType", text(media_type)),
                        ("data", J::Str(Cow::Owned(STANDARD.encode(data)))),
                    ]);
                    Some(obj([("inlineData", inline)]))
                }
            }
            Piece::Call {
                id,
                name,
                arguments,
                signature,
            } => {
                if !id.is_empty() {
                    self.names.insert((*id).to_owned(), (*name).to_owned());
                }
                let mut call = Vec::new();
                if !id.is_empty() {
                    call.push(("id", text(id)));
                }
                call.push(("name", text(name)));
                call.push(("args", object_or_raw(arguments)));
                let signature = if signature.is_empty() {
                    SKIP_THOUGHT_SIGNATURE
                } else {
                    signature
                };
                Some(obj([
                    ("functionCall", J::Obj(call)),
                    ("thoughtSignature", text(signature)),
                ]))
            }
            Piece::Result {
                id,
                output,
                error,
                name,
            } => {
                let name = self
                    .names
                    .remove(*id)
                    .map_or_else(|| Cow::Borrowed(*name), Cow::Owned);
                let key = if *error { "error" } else { "output" };
                let mut response = Vec::new();
                if !id.is_empty() {
                    response.push(("id", text(id)));
                }
                response.push(("name", J::Str(name)));
                response.push(("response", obj([(key, J::Str(output.clone()))])));
                Some(obj([("functionResponse", J::Obj(response))]))
            }
            Piece::Thinking { .. } | Piece::RedactedThinking { .. } | Piece::Reasoning { .. } => {
                None
            }
        }
    }

    /// OpenAI Responses: a message's input items.
    fn responses_items(&mut self, parts: &Parts<'_>) -> Result<String> {
        let role = parts.role;
        let mut items = Vec::new();
        let results = parts.results.iter().filter_map(responses_output);
        if !parts.assistant {
            items.extend(results);
        }
        // Consecutive text and image parts of a user, system or developer
        // message make one message item.
        let mut content: Vec<J<'_>> = Vec::new();
        fn flush<'a>(role: Role, content: &mut Vec<J<'a>>, items: &mut Vec<J<'a>>) {
            if !content.is_empty() {
                items.push(obj([
                    ("type", text("message")),
                    ("role", text(role_name(role))),
                    ("content", J::Arr(std::mem::take(content))),
                ]));
            }
        }
        for piece in &parts.others {
            match piece {
                Piece::Text { text: "", .. } => {}
                Piece::Text { text: t, .. } if parts.assistant => items.push(obj([
                    ("type", text("message")),
                    ("role", text("assistant")),
                    ("content", text(t)),
                ])),
                Piece::Text { text: t, .. } => {
                    content.push(obj([("type", text("input_text")), ("text", text(t))]));
                }
                // The Responses API takes no image from the assistant.
                Piece::Image { .. } if parts.assistant => {}
                Piece::Image {
                    media_type,
                    url,
                    data,
                } => {
                    if url.is_empty() && data.is_empty() {
                        continue;
                    }
                    let url = if url.is_empty() {
                        Cow::Owned(data_url(media_type, data))
                    } else {
                        Cow::Borrowed(*url)
                    };
                    content.push(obj([
                        ("type", text("input_image")),
                        ("image_url", J::Str(url)),
                        ("detail", text("auto")),
                    ]));
                }
                Piece::Reasoning { json } => {
                    if let Some(item) = stored_object(json) {
                        flush(role, &mut content, &mut items);
                        items.push(J::Raw(item));
                    }
                }
                Piece::Call {
                    id,
                    name,
                    arguments,
                    ..
                } => {
                    flush(role, &mut content, &mut items);
                    items.push(obj([
                        ("type", text("function_call")),
                        ("call_id", text(id)),
                        ("name", text(name)),
                        ("arguments", text(arguments)),
                    ]));
                }
                Piece::Thinking { .. } | Piece::RedactedThinking { .. } | Piece::Result { .. } => {}
            }
        }
        flush(role, &mut content, &mut items);
        if parts.assistant {
            items.extend(parts.results.iter().filter_map(responses_output));
        }
        let mut out = String::new();
        for item in &items {
            out.push_str(self.next_element());
            out.push_str(&json(item)?);
        }
        Ok(out)
    }
}

/// One part of a message as a body sends it, before rendering.
#[derive(Debug)]
enum Piece<'a> {
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    RedactedThinking {
        data: &'a str,
    },
    /// An OpenAI reasoning item (a JSON block of type `reasoning`).
    Reasoning {
        json: &'a str,
    },
    Text {
        text: &'a str,
        signature: &'a str,
    },
    Image {
        media_type: &'a str,
        url: &'a str,
        data: &'a [u8],
    },
    Call {
        id: &'a str,
        name: &'a str,
        arguments: &'a str,
        signature: &'a str,
    },
    Result {
        id: &'a str,
        output: Cow<'a, str>,
        error: bool,
        /// The tool's name as the message gives it (Gemini names a result
        /// by its call; this is for a call it has not seen).
        name: &'a str,
    },
}

/// A message taken apart: the tool results it carries, and everything
/// else in order.
struct Parts<'a> {
    role: Role,
    assistant: bool,
    results: Vec<Piece<'a>>,
    others: Vec<Piece<'a>>,
}

impl<'a> Parts<'a> {
    fn of(message: &'a Message) -> Self {
        let blocks = &message.content_blocks;
        let has_text = blocks
            .iter()
            .any(|b| matches!(b, ContentBlock::Text { .. }));
        let tool_answer = message.role == Role::Tool && !message.tool_call_id.is_empty();
        let mut results = Vec::new();
        let mut others = Vec::new();
        let mut push = |piece: Piece<'a>| match piece {
            Piece::Result { .. } => results.push(piece),
            piece => others.push(piece),
        };
        if tool_answer {
            // The tool's output: its text blocks when it has them, else its
            // content; its other blocks follow the result.
            let output = if has_text {
                Cow::Owned(
                    blocks
                        .iter()
                        .filter_map(|b| match b {
                            ContentBlock::Text { text, .. } => Some(text.as_str()),
                            _ => None,
                        })
                        .collect::<String>(),
                )
            } else {
                Cow::Borrowed(message.content.as_str())
            };
            push(Piece::Result {
                id: &message.tool_call_id,
                output,
                error: message.tool_error,
                name: &message.name,
            });
            blocks
                .iter()
                .filter(|b| !matches!(b, ContentBlock::Text { .. }))
                .filter_map(piece)
                .for_each(&mut push);
        } else if has_text {
            blocks.iter().filter_map(piece).for_each(&mut push);
        } else {
            blocks
                .iter()
                .filter(|b| is_reasoning(b))
                .filter_map(piece)
                .for_each(&mut push);
            if !message.content.is_empty() {
                push(Piece::Text {
                    text: &message.content,
                    signature: "",
                });
            }
            blocks
                .iter()
                .filter(|b| !is_reasoning(b))
                .filter_map(piece)
                .for_each(&mut push);
        }
        for call in &message.tool_calls {
            push(Piece::Call {
                id: &call.id,
                name: &call.name,
                arguments: &call.arguments,
                signature: &call.signature,
            });
        }
        Parts {
            role: message.role,
            assistant: message.role == Role::Assistant,
            results,
            others,
        }
    }
}

/// A block as a piece; JSON blocks other than reasoning items have no
/// part in any of these bodies.
fn piece(block: &ContentBlock) -> Option<Piece<'_>> {
    Some(match block {
        ContentBlock::Text { text, signature } => Piece::Text { text, signature },
        ContentBlock::Thinking {
            thinking,
            signature,
        } => Piece::Thinking {
            thinking,
            signature,
        },
        ContentBlock::RedactedThinking { data } => Piece::RedactedThinking { data },
        ContentBlock::Image {
            media_type,
            url,
            data,
        } => Piece::Image {
            media_type,
            url,
            data,
        },
        ContentBlock::ToolUse {
            id,
            name,
            input,
            signature,
        } => Piece::Call {
            id,
            name,
            arguments: input,
            signature,
        },
        ContentBlock::ToolResult {
            tool_use_id,
            content,
            is_error,
        } => Piece::Result {
            id: tool_use_id,
            output: Cow::Borrowed(content),
            error: *is_error,
            name: "",
        },
        ContentBlock::Json { kind, json } if kind == "reasoning" => Piece::Reasoning { json },
        ContentBlock::Json { .. } => return None,
    })
}

/// A piece as an Anthropic content block.
fn anthropic_block<'a>(piece: &Piece<'a>) -> Option<J<'a>> {
    Some(match piece {
        Piece::Thinking {
            thinking,
            signature,
        } => obj([
            ("type", text("thinking")),
            ("thinking", text(thinking)),
            ("signature", text(signature)),
        ]),
        Piece::RedactedThinking { data } => {
            obj([("type", text("redacted_thinking")), ("data", text(data))])
        }
        // The API takes no empty text block, and has no part for a text's
        // signature (Gemini's).
        Piece::Text { text: "", .. } => return None,
        Piece::Text { text: t, .. } => obj([("type", text("text")), ("text", text(t))]),
        Piece::Image {
            media_type,
            url,
            data,
        } => {
            let source = if !url.is_empty() {
                obj([("type", text("url")), ("url", text(url))])
            } else if data.is_empty() {
                return None;
            } else {
                obj([
                    ("type", text("base64")),
                    ("media_type", text(media_type)),
                    ("data", J::Str(Cow::Owned(STANDARD.encode(data)))),
                ])
            };
            obj([("type", text("image")), ("source", source)])
        }
        Piece::Call {
            id,
            name,
            arguments,
            ..
        } => obj([
            ("type", text("tool_use")),
            ("id", text(id)),
            ("name", text(name)),
            ("input", object_or_raw(arguments)),
        ]),
        Piece::Result {
            id, output, error, ..
        } => {
            let mut block = vec![("type", text("tool_result")), ("tool_use_id", text(id))];
            if !output.is_empty() {
                block.push(("content", J::Str(output.clone())));
            }
            if *error {
                block.push(("is_error", J::True));
            }
            J::Obj(block)
        }
        Piece::Reasoning { .. } => return None,
    })
}

/// A result as a `function_call_output` item.
fn responses_output<'a>(piece: &Piece<'a>) -> Option<J<'a>> {
    match piece {
        Piece::Result { id, output, .. } => Some(obj([
            ("type", text("function_call_output")),
            ("call_id", text(id)),
            ("output", J::Str(output.clone())),
        ])),
        _ => None,
    }
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::Developer => "developer",
        Role::Assistant => "assistant",
        Role::User | Role::Tool => "user",
    }
}

fn data_url(media_type: &str, data: &[u8]) -> String {
    format!("data:{media_type};base64,{}", STANDARD.encode(data))
}

/// Stored JSON text that is one JSON object, as it was stored (without
/// surrounding whitespace). Strictly valid JSON only: what a strict parser
/// would refuse (a lone surrogate escape, a number beyond any float) is not
/// an object here, so a body never carries it.
fn stored_object(stored: &str) -> Option<&RawValue> {
    serde_json::from_str::<&RawValue>(stored)
        .ok()
        .filter(|raw| raw.get().starts_with('{'))
        .filter(|raw| serde_json::from_str::<serde_json::Value>(raw.get()).is_ok())
}

/// A stored input or argument string where a body needs a JSON object:
/// the object as stored, or the text wrapped under [`RAW_KEY`].
fn object_or_raw(stored: &str) -> J<'_> {
    match stored_object(stored) {
        Some(raw) => J::Raw(raw),
        None => obj([(RAW_KEY, text(stored))]),
    }
}

/// A JSON value written in order: object keys as given, stored JSON
/// verbatim.
#[derive(Debug)]
enum J<'a> {
    Str(Cow<'a, str>),
    True,
    Raw(&'a RawValue),
    Obj(Vec<(&'static str, J<'a>)>),
    Arr(Vec<J<'a>>),
}

fn text(s: &str) -> J<'_> {
    J::Str(Cow::Borrowed(s))
}

fn obj<'a, const N: usize>(entries: [(&'static str, J<'a>); N]) -> J<'a> {
    J::Obj(entries.into())
}

fn arr<'a, const N: usize>(items: [J<'a>; N]) -> J<'a> {
    J::Arr(items.into())
}

impl Serialize for J<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            J::Str(text) => s.serialize_str(text),
            J::True => s.serialize_bool(true),
            J::Raw(raw) => raw.serialize(s),
            J::Obj(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (key, value) in entries {
                    map.serialize_entry(key, value)?;
                }
                map.end()
            }
            J::Arr(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
        }
    }
}

fn json(value: &J<'_>) -> Result<String> {
    serde_json::to_string(value).map_err(Error::storage)
}

/// Elements written one after another, comma-separated.
fn join(items: &[J<'_>]) -> Result<String> {
    let mut out = String::new();
    for (index, item) in items.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        out.push_str(&json(item)?);
    }
    Ok(out)
}

// Test code only, never on a request path: each `unwrap` below asserts
// that a rendered body is what the test expects (an object, an array, a
// JSON text), and its panic is the test failing.
#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::domain::ToolCall;

    /// What a test answers: a failure is an error it returns.
    type Fallible<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

    /// The body for `messages`, as text.
    fn render_text(body: Body, prompt: &str, messages: &[Message]) -> Fallible<String> {
        let mut writer = BodyWriter::new(body, prompt);
        let mut out = writer.opening()?;
        for message in messages {
            out.push_str(&writer.message(message)?);
        }
        out.push_str(&writer.closing()?);
        Ok(out)
    }

    /// The body for `messages`, checked to be one JSON object.
    fn render(body: Body, prompt: &str, messages: &[Message]) -> Fallible<Value> {
        let text = render_text(body, prompt, messages)?;
        let value: Value =
            serde_json::from_str(&text).map_err(|e| format!("not JSON ({e}):\n{text}"))?;
        assert!(value.is_object(), "{text}");
        Ok(value)
    }

    /// `value` as an array, or an error naming `what`.
    fn items<'v>(value: &'v Value, what: &str) -> Fallible<&'v Vec<Value>> {
        Ok(value
            .as_array()
            .ok_or_else(|| format!("{what} is no array: {value}"))?)
    }

    /// The body's array: `messages`, `input` or `contents`.
    fn array(body: Body, prompt: &str, messages: &[Message]) -> Fallible<Vec<Value>> {
        let key = match body {
            Body::AnthropicMessages => "messages",
            Body::OpenAiResponses => "input",
            Body::GeminiContents => "contents",
        };
        Ok(items(&render(body, prompt, messages)?[key], key)?.clone())
    }

    const ALL: [Body; 3] = [
        Body::AnthropicMessages,
        Body::OpenAiResponses,
        Body::GeminiContents,
    ];

    fn with_blocks(role: Role, content: &str, blocks: Vec<ContentBlock>) -> Message {
        Message {
            content_blocks: blocks,
            ..Message::text(role, content)
        }
    }

    fn text_block(text: &str, signature: &str) -> ContentBlock {
        ContentBlock::Text {
            text: text.into(),
            signature: signature.into(),
        }
    }

    fn thinking(text: &str, signature: &str) -> ContentBlock {
        ContentBlock::Thinking {
            thinking: text.into(),
            signature: signature.into(),
        }
    }

    fn redacted(data: &str) -> ContentBlock {
        ContentBlock::RedactedThinking { data: data.into() }
    }

    fn reasoning(json: &str) -> ContentBlock {
        ContentBlock::Json {
            kind: "reasoning".into(),
            json: json.into(),
        }
    }

    fn tool_use(id: &str, name: &str, input: &str, signature: &str) -> ContentBlock {
        ContentBlock::ToolUse {
            id: id.into(),
            name: name.into(),
            input: input.into(),
            signature: signature.into(),
        }
    }

    fn tool_result(id: &str, content: &str, is_error: bool) -> ContentBlock {
        ContentBlock::ToolResult {
            tool_use_id: id.into(),
            content: content.into(),
            is_error,
        }
    }

    fn image(media_type: &str, url: &str, data: &[u8]) -> ContentBlock {
        ContentBlock::Image {
            media_type: media_type.into(),
            url: url.into(),
            data: data.to_vec(),
        }
    }

    fn call(id: &str, name: &str, arguments: &str, signature: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
            signature: signature.into(),
        }
    }

    fn calls(content: &str, calls: Vec<ToolCall>) -> Message {
        Message {
            tool_calls: calls,
            ..Message::text(Role::Assistant, content)
        }
    }

    fn tool(id: &str, output: &str, error: bool) -> Message {
        Message {
            tool_call_id: id.into(),
            tool_error: error,
            ..Message::text(Role::Tool, output)
        }
    }

    const REASONING_ITEM: &str = "{\"type\": \"reasoning\", \"id\": \"rs_1\",\n  \"summary\": [], \"encrypted_content\": \"gAAA\"}";

    #[test]
    fn each_body_has_exactly_its_keys_and_the_prompt_only_when_there_is_one() -> Fallible {
        let hi = [Message::text(Role::User, "hi")];
        let keys = |value: Value| -> Vec<String> {
            let mut keys: Vec<String> = value
                .as_object()
                .map(|object| object.keys().cloned().collect())
                .unwrap_or_default();
            keys.sort();
            keys
        };
        let anthropic = render(Body::AnthropicMessages, "Be brief.", &hi)?;
        assert_eq!(keys(anthropic.clone()), ["messages", "system"]);
        assert_eq!(anthropic["system"], "Be brief.");
        assert_eq!(
            keys(render(Body::AnthropicMessages, "", &hi)?),
            ["messages"]
        );

        let responses = render(Body::OpenAiResponses, "Be brief.", &hi)?;
        assert_eq!(keys(responses.clone()), ["input", "instructions"]);
        assert_eq!(responses["instructions"], "Be brief.");
        assert_eq!(keys(render(Body::OpenAiResponses, "", &hi)?), ["input"]);

        let gemini = render(Body::GeminiContents, "Be brief.", &hi)?;
        assert_eq!(keys(gemini.clone()), ["contents", "systemInstruction"]);
        assert_eq!(
            gemini["systemInstruction"],
            json!({ "parts": [{ "text": "Be brief." }] })
        );
        assert_eq!(keys(render(Body::GeminiContents, "", &hi)?), ["contents"]);
        Ok(())
    }

    #[test]
    fn an_empty_history_is_an_empty_array() -> Fallible {
        for body in ALL {
            let text = render_text(body, "", &[])?;
            let value: Value = serde_json::from_str(&text)?;
            assert_eq!(value.as_object().map(|o| o.len()), Some(1), "{text}");
            assert_eq!(array(body, "", &[])?, Vec::<Value>::new());
        }
        Ok(())
    }

    #[test]
    fn anthropic_renders_every_part() -> Fallible {
        let assistant = with_blocks(
            Role::Assistant,
            "",
            vec![
                thinking("hmm", "sig-1"),
                redacted("opaque"),
                text_block("Let me look.", "gemini-sig"),
                tool_use("toolu_1", "search", "{\"q\": \"rust\"}", "gemini-sig"),
            ],
        );
        let user = with_blocks(
            Role::User,
            "Look:",
            vec![
                image("image/png", "", b"png"),
                image("image/jpeg", "https://example.com/a.jpg", &[]),
            ],
        );
        let messages = [user, assistant, tool("toolu_1", "found", false)];
        let expected = json!([
            { "role": "user", "content": [
                { "type": "text", "text": "Look:" },
                { "type": "image", "source": {
                    "type": "base64", "media_type": "image/png", "data": "cG5n" } },
                { "type": "image", "source": {
                    "type": "url", "url": "https://example.com/a.jpg" } },
            ] },
            { "role": "assistant", "content": [
                { "type": "thinking", "thinking": "hmm", "signature": "sig-1" },
                { "type": "redacted_thinking", "data": "opaque" },
                { "type": "text", "text": "Let me look." },
                { "type": "tool_use", "id": "toolu_1", "name": "search",
                  "input": { "q": "rust" } },
            ] },
            { "role": "user", "content": [
                { "type": "tool_result", "tool_use_id": "toolu_1", "content": "found" },
            ] },
        ]);
        assert_eq!(
            Value::Array(array(Body::AnthropicMessages, "", &messages)?),
            expected
        );
        Ok(())
    }

    #[test]
    fn anthropic_results_open_the_next_user_message() -> Fallible {
        let messages = [
            Message::text(Role::User, "weather?"),
            calls(
                "",
                vec![
                    call("c1", "weather", "{\"city\":\"Oslo\"}", ""),
                    call("c2", "weather", "{\"city\":\"Rome\"}", ""),
                ],
            ),
            tool("c1", "rain", false),
            tool("c2", "timeout", true),
            Message::text(Role::User, "and tomorrow?"),
            Message::text(Role::User, "please"),
        ];
        let out = array(Body::AnthropicMessages, "", &messages)?;
        assert_eq!(out.len(), 4);
        assert_eq!(out[1]["content"][0]["type"], "tool_use");
        assert_eq!(out[1]["content"][1]["id"], "c2");
        assert_eq!(
            out[2],
            json!({ "role": "user", "content": [
                { "type": "tool_result", "tool_use_id": "c1", "content": "rain" },
                { "type": "tool_result", "tool_use_id": "c2", "content": "timeout",
                  "is_error": true },
                { "type": "text", "text": "and tomorrow?" },
            ] })
        );
        assert_eq!(
            out[3],
            json!({ "role": "user", "content": [{ "type": "text", "text": "please" }] })
        );

        // Results followed by the assistant, or by the end, close on their own.
        let messages = [
            calls("", vec![call("c1", "f", "{}", "")]),
            tool("c1", "", false),
            calls("", vec![call("c2", "f", "{}", "")]),
            tool("c2", "2", false),
        ];
        let out = array(Body::AnthropicMessages, "", &messages)?;
        assert_eq!(out.len(), 4);
        assert_eq!(
            out[1],
            json!({ "role": "user", "content": [
                { "type": "tool_result", "tool_use_id": "c1" },
            ] }),
            "an empty output leaves content out"
        );
        assert_eq!(out[3]["content"][0]["content"], "2");
        Ok(())
    }

    #[test]
    fn results_held_in_blocks_go_first_in_their_user_turn() -> Fallible {
        let user = with_blocks(
            Role::User,
            "",
            vec![text_block("thanks", ""), tool_result("c1", "42", false)],
        );
        let messages = [calls("", vec![call("c1", "f", "{}", "")]), user];
        let out = array(Body::AnthropicMessages, "", &messages)?;
        assert_eq!(out[1]["content"][0]["type"], "tool_result");
        assert_eq!(out[1]["content"][1]["text"], "thanks");

        let out = array(Body::GeminiContents, "", &messages)?;
        assert_eq!(out[1]["parts"][0]["functionResponse"]["name"], "f");
        assert_eq!(out[1]["parts"][1]["text"], "thanks");

        let out = array(Body::OpenAiResponses, "", &messages)?;
        assert_eq!(out[1]["type"], "function_call_output");
        assert_eq!(out[2]["content"][0]["text"], "thanks");

        // Results in an assistant message open the next user turn.
        let assistant = with_blocks(
            Role::Assistant,
            "done",
            vec![
                tool_use("u1", "f", "{}", ""),
                tool_result("u1", "ok", false),
            ],
        );
        let out = array(
            Body::AnthropicMessages,
            "",
            &[assistant.clone(), Message::text(Role::User, "next")],
        )?;
        assert_eq!(out.len(), 2);
        assert_eq!(out[0]["role"], "assistant");
        assert_eq!(items(&out[0]["content"], "content")?.len(), 2);
        assert_eq!(out[1]["content"][0]["type"], "tool_result");
        assert_eq!(out[1]["content"][1]["text"], "next");
        let out = array(Body::OpenAiResponses, "", &[assistant])?;
        let types: Vec<&Value> = out.iter().map(|item| &item["type"]).collect();
        assert_eq!(types, ["message", "function_call", "function_call_output"]);
        Ok(())
    }

    #[test]
    fn system_and_developer_messages_become_user_turns_where_there_is_no_such_role() -> Fallible {
        let messages = [
            Message::text(Role::System, "Use metric units."),
            Message::text(Role::Developer, "Answer in French."),
        ];
        for body in [Body::AnthropicMessages, Body::GeminiContents] {
            let out = array(body, "", &messages)?;
            assert_eq!(out.len(), 2);
            for (turn, expected) in out.iter().zip(["Use metric units.", "Answer in French."]) {
                assert_eq!(turn["role"], "user", "{body:?}");
                let parts = if body == Body::GeminiContents {
                    &turn["parts"]
                } else {
                    &turn["content"]
                };
                assert_eq!(parts[0]["text"], expected);
            }
        }
        let out = array(Body::OpenAiResponses, "", &messages)?;
        assert_eq!(out[0]["role"], "system");
        assert_eq!(out[1]["role"], "developer");
        assert_eq!(out[1]["content"][0]["text"], "Answer in French.");
        Ok(())
    }

    #[test]
    fn tool_input_that_is_no_object_is_wrapped_as_raw_and_objects_stay_as_stored() -> Fallible {
        let stored = "{\"b\": 1.50, \"a\": 1e300, \"a\": [ ]}";
        for input in ["[1, 2]", "{\"x\": tru", "", "42", "\"text\"", "null"] {
            let m = calls("", vec![call("c1", "f", input, "")]);
            let out = array(Body::AnthropicMessages, "", std::slice::from_ref(&m))?;
            assert_eq!(out[0]["content"][0]["input"], json!({ "_raw": input }));
            let out = array(Body::GeminiContents, "", std::slice::from_ref(&m))?;
            assert_eq!(
                out[0]["parts"][0]["functionCall"]["args"],
                json!({ "_raw": input })
            );
            let out = array(Body::OpenAiResponses, "", &[m])?;
            assert_eq!(out[0]["arguments"], input, "arguments stay verbatim");
        }
        // An object is written byte for byte (key order, spacing,
        // duplicate keys, numbers as written).
        let m = with_blocks(
            Role::Assistant,
            "",
            vec![tool_use("u1", "f", &format!("  {stored}\n"), "")],
        );
        for body in [Body::AnthropicMessages, Body::GeminiContents] {
            let text = render_text(body, "", std::slice::from_ref(&m))?;
            assert!(text.contains(stored), "{body:?}: {text}");
        }
        let text = render_text(Body::OpenAiResponses, "", &[m])?;
        let value: Value = serde_json::from_str(&text)?;
        assert_eq!(value["input"][0]["arguments"], format!("  {stored}\n"));
        Ok(())
    }

    #[test]
    fn content_is_rendered_only_without_text_blocks_after_reasoning_before_the_rest() -> Fallible {
        // Text blocks present: the blocks, not the content.
        let m = with_blocks(
            Role::Assistant,
            "Hello world",
            vec![text_block("Hello ", ""), text_block("world", "")],
        );
        let out = array(Body::AnthropicMessages, "", std::slice::from_ref(&m))?;
        assert_eq!(
            out[0]["content"],
            json!([{ "type": "text", "text": "Hello " }, { "type": "text", "text": "world" }])
        );
        let out = array(Body::GeminiContents, "", std::slice::from_ref(&m))?;
        assert_eq!(
            out[0]["parts"],
            json!([{ "text": "Hello " }, { "text": "world" }])
        );
        let out = array(Body::OpenAiResponses, "", &[m])?;
        assert_eq!(out.len(), 2);
        assert_eq!(out[0]["content"], "Hello ");

        // No text block: reasoning, then the content, then the other blocks,
        // then the tool calls.
        let mut m = with_blocks(
            Role::Assistant,
            "Checking.",
            vec![
                tool_use("u1", "f", "{}", ""),
                thinking("hmm", "sig"),
                reasoning(REASONING_ITEM),
            ],
        );
        m.tool_calls.push(call("c1", "g", "{}", ""));
        let out = array(Body::AnthropicMessages, "", std::slice::from_ref(&m))?;
        let types: Vec<&Value> = items(&out[0]["content"], "content")?
            .iter()
            .map(|b| &b["type"])
            .collect();
        assert_eq!(types, ["thinking", "text", "tool_use", "tool_use"]);
        let out = array(Body::OpenAiResponses, "", std::slice::from_ref(&m))?;
        let types: Vec<&Value> = out.iter().map(|item| &item["type"]).collect();
        assert_eq!(
            types,
            ["reasoning", "message", "function_call", "function_call"]
        );
        let out = array(Body::GeminiContents, "", &[m])?;
        assert_eq!(out[0]["parts"][0]["text"], "Checking.");
        assert_eq!(out[0]["parts"][1]["functionCall"]["name"], "f");
        assert_eq!(out[0]["parts"][2]["functionCall"]["name"], "g");
        Ok(())
    }

    #[test]
    fn reasoning_a_body_has_no_part_for_is_left_out() -> Fallible {
        let m = with_blocks(
            Role::Assistant,
            "",
            vec![
                thinking("hmm", "sig"),
                redacted("opaque"),
                reasoning(REASONING_ITEM),
                text_block("Answer.", ""),
            ],
        );
        let out = array(Body::AnthropicMessages, "", std::slice::from_ref(&m))?;
        let types: Vec<&Value> = items(&out[0]["content"], "content")?
            .iter()
            .map(|b| &b["type"])
            .collect();
        assert_eq!(types, ["thinking", "redacted_thinking", "text"]);
        let out = array(Body::GeminiContents, "", std::slice::from_ref(&m))?;
        assert_eq!(out[0]["parts"], json!([{ "text": "Answer." }]));
        let out = array(Body::OpenAiResponses, "", &[m])?;
        assert_eq!(out.len(), 2);
        assert_eq!(out[0]["id"], "rs_1");
        assert_eq!(
            out[1],
            json!({ "type": "message", "role": "assistant", "content": "Answer." })
        );

        // A message left with nothing the body can carry is left out whole
        // (never an empty content array).
        let only = with_blocks(Role::Assistant, "", vec![reasoning(REASONING_ITEM)]);
        let json_block = ContentBlock::Json {
            kind: "citation".into(),
            json: "{}".into(),
        };
        let other = with_blocks(Role::User, "", vec![json_block, text_block("", "")]);
        for body in [Body::AnthropicMessages, Body::GeminiContents] {
            assert!(array(body, "", &[only.clone(), other.clone()])?.is_empty());
        }
        let thought = with_blocks(Role::Assistant, "", vec![thinking("hmm", "sig")]);
        assert!(array(Body::OpenAiResponses, "", &[thought, other])?.is_empty());
        Ok(())
    }

    #[test]
    fn reasoning_items_are_the_stored_json_each_before_what_it_preceded() -> Fallible {
        let second = "{\"type\":\"reasoning\",\"id\":\"rs_2\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"x\"}]}";
        let m = with_blocks(
            Role::Assistant,
            "",
            vec![
                reasoning(REASONING_ITEM),
                tool_use("fc_1", "f", "{\"a\":1}", ""),
                reasoning(second),
                tool_use("fc_2", "g", "{}", ""),
                reasoning("not json"),
                reasoning("[1]"),
                text_block("done", ""),
            ],
        );
        let text = render_text(Body::OpenAiResponses, "", std::slice::from_ref(&m))?;
        assert!(text.contains(REASONING_ITEM), "verbatim: {text}");
        let out = array(Body::OpenAiResponses, "", &[m])?;
        assert_eq!(out[0], serde_json::from_str::<Value>(REASONING_ITEM)?);
        assert_eq!(out[1]["call_id"], "fc_1");
        assert_eq!(out[1]["arguments"], "{\"a\":1}");
        assert_eq!(out[2], serde_json::from_str::<Value>(second)?);
        assert_eq!(out[3]["call_id"], "fc_2");
        assert_eq!(
            out[4]["content"], "done",
            "what is no JSON object is left out"
        );
        assert_eq!(out.len(), 5);
        Ok(())
    }

    #[test]
    fn responses_items_for_messages_calls_and_outputs() -> Fallible {
        let user = with_blocks(
            Role::User,
            "What is this?",
            vec![
                image("image/png", "", b"png"),
                image("", "https://example.com/b.png", &[]),
            ],
        );
        let assistant = with_blocks(
            Role::Assistant,
            "",
            vec![image("image/png", "", b"drawn"), text_block("A cat.", "")],
        );
        let messages = [
            user,
            assistant,
            calls(
                "",
                vec![
                    call("call_1", "f", "{\"x\": tru", "gemini-sig"),
                    call("call_2", "f", "{}", ""),
                ],
            ),
            tool("call_1", "bad arguments", true),
            tool("call_2", "", false),
        ];
        let expected = json!([
            { "type": "message", "role": "user", "content": [
                { "type": "input_text", "text": "What is this?" },
                { "type": "input_image", "image_url": "data:image/png;base64,cG5n",
                  "detail": "auto" },
                { "type": "input_image", "image_url": "https://example.com/b.png",
                  "detail": "auto" },
            ] },
            { "type": "message", "role": "assistant", "content": "A cat." },
            { "type": "function_call", "call_id": "call_1", "name": "f",
              "arguments": "{\"x\": tru" },
            { "type": "function_call", "call_id": "call_2", "name": "f", "arguments": "{}" },
            { "type": "function_call_output", "call_id": "call_1", "output": "bad arguments" },
            { "type": "function_call_output", "call_id": "call_2", "output": "" },
        ]);
        assert_eq!(
            Value::Array(array(Body::OpenAiResponses, "", &messages)?),
            expected
        );
        Ok(())
    }

    #[test]
    fn gemini_parts_signatures_and_function_responses() -> Fallible {
        let user = with_blocks(
            Role::User,
            "Where?",
            vec![
                image("image/png", "", b"png"),
                image("", "https://example.com/c.png", &[]),
            ],
        );
        let model = with_blocks(
            Role::Assistant,
            "",
            vec![
                text_block("Looking.", "sig-text"),
                text_block("plain", ""),
                tool_use("u1", "lookup", "{\"q\":1}", "sig-call"),
                tool_use("u2", "lookup", "{\"q\":2}", ""),
                text_block("", "sig-empty"),
            ],
        );
        let messages = [
            user,
            model,
            tool("u2", "two", false),
            tool("u1", "no such place", true),
        ];
        let expected = json!([
            { "role": "user", "parts": [
                { "text": "Where?" },
                { "inlineData": { "mimeType": "image/png", "data": "cG5n" } },
                { "fileData": { "fileUri": "https://example.com/c.png" } },
            ] },
            { "role": "model", "parts": [
                { "text": "Looking.", "thoughtSignature": "sig-text" },
                { "text": "plain" },
                { "functionCall": { "id": "u1", "name": "lookup", "args": { "q": 1 } },
                  "thoughtSignature": "sig-call" },
                { "functionCall": { "id": "u2", "name": "lookup", "args": { "q": 2 } },
                  "thoughtSignature": SKIP_THOUGHT_SIGNATURE },
                { "text": "", "thoughtSignature": "sig-empty" },
            ] },
            { "role": "user", "parts": [
                { "functionResponse": { "id": "u2", "name": "lookup",
                    "response": { "output": "two" } } },
                { "functionResponse": { "id": "u1", "name": "lookup",
                    "response": { "error": "no such place" } } },
            ] },
        ]);
        assert_eq!(
            Value::Array(array(Body::GeminiContents, "", &messages)?),
            expected
        );
        Ok(())
    }

    #[test]
    fn gemini_names_a_result_by_its_call_and_keeps_only_unanswered_names() -> Fallible {
        let mut writer = BodyWriter::new(Body::GeminiContents, "");
        writer.opening()?;
        writer.message(&calls("", vec![call("c1", "first", "{}", "")]))?;
        writer.message(&calls("", vec![call("c2", "second", "{}", "")]))?;
        assert_eq!(writer.names.len(), 2);
        let out = writer.message(&tool("c1", "1", false))?;
        assert!(out.contains("\"name\":\"first\""), "{out}");
        assert_eq!(writer.names.len(), 1, "an answered call's name is let go");
        // A result whose call it has not seen: the tool message's own name.
        let mut unknown = tool("c9", "9", false);
        unknown.name = "ninth".into();
        let out = writer.message(&unknown)?;
        assert!(out.contains("\"name\":\"ninth\""), "{out}");
        Ok(())
    }

    #[test]
    fn signatures_travel_only_where_the_body_has_a_part_for_them() -> Fallible {
        let m = with_blocks(
            Role::Assistant,
            "",
            vec![
                text_block("t", "sig-text"),
                tool_use("u1", "f", "{}", "sig-use"),
            ],
        );
        let mut m = m;
        m.tool_calls.push(call("c1", "g", "{}", "sig-call"));
        for body in [Body::AnthropicMessages, Body::OpenAiResponses] {
            let text = render_text(body, "", std::slice::from_ref(&m))?;
            assert!(!text.contains("sig-"), "{body:?}: {text}");
        }
        let text = render_text(Body::GeminiContents, "", &[m])?;
        for sig in ["sig-text", "sig-use", "sig-call"] {
            assert!(text.contains(sig), "{text}");
        }
        // Content (no text block) never carries a signature.
        let plain = Message::text(Role::Assistant, "hi");
        let out = array(Body::GeminiContents, "", &[plain])?;
        assert_eq!(out[0]["parts"], json!([{ "text": "hi" }]));
        Ok(())
    }

    #[test]
    fn nul_survives_as_an_escape_in_every_body() -> Fallible {
        let mut m = Message::text(Role::User, "a\u{0}b");
        m.content_blocks.clear();
        let c = calls(
            "x\u{0}",
            vec![call("c\u{0}", "f", "{\"k\":\"\\u0000\"}", "")],
        );
        let t = tool("c\u{0}", "out\u{0}put", false);
        for body in ALL {
            let text = render_text(body, "sys\u{0}tem", &[m.clone(), c.clone(), t.clone()])?;
            assert!(!text.contains('\u{0}'), "{body:?}: raw NUL in {text:?}");
            assert!(text.contains("a\\u0000b"), "{body:?}: {text}");
            assert!(text.contains("sys\\u0000tem"), "{body:?}: {text}");
            let value: Value = serde_json::from_str(&text)?;
            assert!(value.to_string().contains("out\\u0000put"));
        }
        Ok(())
    }

    #[test]
    fn stored_json_that_is_not_valid_json_never_breaks_the_body() -> Fallible {
        // Raw control characters inside strings, a lone surrogate escape,
        // trailing text: invalid JSON is wrapped (or, as a reasoning
        // item, left out), so the body still parses.
        let inputs = [
            "{\"a\": \"x\u{0}y\"}",
            "{\"a\": \"line\nbreak\"}",
            "{\"a\": 1} {\"b\": 2}",
            "{\"a\": \"\\ud800\"}",
            "{\"a\": 1e400}",
        ];
        for input in inputs {
            let mut m = calls("", vec![call("c1", "f", input, "")]);
            m.content_blocks.push(reasoning(input));
            for body in ALL {
                let text = render_text(body, "", std::slice::from_ref(&m))?;
                assert!(!text.contains('\u{0}'), "{body:?}: {text:?}");
                let value: Value = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("{body:?} {input:?}: {e}: {text}"));
                match body {
                    Body::AnthropicMessages => assert_eq!(
                        value["messages"][0]["content"][0]["input"],
                        json!({ "_raw": input })
                    ),
                    Body::GeminiContents => assert_eq!(
                        value["contents"][0]["parts"][0]["functionCall"]["args"],
                        json!({ "_raw": input })
                    ),
                    Body::OpenAiResponses => {
                        let items = items(&value["input"], "input")?;
                        assert_eq!(items.len(), 1, "the reasoning item is left out");
                        assert_eq!(items[0]["arguments"], input);
                    }
                }
            }
        }
        Ok(())
    }

    #[test]
    fn tool_messages_without_a_call_id_are_user_text_and_text_blocks_are_output() -> Fallible {
        let orphan = Message::text(Role::Tool, "stray output");
        let out = array(Body::AnthropicMessages, "", std::slice::from_ref(&orphan))?;
        assert_eq!(
            out[0],
            json!({ "role": "user", "content": [{ "type": "text", "text": "stray output" }] })
        );
        let out = array(Body::OpenAiResponses, "", &[orphan])?;
        assert_eq!(out[0]["role"], "user");

        let mut blocks = tool("c1", "ignored: repeats the blocks", false);
        blocks.content_blocks = vec![text_block("line 1\n", ""), text_block("line 2", "")];
        let messages = [calls("", vec![call("c1", "f", "{}", "")]), blocks];
        let out = array(Body::OpenAiResponses, "", &messages)?;
        assert_eq!(out[1]["output"], "line 1\nline 2");
        let out = array(Body::GeminiContents, "", &messages)?;
        assert_eq!(
            out[1]["parts"][0]["functionResponse"]["response"],
            json!({ "output": "line 1\nline 2" })
        );
        Ok(())
    }

    #[test]
    fn the_writer_holds_back_at_most_the_open_turn() -> Fallible {
        // Each result is written as it comes: nothing waits for the end
        // but the closing brackets of the open turn.
        let mut writer = BodyWriter::new(Body::AnthropicMessages, "");
        let mut out = writer.opening()?;
        out.push_str(&writer.message(&calls("", vec![call("c1", "f", "{}", "")]))?);
        let first = writer.message(&tool("c1", "one", false))?;
        assert!(first.contains("one"), "{first}");
        out.push_str(&first);
        assert!(writer.open);
        let closing = writer.closing()?;
        assert_eq!(closing, "]}\n]}\n");
        out.push_str(&closing);
        let value: Value = serde_json::from_str(&out)?;
        assert_eq!(items(&value["messages"], "messages")?.len(), 2);
        Ok(())
    }
}
