//! Exports for a target (ExportHistory and ExportTranscript with an
//! `ExportTarget`): the messages [`domain::target`](crate::domain::target)
//! says go, read in two passes within the stream's byte bounds — one for
//! the shapes tool pairing is judged on (ids and flags, not bodies), one
//! to send — with each message's origin from one read of the session's
//! provider calls.

use std::collections::HashMap;
use std::sync::Arc;

use futures_core::Stream;

use super::{message_pages, sequence_of};
use crate::domain::target::{ExportTarget, Origin, Plan, Shape, strip};
use crate::domain::{Result, StoredMessage};
use crate::read_ahead::{ReadAhead, Share, StreamBudget};
use crate::store::{SessionHandle, Store};

/// Provider calls read per page for the origins.
const CALLS_PAGE: usize = 1000;

/// The messages after `after` (up to the session's length now) that an
/// export for `target` sends, each as step 1 and pairing left it, the
/// last `max_messages` of them (0: all).
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
        let origins = origins(&store, &session).await?;
        let origin_of = |stored: &StoredMessage| origins.get(&stored.produced_by_call_id);
        // Pass 1: the shapes of what steps 1 and 2 keep.
        let mut shapes = Vec::new();
        let mut messages = ReadAhead::ranges(message_pages(store.clone(), session.clone()), sequence_of, share, after, end);
        while let Some(stored) = messages.next().await? {
            let sequence = stored.sequence;
            let origin = origin_of(&stored);
            if let Some(message) = strip(&target, stored.message, origin) {
                shapes.push(Shape::of(sequence, &message));
            }
        }
        drop(messages);
        let mut plan = Plan::new(&shapes);
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

/// The origin of every provider call of the session, by call id.
async fn origins<S: Store>(store: &S, session: &SessionHandle) -> Result<HashMap<String, Origin>> {
    let mut origins = HashMap::new();
    let mut after = 0;
    loop {
        let page = store
            .read_provider_calls(session, after, CALLS_PAGE)
            .await?;
        let Some(last) = page.last() else {
            return Ok(origins);
        };
        after = last.ordinal;
        let full = page.len() == CALLS_PAGE;
        for listed in page {
            let call = listed.call;
            origins.insert(
                call.id,
                Origin {
                    provider: call.provider,
                    model: call.model,
                },
            );
        }
        if !full {
            return Ok(origins);
        }
    }
}
