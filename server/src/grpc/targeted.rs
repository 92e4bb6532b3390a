//! Exports for a target (ExportHistory and ExportTranscript with an
//! `ExportTarget`): the messages [`domain::target`](crate::domain::target)
//! says go, read in two passes within the stream's byte bounds — one for
//! the shapes tool pairing is judged on (ids and flags, not bodies), one
//! to send — with each message's origin from one read of the session's
//! provider calls.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use futures_core::Stream;
use prost::Message as _;

use crate::domain::target::{Decision, ExportTarget, Pairing, Plan, Shape, stripped};
use crate::domain::{ContentBlock, Message, Result, Role, StoredMessage};
use crate::read_ahead::{ReadAhead, ReadPage, Share, StreamBudget};
use crate::store::{SessionHandle, Store};
use crate::wire;

/// The most an export for a target holds back while it waits for tool
/// results (messages after a call with no result yet). Past it, the rest
/// of the export is judged in two passes instead.
const MAX_HELD_BYTES: usize = 2 << 20;

/// A message an export for a target sends, as the target's rules leave
/// it, with its stored encoding for as long as they leave it as stored:
/// most messages go out as they are, sent as stored rather than encoded
/// again.
pub(crate) struct Targeted {
    pub stored: StoredMessage,
    encoding: Option<Bytes>,
}

impl Targeted {
    /// The message's encoding as a `Message` of the API.
    pub(crate) fn into_encoding(self) -> Bytes {
        match self.encoding {
            Some(encoding) => encoding,
            None => Bytes::from(wire::message_to_pb(self.stored.message).encode_to_vec()),
        }
    }

    /// Puts `message`, as the rules left it, in place of the one read.
    fn set(&mut self, message: Message, changed: bool) {
        self.stored.message = message;
        if changed {
            self.encoding = None;
        }
    }
}

/// Pages of the session's messages, each decoded and with its stored
/// encoding.
fn pages<S: Store>(store: S, session: SessionHandle) -> ReadPage<Targeted> {
    Arc::new(move |after, bound| {
        let (store, session) = (store.clone(), session.clone());
        Box::pin(async move {
            store
                .read_message_rows_bounded(&session, after, bound)
                .await?
                .try_map(|row| {
                    let encoding = row.wire.clone();
                    Ok(Targeted {
                        stored: row.into_stored(&session.id)?,
                        encoding,
                    })
                })
        })
    })
}

fn sequence_of(targeted: &Targeted) -> i64 {
    targeted.stored.sequence
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
        let origin_of = |stored: &StoredMessage| origins.get(&stored.produced_by_call_id);
        // Where the two passes start, and the calls made before it.
        let mut rest: Option<(i64, HashSet<String>)> = None;
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
                let origin = origin_of(&item.stored);
                let Some((message, changed)) = stripped(&target, take_message(&mut item.stored), origin) else {
                    continue;
                };
                let shape = Shape::of(item.stored.sequence, &message);
                let size = message_size(&message);
                item.set(message, changed);
                for (item, decision) in pairing.push(item, shape, size) {
                    if let Some(item) = decided(item, &decision) {
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
                    rest = Some((first.stored.sequence - 1, made));
                }
            } else {
                for (item, decision) in pairing.finish() {
                    if let Some(item) = decided(item, &decision) {
                        yield item;
                    }
                }
            }
        } else {
            rest = Some((after, HashSet::new()));
        }
        let Some((after, made_before)) = rest else {
            return;
        };
        // Pass 1: the shapes of what steps 1 and 2 keep.
        let mut shapes = Vec::new();
        let mut messages = ReadAhead::ranges(pages(store.clone(), session.clone()), sequence_of, share.take().unwrap_or_else(|| budget.share()), after, end);
        while let Some(item) = messages.next().await? {
            let sequence = item.stored.sequence;
            let origin = origin_of(&item.stored);
            if let Some((message, _)) = stripped(&target, item.stored.message, origin) {
                shapes.push(Shape::of(sequence, &message));
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
                let Some(decision) = plan.decision(item.stored.sequence) else {
                    continue;
                };
                let origin = origin_of(&item.stored);
                let Some((message, changed)) = stripped(&target, take_message(&mut item.stored), origin) else {
                    continue;
                };
                item.set(message, changed);
                let item = match decision {
                    None => Some(item),
                    Some(decision) => decided(item, decision),
                };
                if let Some(item) = item {
                    yield item;
                }
            }
        }
    }
}

/// A decided message, as its decision leaves it (or `None`: left out).
fn decided(mut item: Targeted, decision: &Decision) -> Option<Targeted> {
    if *decision == Decision::default() {
        return Some(item);
    }
    let message = decision.apply(take_message(&mut item.stored))?;
    item.set(message, true);
    Some(item)
}

/// Moves the message out of `stored` (leaving an empty one).
fn take_message(stored: &mut StoredMessage) -> Message {
    std::mem::replace(&mut stored.message, Message::text(Role::User, ""))
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
