//! Where an ExportHistory starts: summary point, `after_sequence` and the
//! `max_messages` window, widened so it never begins with an orphaned tool
//! result. Written once over the [`Store`] trait, for every backend.

use super::{SessionHandle, Store};
use crate::domain::{Error, Result, Role};

/// How many messages to read per step while widening a window backwards.
const WIDEN_STEP: usize = 256;

/// The first message an export emits is the one after `after`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportStart {
    pub after: i64,
}

impl ExportStart {
    /// Computes the start for one export request.
    pub async fn compute<S: Store>(
        store: &S,
        session: &SessionHandle,
        from_summary: bool,
        after_sequence: Option<i64>,
        max_messages: i64,
    ) -> Result<Self> {
        if max_messages < 0 {
            return Err(Error::invalid("max_messages", "must not be negative"));
        }
        if after_sequence.is_some_and(|a| a < -1) {
            return Err(Error::invalid("after_sequence", "must be at least -1"));
        }
        // `floor` is the first sequence the request allows at all.
        let mut floor = after_sequence.map_or(0, |a| a.saturating_add(1));
        if from_summary
            && !session.summary_message_id.is_empty()
            && let Some(seq) = store
                .message_sequence(session, &session.summary_message_id)
                .await?
        {
            floor = floor.max(seq);
        }
        let limit = usize::try_from(max_messages).unwrap_or(usize::MAX);
        if limit == 0 {
            return Ok(ExportStart { after: floor - 1 });
        }

        let tail = store.read_messages_before(session, i64::MAX, limit).await?;
        let Some(first) = tail
            .last()
            .filter(|m| tail.len() == limit && m.sequence > floor)
        else {
            return Ok(ExportStart { after: floor - 1 });
        };
        let mut start = first.sequence;
        if first.message.is_tool_result() {
            let wanted: Vec<&str> = first.message.answered_tool_calls().collect();
            let mut before = first.sequence;
            'scan: while before > floor {
                let page = store
                    .read_messages_before(session, before, WIDEN_STEP)
                    .await?;
                let Some(last) = page.last() else { break };
                for candidate in &page {
                    if candidate.sequence < floor {
                        break 'scan;
                    }
                    if candidate.message.role == Role::Assistant
                        && wanted
                            .iter()
                            .any(|id| candidate.message.makes_tool_call(id))
                    {
                        start = candidate.sequence;
                        break 'scan;
                    }
                }
                before = last.sequence;
            }
        }
        Ok(ExportStart { after: start - 1 })
    }
}
