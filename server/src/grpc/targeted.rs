//! Exports for a target (ExportHistory and ExportTranscript with an
//! `ExportTarget`): the messages [`domain::target`](crate::domain::target)
//! says go, read in two passes within the stream's byte bounds — one for
//! the shapes tool pairing is judged on (ids and flags, not bodies), one
//! to send — with each message's origin from one read of the session's
//! provider calls.

use std::sync::Arc;

use bytes::Bytes;
use futures_core::Stream;
use prost::Message as _;

use crate::domain::target::Origin;
use crate::domain::target::{Decision, ExportTarget, IdSet, Pairing, Plan, Shape, stripped};
use crate::domain::{ContentBlock, Message, Result, StoredMessage};
use crate::read_ahead::{ReadAhead, ReadPage, Share, StreamBudget};
use crate::store::{OwnedMessageRow, SessionHandle, Store};
use crate::wire;

/// The most an export for a target holds back while it waits for tool
/// results (messages after a call with no result yet). Past it, the rest
/// of the export is judged in two passes instead.
const MAX_HELD_BYTES: usize = 2 << 20;

/// A message an export for a target sends, as the target's rules leave
/// it. A stored encoding is judged from its outline ([`wire::outline`]),
/// and the reasoning and signatures a target does not keep are taken out
/// of the encoding itself ([`wire::without_reasoning`]): such a message
/// is decoded only if pairing changes it (or for ExportTranscript, which
/// renders it). An older row's JSON is decoded to be judged.
///
/// Boxed: a message is moved about a dozen times on its way out (into the
/// read-ahead's pages, through the pairing queue, through the stream's
/// stages), and moving its row and outline (about 250 bytes) each time
/// cost more than the one allocation.
pub(crate) struct Targeted(Box<Parts>);

/// What a [`Targeted`] holds.
pub(crate) struct Parts {
    row: OwnedMessageRow,
    /// The stored encoding's outline, read with the page (on the
    /// read-ahead's task, beside the sending of earlier messages).
    outline: Option<wire::Outline>,
    /// The message, once decoded, as the rules left it. Boxed: most
    /// messages are never decoded.
    message: Option<Box<Message>>,
    /// The rules changed the message: it is encoded again to be sent.
    changed: bool,
}

impl std::ops::Deref for Targeted {
    type Target = Parts;

    fn deref(&self) -> &Parts {
        &self.0
    }
}

impl std::ops::DerefMut for Targeted {
    fn deref_mut(&mut self) -> &mut Parts {
        &mut self.0
    }
}

impl Targeted {
    fn new(row: OwnedMessageRow, outline: Option<wire::Outline>) -> Self {
        Targeted(Box::new(Parts {
            row,
            outline,
            message: None,
            changed: false,
        }))
    }

    /// The message's encoding as a `Message` of the API.
    pub(crate) fn into_encoding(self) -> Result<Bytes> {
        let Parts {
            row,
            message,
            changed,
            ..
        } = *self.0;
        if !changed && let Some(wire) = row.wire {
            return Ok(wire);
        }
        let message = match message {
            Some(message) => *message,
            None => row.message()?,
        };
        Ok(Bytes::from(wire::message_to_pb(message).encode_to_vec()))
    }

    /// The stored message, its message as the rules left it.
    pub(crate) fn into_stored(self, session_id: &str) -> Result<StoredMessage> {
        let Parts { row, message, .. } = *self.0;
        match message {
            Some(message) => Ok(row.into_stored_with(session_id, *message)),
            None => row.into_stored(session_id),
        }
    }

    /// As `decision` leaves it (or `None`: left out).
    fn decided(mut self, decision: &Decision) -> Result<Option<Self>> {
        if decision.changes_nothing() {
            return Ok(Some(self));
        }
        let message = self.take_message()?;
        Ok(decision.apply(message).map(|message| {
            self.set(message, true);
            self
        }))
    }
}

impl Parts {
    fn sequence(&self) -> i64 {
        self.row.sequence
    }

    /// Takes the message out to apply a rule to it, decoded if it was not.
    fn take_message(&mut self) -> Result<Message> {
        match self.message.take() {
            Some(message) => Ok(*message),
            None => self.row.message(),
        }
    }

    /// Puts `message`, as a rule left it, back.
    fn set(&mut self, message: Message, changed: bool) {
        self.message = Some(Box::new(message));
        self.changed |= changed;
    }

    /// Steps 1 and 2 for this message (see [`stripped`]): its shape and
    /// about what it holds in memory, or `None` when nothing is left to
    /// send.
    /// Its origin (`origin_of`) is looked up only if the rules need it.
    fn judge<'o>(
        &mut self,
        target: &ExportTarget,
        origin_of: &impl Fn(&Parts) -> Option<&'o Origin>,
    ) -> Result<Option<(Shape, usize)>> {
        if self.message.is_none()
            && let Some(encoding) = &self.row.wire
        {
            let outline = match self.outline.take() {
                Some(outline) => outline,
                None => wire::outline(encoding)?,
            };
            if (outline.reasoning || outline.signed) && !target.keeps(origin_of(self)) {
                self.row.wire = Some(Bytes::from(wire::without_reasoning(encoding)?));
            }
            let size = self.row.wire.as_ref().map_or(0, Bytes::len) + 64;
            return Ok(shape_of(self.sequence(), outline).map(|shape| (shape, size)));
        }
        let origin = origin_of(self);
        let message = self.take_message()?;
        Ok(stripped(target, message, origin).map(|(message, changed)| {
            let judged = (Shape::of(self.sequence(), &message), message_size(&message));
            self.set(message, changed);
            judged
        }))
    }
}

/// The shape of a message with this outline once step 1 has taken out
/// what it takes out, or `None` if step 2 leaves it out: [`Shape::of`]
/// and the test of [`stripped`], from the outline (which step 1 changes
/// only in reasoning and signatures, which neither looks at).
fn shape_of(sequence: i64, outline: wire::Outline) -> Option<Shape> {
    let worth_sending = outline.has_text
        || outline.other_blocks
        || !outline.tool_uses.is_empty()
        || !outline.result_blocks.is_empty()
        || !outline.tool_calls.is_empty()
        || !outline.tool_call_id.is_empty();
    if !worth_sending {
        return None;
    }
    let mut calls = outline.tool_calls;
    calls.extend(outline.tool_uses);
    Some(Shape {
        sequence,
        assistant: outline.assistant,
        calls,
        answers: (!outline.tool_call_id.is_empty()).then_some(outline.tool_call_id),
        result_blocks: outline.result_blocks,
        other: outline.has_text || outline.other_blocks,
    })
}

/// Pages of the session's messages as stored.
fn pages<S: Store>(store: S, session: SessionHandle) -> ReadPage<Targeted> {
    Arc::new(move |after, bound| {
        let (store, session) = (store.clone(), session.clone());
        Box::pin(async move {
            store
                .read_message_rows_bounded(&session, after, bound)
                .await?
                .try_map(|row| {
                    // One that cannot be read is read again, and fails,
                    // when its turn comes, as it did before.
                    let outline = row
                        .wire
                        .as_deref()
                        .and_then(|wire| wire::outline(wire).ok());
                    Ok(Targeted::new(row, outline))
                })
        })
    })
}

fn sequence_of(targeted: &Targeted) -> i64 {
    targeted.sequence()
}

/// The messages after `after` (up to the session's length now) that an
/// export for `target` sends, each as step 1 and pairing left it, the
/// last `max_messages` of them (0: all).
///
/// Without a window it is one pass: [`Pairing`] holds back only what waits
/// for a tool result, at most [`MAX_HELD_BYTES`]; past that, and with a
/// window (which needs the count of what goes), the range is read twice:
/// once for the shapes (ids and flags), once to send.
pub(crate) fn targeted<S: Store>(
    store: S,
    session: SessionHandle,
    after: i64,
    target: ExportTarget,
    max_messages: usize,
    share: Share,
    budget: Arc<StreamBudget>,
) -> impl Stream<Item = Result<Targeted>> + Send + 'static {
    async_stream::try_stream! {
        let end = session.next_sequence;
        let mut share = Some(share);
        let mut one_pass = (max_messages == 0).then(|| ReadAhead::ranges(pages(store.clone(), session.clone()), sequence_of, share.take().unwrap_or_else(|| budget.share()), after, end));
        // The origins are read beside the first page.
        let (origins, first) = match &mut one_pass {
            Some(messages) => tokio::join!(store.call_origins(&session), messages.next()),
            None => (store.call_origins(&session).await, Ok(None)),
        };
        let origins = origins?;
        let mut first = first?;
        let origin_of = |item: &Parts| {
            origins.get(item.row.produced_by_call_id.as_deref().unwrap_or_default())
        };
        // Where the two passes start, and the calls made before it.
        let mut rest: Option<(i64, IdSet)> = None;
        if let Some(mut messages) = one_pass {
            let mut pairing = Pairing::default();
            let mut cut_short = false;
            loop {
                let next = match first.take() {
                    Some(item) => Some(item),
                    None => messages.next().await?,
                };
                let Some(mut item) = next else {
                    break;
                };
                let Some((shape, size)) = item.judge(&target, &origin_of)? else {
                    continue;
                };
                for (item, decision) in pairing.push(item, shape, size) {
                    if let Some(item) = item.decided(&decision)? {
                        yield item;
                    }
                }
                if pairing.held_bytes() > MAX_HELD_BYTES {
                    cut_short = true;
                    break;
                }
            }
            drop(messages);
            if cut_short {
                let (held, made) = pairing.into_rest();
                if let Some(first) = held.first() {
                    rest = Some((first.sequence() - 1, made));
                }
            } else {
                for (item, decision) in pairing.finish() {
                    if let Some(item) = item.decided(&decision)? {
                        yield item;
                    }
                }
            }
        } else {
            rest = Some((after, IdSet::default()));
        }
        let Some((after, made_before)) = rest else {
            return;
        };
        // Pass 1: the shapes of what steps 1 and 2 keep.
        let mut shapes = Vec::new();
        let mut messages = ReadAhead::ranges(pages(store.clone(), session.clone()), sequence_of, share.take().unwrap_or_else(|| budget.share()), after, end);
        while let Some(mut item) = messages.next().await? {
            if let Some((shape, _)) = item.judge(&target, &origin_of)? {
                shapes.push(shape);
            }
        }
        drop(messages);
        let mut plan = Plan::after(&shapes, &made_before);
        plan.window(&shapes, max_messages);
        drop(shapes);
        // Pass 2: from the first message that goes, each with its decision.
        if let Some(first) = plan.first_sequence() {
            let mut messages = ReadAhead::ranges(pages(store, session), sequence_of, budget.share(), first - 1, end);
            while let Some(mut item) = messages.next().await? {
                let Some(decision) = plan.decision(item.sequence()) else {
                    continue;
                };
                if item.judge(&target, &origin_of)?.is_none() {
                    continue;
                }
                let item = match decision {
                    None => Some(item),
                    Some(decision) => item.decided(decision)?,
                };
                if let Some(item) = item {
                    yield item;
                }
            }
        }
    }
}

/// About what a message holds in memory, for the bound on held messages.
fn message_size(message: &Message) -> usize {
    let blocks: usize = message
        .content_blocks
        .iter()
        .map(|block| match block {
            ContentBlock::Text { text, signature } => text.len() + signature.len(),
            ContentBlock::Thinking {
                thinking,
                signature,
            } => thinking.len() + signature.len(),
            ContentBlock::RedactedThinking { data } => data.len(),
            ContentBlock::Image { url, data, .. } => url.len() + data.len(),
            ContentBlock::ToolUse {
                input, signature, ..
            } => input.len() + signature.len(),
            ContentBlock::ToolResult { content, .. } => content.len(),
            ContentBlock::Json { json, .. } => json.len(),
        })
        .sum();
    let calls: usize = message
        .tool_calls
        .iter()
        .map(|call| call.arguments.len() + call.signature.len())
        .sum();
    message.content.len() + blocks + calls + 64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::target::ReasoningPolicy;
    use crate::domain::{Role, ToolCall};
    use crate::store::MessageRow;

    fn call(id: &str, signature: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "lookup".into(),
            arguments: r#"{"q": 1}"#.into(),
            signature: signature.into(),
        }
    }

    fn with(role: Role, text: &str, blocks: Vec<ContentBlock>, calls: Vec<ToolCall>) -> Message {
        let mut message = Message::text(role, text.to_owned());
        message.content_blocks = blocks;
        message.tool_calls = calls;
        message
    }

    /// Messages of every kind the rules tell apart.
    fn messages() -> Vec<Message> {
        let text = |text: &str, signature: &str| ContentBlock::Text {
            text: text.into(),
            signature: signature.into(),
        };
        let thinking = ContentBlock::Thinking {
            thinking: "hmm".into(),
            signature: "sig-t".into(),
        };
        let redacted = ContentBlock::RedactedThinking {
            data: "opaque".into(),
        };
        let reasoning_json = ContentBlock::Json {
            kind: "reasoning".into(),
            json: r#"{"type":"reasoning"}"#.into(),
        };
        let citation = ContentBlock::Json {
            kind: "citation".into(),
            json: "{}".into(),
        };
        let tool_use = |id: &str, signature: &str| ContentBlock::ToolUse {
            id: id.into(),
            name: "f".into(),
            input: "{}".into(),
            signature: signature.into(),
        };
        let result = |id: &str| ContentBlock::ToolResult {
            tool_use_id: id.into(),
            content: "out".into(),
            is_error: false,
        };
        let image = ContentBlock::Image {
            media_type: "image/png".into(),
            url: String::new(),
            data: vec![1, 2, 3],
        };
        let mut answer = Message::text(Role::Tool, String::new());
        answer.tool_call_id = "c1".into();
        answer.tool_error = true;
        let mut named = with(Role::Assistant, "hi", vec![], vec![]);
        named.name = "bot".into();
        named.incomplete = true;
        named.metadata.insert("k".into(), "v".into());
        vec![
            Message::text(Role::User, "question".to_owned()),
            Message::text(Role::Assistant, String::new()),
            named,
            answer,
            with(Role::Assistant, "", vec![thinking.clone()], vec![]),
            with(
                Role::Assistant,
                "",
                vec![redacted.clone(), reasoning_json.clone()],
                vec![],
            ),
            with(
                Role::Assistant,
                "answer",
                vec![thinking.clone(), text("part", "sig-p"), citation.clone()],
                vec![call("c1", "sig-c"), call("c2", "")],
            ),
            with(
                Role::Assistant,
                "",
                vec![reasoning_json, tool_use("u1", "sig-u"), tool_use("u2", "")],
                vec![],
            ),
            with(
                Role::User,
                "",
                vec![result("u1"), image, text("", "")],
                vec![],
            ),
            with(
                Role::Assistant,
                "",
                vec![thinking, redacted, citation],
                vec![call("c3", "")],
            ),
        ]
    }

    fn row(message: &Message) -> OwnedMessageRow {
        MessageRow {
            id: "m".into(),
            sequence: 7,
            produced_by_call_id: None,
            body: String::new(),
            wire: Some(Bytes::from(
                wire::message_to_pb(message.clone()).encode_to_vec(),
            )),
            create_time: 0,
            redacted: 0,
        }
    }

    /// Judging a stored encoding from its outline gives what decoding it
    /// and applying the rules gives: the same shape, size aside, and the
    /// same bytes sent.
    #[test]
    fn an_outline_judges_as_the_decoded_message_does() -> Result<()> {
        let origin = Origin {
            provider: "anthropic".into(),
            model: "claude-sonnet-4-5".into(),
        };
        let targets = [
            ExportTarget {
                provider: "anthropic".into(),
                model: "claude-sonnet-4-5".into(),
                reasoning: ReasoningPolicy::SameModel,
            },
            ExportTarget {
                provider: "openai".into(),
                model: "o3".into(),
                reasoning: ReasoningPolicy::SameModel,
            },
        ];
        for target in &targets {
            for message in messages() {
                let decoded = stripped(target, message.clone(), Some(&origin))
                    .map(|(m, _)| (Shape::of(7, &m), wire::message_to_pb(m).encode_to_vec()));
                let row = row(&message);
                let outline = row.wire.as_deref().map(wire::outline).transpose()?;
                let mut item = Targeted::new(row, outline);
                let judged = item.judge(target, &|_: &Parts| Some(&origin))?;
                assert!(item.message.is_none(), "judged without decoding");
                let outlined = match judged {
                    Some((shape, _)) => Some((shape, item.into_encoding()?.to_vec())),
                    None => None,
                };
                assert_eq!(outlined, decoded, "{message:?} for {target:?}");
            }
        }
        Ok(())
    }
}
