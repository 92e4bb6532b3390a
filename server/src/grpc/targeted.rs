//! Exports for a target (ExportHistory and ExportTranscript with an
//! `ExportTarget`): the messages [`domain::target`](crate::domain::target)
//! says go, read in two passes within the stream's byte bounds — one for
//! the shapes tool pairing is judged on (ids and flags, not bodies), one
//! to send — with each message's origin from one read of the session's
//! provider calls.

use std::collections::HashSet;
use std::sync::Arc;

use futures_core::Stream;

use super::{message_pages, sequence_of};
use crate::domain::target::{Decision, ExportTarget, Pairing, Plan, Shape, strip};
use crate::domain::{ContentBlock, Message, Result, Role, StoredMessage};
use crate::read_ahead::{ReadAhead, Share, StreamBudget};
use crate::store::{SessionHandle, Store};

/// The most an export for a target holds back while it waits for tool
/// results (messages after a call with no result yet). Past it, the rest
/// of the export is judged in two passes instead.
const MAX_HELD_BYTES: usize = 2 << 20;

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
) -> impl Stream<Item = Result<StoredMessage>> + Send + 'static {
    async_stream::try_stream! {
        let end = session.next_sequence;
        let mut share = Some(share);
        let mut one_pass = (max_messages == 0).then(|| ReadAhead::ranges(message_pages(store.clone(), session.clone()), sequence_of, share.take().unwrap_or_else(|| budget.share()), after, end));
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
                    Some(stored) => Some(stored),
                    None => messages.next().await?,
                };
                let Some(mut stored) = next else {
                    break;
                };
                let origin = origin_of(&stored);
                let Some(message) = strip(&target, take_message(&mut stored), origin) else {
                    continue;
                };
                let shape = Shape::of(stored.sequence, &message);
                let size = message_size(&message);
                stored.message = message;
                for (stored, decision) in pairing.push(stored, shape, size) {
                    if let Some(stored) = decided(stored, &decision) {
                        yield stored;
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
                    rest = Some((first.sequence - 1, made));
                }
            } else {
                for (stored, decision) in pairing.finish() {
                    if let Some(stored) = decided(stored, &decision) {
                        yield stored;
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
        let mut messages = ReadAhead::ranges(message_pages(store.clone(), session.clone()), sequence_of, share.take().unwrap_or_else(|| budget.share()), after, end);
        while let Some(stored) = messages.next().await? {
            let sequence = stored.sequence;
            let origin = origin_of(&stored);
            if let Some(message) = strip(&target, stored.message, origin) {
                shapes.push(Shape::of(sequence, &message));
            }
        }
        drop(messages);
        let mut plan = Plan::after(&shapes, &made_before);
        plan.window(&shapes, max_messages);
        drop(shapes);
        // Pass 2: from the first message that goes, each with its decision.
        if let Some(first) = plan.first_sequence() {
            let mut messages = ReadAhead::ranges(message_pages(store, session), sequence_of, budget.share(), first - 1, end);
            while let Some(mut stored) = messages.next().await? {
                let Some(decision) = plan.decision(stored.sequence) else {
                    continue;
                };
                let origin = origin_of(&stored);
                let Some(message) = strip(&target, stored.message, origin) else {
                    continue;
                };
                let message = match decision {
                    None => Some(message),
                    Some(decision) => decision.apply(message),
                };
                if let Some(message) = message {
                    stored.message = message;
                    yield stored;
                }
            }
        }
    }
}

/// A decided message, as its decision leaves it (or `None`: left out).
fn decided(mut stored: StoredMessage, decision: &Decision) -> Option<StoredMessage> {
    if *decision == Decision::default() {
        return Some(stored);
    }
    stored.message = decision.apply(take_message(&mut stored))?;
    Some(stored)
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
