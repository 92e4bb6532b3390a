//! Active runs' partial output, kept so that a watcher who joins or
//! reconnects mid-run gets everything published so far.
//!
//! Nothing is dropped: when a run holds `merge_after` deltas, consecutive
//! text deltas are merged into one (`merged_from..=index`), and block
//! deltas stay as published. What bounds memory is bytes: a run's output
//! (`max_run_bytes`, refused to its producer past it) and the output of all
//! runs together (`max_total_bytes`). A replica buffers what other
//! replicas' producers published too; their own replica has admitted it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::domain::{DeltaContent, Ephemeral, EphemeralKind, Error, Result};

/// Bytes counted per buffered delta beside its payload (the allocation
/// and its bookkeeping), so many tiny deltas are bounded too.
const DELTA_OVERHEAD: usize = 96;
/// The most runs buffered at once, over all sessions.
const MAX_RUNS: usize = 10_000;
/// The most text one merged delta holds: watchers' clients take messages
/// of a few MiB at most, so a long run is kept as several merged deltas.
const MAX_MERGED_BYTES: usize = 1024 * 1024;

/// How much partial output is kept.
#[derive(Clone, Copy, Debug)]
pub struct RunLimits {
    /// Deltas a run keeps before consecutive text deltas are merged.
    pub merge_after: usize,
    /// The most output bytes one run may publish.
    pub max_run_bytes: usize,
    /// The most bytes all buffered runs may hold together.
    pub max_total_bytes: usize,
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits {
            merge_after: 1024,
            max_run_bytes: 64 * 1024 * 1024,
            max_total_bytes: 1024 * 1024 * 1024,
        }
    }
}

/// One run's deltas so far, in index order, none overlapping.
struct RunBuffer {
    deltas: Vec<Arc<Ephemeral>>,
    /// Payload bytes published (the hard limit counts these).
    output: usize,
    /// Bytes held, overhead included (the server-wide bound counts these).
    held: usize,
    /// Merge when this many deltas are held (grows when merging cannot
    /// shrink the buffer, e.g. many block deltas).
    merge_at: usize,
    touched: Instant,
}

/// Every buffered run, by session key and run id.
pub(super) struct Runs {
    sessions: HashMap<i64, HashMap<String, RunBuffer>>,
    runs: usize,
    held: usize,
    limits: RunLimits,
}

/// A delta's first and last index.
fn span(ephemeral: &Ephemeral) -> (i64, i64) {
    match &ephemeral.kind {
        EphemeralKind::Delta {
            index, merged_from, ..
        } => (merged_from.unwrap_or(*index), *index),
        EphemeralKind::RunDiscarded { .. } => (i64::MIN, i64::MIN),
    }
}

fn payload(ephemeral: &Ephemeral) -> usize {
    match &ephemeral.kind {
        EphemeralKind::Delta { content, .. } => content.size(),
        EphemeralKind::RunDiscarded { .. } => 0,
    }
}

impl Runs {
    pub(super) fn new(limits: RunLimits) -> Self {
        Runs {
            sessions: HashMap::new(),
            runs: 0,
            held: 0,
            limits,
        }
    }

    /// Bytes held by all buffered runs.
    pub(super) fn held(&self) -> usize {
        self.held
    }

    /// Whether a delta of `size` bytes for `run_id` may be published here:
    /// RESOURCE_EXHAUSTED past the run's limit or the server's.
    pub(super) fn check_room(&self, session_key: i64, run_id: &str, size: usize) -> Result<()> {
        let run = self
            .sessions
            .get(&session_key)
            .and_then(|session| session.get(run_id));
        let output = run.map_or(0, |run| run.output);
        if output + size > self.limits.max_run_bytes {
            return Err(Error::LimitExceeded {
                field: "text".into(),
                limit: "max_run_output_bytes",
                description: format!(
                    "the run's partial output would pass {} bytes; store it with AppendExchange \
                     (its deltas so far stay available)",
                    self.limits.max_run_bytes
                ),
            });
        }
        if self.held + size + DELTA_OVERHEAD > self.limits.max_total_bytes
            || (run.is_none() && self.runs >= MAX_RUNS)
        {
            return Err(Error::LimitExceeded {
                field: "text".into(),
                limit: "max_active_run_bytes",
                description: "the server holds as much partial output of active runs as it may; \
                              retry once runs end"
                    .into(),
            });
        }
        Ok(())
    }

    /// Whether the run has buffered output here (it is publishing).
    pub(super) fn is_open(&self, session_key: i64, run_id: &str) -> bool {
        self.sessions
            .get(&session_key)
            .is_some_and(|session| session.contains_key(run_id))
    }

    /// Keeps a published delta (a repeated index is kept once).
    pub(super) fn add(&mut self, session_key: i64, delta: &Arc<Ephemeral>) {
        let EphemeralKind::Delta { run_id, .. } = &delta.kind else {
            return;
        };
        let session = self.sessions.entry(session_key).or_default();
        let run = session.entry(run_id.clone()).or_insert_with(|| {
            self.runs += 1;
            RunBuffer {
                deltas: Vec::new(),
                output: 0,
                held: 0,
                merge_at: self.limits.merge_after.max(2),
                touched: Instant::now(),
            }
        });
        run.touched = Instant::now();
        let (first, last) = span(delta);
        // Usually the next index; a retried or reordered one finds its place.
        let at = run.deltas.partition_point(|held| span(held).1 < first);
        if run.deltas.get(at).is_some_and(|held| span(held).0 <= last) {
            return;
        }
        let size = payload(delta);
        run.deltas.insert(at, Arc::clone(delta));
        run.output += size;
        run.held += size + DELTA_OVERHEAD;
        self.held += size + DELTA_OVERHEAD;
        if run.deltas.len() >= run.merge_at {
            let before = run.held;
            merge_text(&mut run.deltas);
            run.held = run.deltas.iter().map(|d| payload(d) + DELTA_OVERHEAD).sum();
            self.held = self.held - before + run.held;
            run.merge_at = run.merge_at.max(run.deltas.len() * 2);
        }
    }

    /// The buffered deltas of every run of a session, run by run.
    pub(super) fn deltas(&self, session_key: i64) -> Vec<Arc<Ephemeral>> {
        self.sessions
            .get(&session_key)
            .into_iter()
            .flat_map(|session| session.values())
            .flat_map(|run| run.deltas.iter().cloned())
            .collect()
    }

    /// Forgets a run (its exchange was stored, it ended, or was discarded).
    pub(super) fn close(&mut self, session_key: i64, run_id: &str) {
        let Some(session) = self.sessions.get_mut(&session_key) else {
            return;
        };
        if let Some(run) = session.remove(run_id) {
            self.runs -= 1;
            self.held -= run.held;
        }
        if session.is_empty() {
            self.sessions.remove(&session_key);
        }
    }

    /// Forgets every run of a session (it was deleted).
    pub(super) fn close_session(&mut self, session_key: i64) {
        if let Some(session) = self.sessions.remove(&session_key) {
            self.runs -= session.len();
            self.held -= session.values().map(|run| run.held).sum::<usize>();
        }
    }

    /// Forgets runs with no delta for `max_idle` (a producer that died
    /// without storing or discarding its output).
    pub(super) fn prune(&mut self, max_idle: Duration) {
        let (mut runs, mut held) = (0, 0);
        for session in self.sessions.values_mut() {
            session.retain(|_, run| {
                let keep = run.touched.elapsed() < max_idle;
                if !keep {
                    runs += 1;
                    held += run.held;
                }
                keep
            });
        }
        self.sessions.retain(|_, session| !session.is_empty());
        self.runs -= runs;
        self.held -= held;
    }
}

/// Merges each stretch of consecutive text deltas into one delta covering
/// their indexes; block deltas stay as they are.
fn merge_text(deltas: &mut Vec<Arc<Ephemeral>>) {
    let mut merged: Vec<Arc<Ephemeral>> = Vec::with_capacity(deltas.len());
    for delta in deltas.drain(..) {
        let joins = match (merged.last().map(|last| &last.kind), &delta.kind) {
            (
                Some(EphemeralKind::Delta {
                    content: DeltaContent::Text(text),
                    index: last,
                    ..
                }),
                EphemeralKind::Delta {
                    content: DeltaContent::Text(more),
                    ..
                },
            ) => span(&delta).0 == last + 1 && text.len() + more.len() <= MAX_MERGED_BYTES,
            _ => false,
        };
        let Some(into) = merged.last_mut().filter(|_| joins) else {
            merged.push(delta);
            continue;
        };
        let into = Arc::make_mut(into);
        into.revision = into.revision.max(delta.revision);
        into.time = delta.time;
        if let (
            EphemeralKind::Delta {
                index,
                merged_from,
                content: DeltaContent::Text(text),
                ..
            },
            EphemeralKind::Delta {
                index: next,
                content: DeltaContent::Text(more),
                ..
            },
        ) = (&mut into.kind, &delta.kind)
        {
            merged_from.get_or_insert(*index);
            *index = *next;
            text.push_str(more);
        }
    }
    *deltas = merged;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{ContentBlock, Timestamp};

    fn delta(index: i64, content: DeltaContent) -> Arc<Ephemeral> {
        Arc::new(Ephemeral {
            revision: 3,
            time: Timestamp(0),
            kind: EphemeralKind::Delta {
                run_id: "r".into(),
                index,
                merged_from: None,
                content,
            },
        })
    }

    fn text(index: i64, text: &str) -> Arc<Ephemeral> {
        delta(index, DeltaContent::Text(text.into()))
    }

    fn block(index: i64) -> Arc<Ephemeral> {
        let block = ContentBlock::Text {
            text: "b".into(),
            signature: String::new(),
        };
        delta(index, DeltaContent::Block(block))
    }

    fn shape(runs: &Runs) -> Vec<(i64, i64, String)> {
        runs.deltas(1)
            .iter()
            .map(|d| {
                let (first, last) = span(d);
                let body = match &d.kind {
                    EphemeralKind::Delta {
                        content: DeltaContent::Text(t),
                        ..
                    } => t.clone(),
                    _ => "[block]".into(),
                };
                (first, last, body)
            })
            .collect()
    }

    fn limits(merge_after: usize) -> RunLimits {
        RunLimits {
            merge_after,
            ..RunLimits::default()
        }
    }

    #[test]
    fn text_merges_around_blocks_and_nothing_is_lost() {
        let mut runs = Runs::new(limits(4));
        for (i, d) in [text(0, "a"), text(1, "b"), block(2), text(3, "c")]
            .iter()
            .enumerate()
        {
            assert_eq!(runs.deltas(1).len(), i);
            runs.add(1, d);
        }
        assert_eq!(
            shape(&runs),
            vec![
                (0, 1, "ab".into()),
                (2, 2, "[block]".into()),
                (3, 3, "c".into())
            ]
        );
        // Merging could not shrink the buffer below half its bound: the
        // next merge waits for twice as many deltas.
        for (i, t) in ["d", "e", "f"].into_iter().enumerate() {
            assert_eq!(runs.deltas(1).len(), 3 + i);
            runs.add(1, &text(4 + i as i64, t));
        }
        assert_eq!(
            shape(&runs),
            vec![
                (0, 1, "ab".into()),
                (2, 2, "[block]".into()),
                (3, 6, "cdef".into())
            ]
        );
    }

    #[test]
    fn repeated_and_reordered_indexes_find_their_place_once() {
        let mut runs = Runs::new(limits(100));
        for d in [
            text(0, "a"),
            text(2, "c"),
            text(1, "b"),
            text(2, "c"),
            text(0, "a"),
        ] {
            runs.add(1, &d);
        }
        let bodies: Vec<String> = shape(&runs).into_iter().map(|(_, _, b)| b).collect();
        assert_eq!(bodies, ["a", "b", "c"]);
    }

    #[test]
    fn bytes_are_counted_and_released() {
        let mut runs = Runs::new(RunLimits {
            merge_after: 2,
            max_run_bytes: 10,
            max_total_bytes: 1 << 20,
        });
        runs.add(1, &text(0, "12345"));
        runs.add(1, &text(1, "678"));
        assert!(runs.held() > 8);
        assert!(runs.check_room(1, "r", 2).is_ok());
        assert!(matches!(
            runs.check_room(1, "r", 3),
            Err(Error::LimitExceeded {
                limit: "max_run_output_bytes",
                ..
            })
        ));
        assert!(runs.is_open(1, "r"));
        runs.close(1, "r");
        assert_eq!(runs.held(), 0);
        assert!(!runs.is_open(1, "r"));
    }
}
