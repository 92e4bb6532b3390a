//! Read-ahead for long streams (ExportHistory, ExportTranscript, the
//! replay of WatchSession), bounded in bytes: per stream by
//! [`READ_AHEAD_BYTES`], and over all streams by a [`StreamBudget`]
//! (`--max-stream-buffer-bytes`).
//!
//! A stream reads its rows a page at a time, ahead of what it sends, so
//! reading overlaps with sending. A reader that stops reading stops the
//! stream at its next item; what it pins is what was read ahead, so that
//! is bounded in bytes (the stored bodies' sizes) and not only in rows: a
//! page stops before a row that would take it past its byte allowance
//! (always at least one row, so a stream progresses whatever its messages'
//! size), and no read starts while the stream holds [`READ_AHEAD_BYTES`].
//! Small messages still read in pages of [`RANGE_ROWS`] rows.
//!
//! Every byte read ahead is reserved from the server's [`StreamBudget`]
//! and given back as the row is handed on. A new stream is admitted only
//! if its [`MIN_SHARE`] fits in the budget; a running stream keeps its
//! share and reads less far ahead when the budget has nothing more to give.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::future::BoxFuture;
use tokio::task::JoinHandle;

use crate::domain::{Error, Result};
use crate::store::{Page, ReadBound};

/// Stored bytes one read asks for at most.
pub const PAGE_BYTES: usize = 1024 * 1024;
/// Stored bytes a stream holds read ahead (rows read and not yet handed
/// on, and the allowances of its reads in flight) before it stops
/// starting reads. The read of the next row to hand on may take it past
/// this by one row.
pub const READ_AHEAD_BYTES: usize = 2 * 1024 * 1024;
/// What a stream reserves from the budget when it opens, and keeps until
/// it ends: a new stream that cannot get it is refused.
pub const MIN_SHARE: usize = 256 * 1024;
/// Rows one read asks for at most; also the width of an export's
/// sequence ranges.
pub const RANGE_ROWS: usize = 256;
/// Ranges read at once by a stream that knows where it ends.
const READS_AT_ONCE: usize = 2;
/// A read behind the next one to hand on starts only with this much room.
const MIN_READ: usize = 64 * 1024;
/// The size a row is assumed to have before any has been read: the first
/// reads ask for `allowance / FIRST_ROW_ESTIMATE` rows, so PostgreSQL does
/// not ship many large rows that the byte bound would discard.
const FIRST_ROW_ESTIMATE: usize = 32 * 1024;

/// The bytes all streams of the server may hold read ahead.
#[derive(Debug)]
pub struct StreamBudget {
    limit: usize,
    used: AtomicUsize,
}

impl StreamBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(StreamBudget {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    /// Bytes reserved now, over all streams.
    pub fn buffered(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The share of a new stream, or `LimitExceeded` if the budget cannot
    /// hold it.
    pub fn admit(self: &Arc<Self>) -> Result<Share> {
        if self.grow(MIN_SHARE, MIN_SHARE) == 0 {
            return Err(Error::LimitExceeded {
                field: "session_id".into(),
                limit: "max_stream_buffer_bytes",
                description: format!(
                    "the server's streams already hold {} of the {} bytes they may read ahead \
                     (--max-stream-buffer-bytes); retry later",
                    self.buffered(),
                    self.limit
                ),
            });
        }
        Ok(self.share_of(MIN_SHARE))
    }

    /// The share of a stream that is already running (a watcher going
    /// back to the log): reserved even past the limit, so it progresses.
    pub fn share(self: &Arc<Self>) -> Share {
        self.used.fetch_add(MIN_SHARE, Ordering::Relaxed);
        self.share_of(MIN_SHARE)
    }

    fn share_of(self: &Arc<Self>, reserved: usize) -> Share {
        Share {
            budget: Arc::clone(self),
            reserved,
            in_use: 0,
        }
    }

    /// Reserves up to `want` bytes, but only if at least `least` fit;
    /// how many were reserved.
    fn grow(&self, want: usize, least: usize) -> usize {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let free = self.limit.saturating_sub(used);
            let take = want.min(free);
            if take == 0 || take < least {
                return 0;
            }
            match self.used.compare_exchange_weak(
                used,
                used + take,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return take,
                Err(now) => used = now,
            }
        }
    }
}

/// One stream's reservation from the [`StreamBudget`]: at least
/// [`MIN_SHARE`] for its life, more while it holds more. Dropping it gives
/// everything back.
#[derive(Debug)]
pub struct Share {
    budget: Arc<StreamBudget>,
    /// Reserved from the budget: at least `MIN_SHARE` and `in_use`.
    reserved: usize,
    /// Held by the stream's read-ahead.
    in_use: usize,
}

impl Share {
    /// Bytes the stream holds.
    pub fn in_use(&self) -> usize {
        self.in_use
    }

    /// Takes up to `want` bytes: from the share first, then from the
    /// budget if it has them; how many were taken.
    fn take(&mut self, want: usize) -> usize {
        let free = self.reserved - self.in_use;
        let grown = if want > free {
            self.budget.grow(want - free, 1)
        } else {
            0
        };
        self.reserved += grown;
        let taken = want.min(free + grown);
        self.in_use += taken;
        taken
    }

    /// Takes `bytes` whether or not the budget has them (a row the stream
    /// must read to progress).
    fn force(&mut self, bytes: usize) {
        self.in_use += bytes;
        if self.in_use > self.reserved {
            self.budget
                .used
                .fetch_add(self.in_use - self.reserved, Ordering::Relaxed);
            self.reserved = self.in_use;
        }
    }

    /// Gives back `bytes` the stream no longer holds; the budget gets back
    /// what the share does not need.
    fn give_back(&mut self, bytes: usize) {
        self.in_use = self.in_use.saturating_sub(bytes);
        let keep = self.in_use.max(MIN_SHARE);
        if self.reserved > keep {
            self.budget
                .used
                .fetch_sub(self.reserved - keep, Ordering::Relaxed);
            self.reserved = keep;
        }
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.reserved, Ordering::Relaxed);
    }
}

/// Reads one page: rows with a key after the first argument, within the
/// bound.
pub type ReadPage<T> =
    Arc<dyn Fn(i64, ReadBound) -> BoxFuture<'static, Result<Page<T>>> + Send + Sync>;

/// Where a reader's rows end.
#[derive(Clone, Copy, Debug)]
enum Extent {
    /// Keys below this one, read as fixed ranges of `RANGE_ROWS` keys,
    /// [`READS_AT_ONCE`] at a time (the next range's read does not wait
    /// for the previous one's last row).
    Before(i64),
    /// The end of the log: page after page, each read starting after the
    /// previous page's last row, until a page comes back short.
    Open,
}

/// One read, in the order its rows are handed on.
struct Slot<T> {
    /// Keys after this one…
    after: i64,
    /// …up to this one (inclusive).
    through: i64,
    read: Option<Reading<T>>,
}

struct Reading<T> {
    handle: JoinHandle<Result<Page<T>>>,
    bound: ReadBound,
}

/// A stream's rows, read ahead within its byte bounds; see the module notes.
pub struct ReadAhead<T> {
    read: ReadPage<T>,
    key: fn(&T) -> i64,
    share: Share,
    extent: Extent,
    /// Rows read and not yet handed on, with their sizes.
    ready: VecDeque<(T, usize)>,
    slots: VecDeque<Slot<T>>,
    /// The start of the next range to queue (`Extent::Before` only).
    next_range: Option<i64>,
    /// Rows and bytes seen so far, to size the next reads.
    seen_rows: usize,
    seen_bytes: usize,
}

impl<T: Send + 'static> ReadAhead<T> {
    /// Rows with keys after `after` and below `end`, in fixed ranges.
    pub fn ranges(
        read: ReadPage<T>,
        key: fn(&T) -> i64,
        share: Share,
        after: i64,
        end: i64,
    ) -> Self {
        let mut reader = Self::new(read, key, share, Extent::Before(end));
        reader.next_range = (after.saturating_add(1) < end).then_some(after);
        reader
    }

    /// Rows with keys after `after`, to the end of the log as it is when
    /// each page is read.
    pub fn to_end(read: ReadPage<T>, key: fn(&T) -> i64, share: Share, after: i64) -> Self {
        let mut reader = Self::new(read, key, share, Extent::Open);
        reader.slots.push_back(Slot {
            after,
            through: i64::MAX,
            read: None,
        });
        reader
    }

    fn new(read: ReadPage<T>, key: fn(&T) -> i64, share: Share, extent: Extent) -> Self {
        ReadAhead {
            read,
            key,
            share,
            extent,
            ready: VecDeque::new(),
            slots: VecDeque::new(),
            next_range: None,
            seen_rows: 0,
            seen_bytes: 0,
        }
    }

    /// The next row, or `None` after the last.
    pub async fn next(&mut self) -> Result<Option<T>> {
        loop {
            if let Some((item, size)) = self.ready.pop_front() {
                self.share.give_back(size);
                self.top_up();
                return Ok(Some(item));
            }
            self.top_up();
            let Some(slot) = self.slots.pop_front() else {
                return Ok(None);
            };
            let reading = match slot.read {
                Some(reading) => reading,
                // `top_up` starts the first slot's read when nothing is
                // ready; this is only a fallback.
                None => self.start(slot.after, 0, true),
            };
            let page = reading.handle.await.map_err(Error::storage)??;
            self.arrived(slot.after, slot.through, reading.bound, page);
        }
    }

    /// Queues the next ranges and starts the reads that fit.
    fn top_up(&mut self) {
        if let Extent::Before(end) = self.extent {
            while self.slots.len() < READS_AT_ONCE
                && let Some(after) = self.next_range
            {
                let through = after.saturating_add(RANGE_ROWS as i64).min(end - 1);
                self.slots.push_back(Slot {
                    after,
                    through,
                    read: None,
                });
                self.next_range = (through < end - 1).then_some(through);
            }
        }
        for index in 0..self.slots.len() {
            if self.slots[index].read.is_some() {
                continue;
            }
            // The read of the next row to hand on always starts; it may
            // bring one row over the stream's bound.
            let first = index == 0 && self.ready.is_empty();
            let room = READ_AHEAD_BYTES
                .saturating_sub(self.share.in_use())
                .min(PAGE_BYTES);
            if !first && room < MIN_READ {
                return;
            }
            let granted = self.share.take(room);
            if !first && granted < MIN_READ {
                self.share.give_back(granted);
                return;
            }
            let slot = &self.slots[index];
            let (after, through) = (slot.after, slot.through);
            let mut reading = self.start(after, granted, first);
            reading.bound.rows = reading
                .bound
                .rows
                .min(usize::try_from(through.saturating_sub(after)).unwrap_or(usize::MAX));
            self.slots[index].read = Some(reading);
        }
    }

    /// Starts a read after `after` of up to `allowance` bytes (taken from
    /// the share).
    fn start(&self, after: i64, allowance: usize, at_least_one: bool) -> Reading<T> {
        let estimate = self
            .seen_bytes
            .checked_div(self.seen_rows)
            .map_or(FIRST_ROW_ESTIMATE, |average| average.max(1));
        let bound = ReadBound {
            rows: (allowance / estimate + 1).min(RANGE_ROWS),
            bytes: allowance,
            at_least_one,
        };
        Reading {
            handle: tokio::spawn((self.read)(after, bound)),
            bound,
        }
    }

    /// Takes a page read for `after..=through` under `bound`: its rows
    /// become ready, and what the range still lacks is read next.
    fn arrived(&mut self, after: i64, through: i64, bound: ReadBound, page: Page<T>) {
        let Page { mut rows, cut } = page;
        let returned = rows.len();
        let mut past = false;
        while rows
            .last()
            .is_some_and(|(row, _)| (self.key)(row) > through)
        {
            rows.pop();
            past = true;
        }
        let bytes: usize = rows.iter().map(|(_, size)| size).sum();
        if bytes > bound.bytes {
            self.share.force(bytes - bound.bytes);
        } else {
            self.share.give_back(bound.bytes - bytes);
        }
        self.seen_rows += rows.len();
        self.seen_bytes += bytes;
        let last = rows.last().map(|(row, _)| (self.key)(row));
        let complete =
            past || (!cut && returned < bound.rows) || last.is_some_and(|last| last >= through);
        if !complete {
            self.slots.push_front(Slot {
                after: last.unwrap_or(after),
                through,
                read: None,
            });
        }
        self.ready.extend(rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_is_refused_only_when_the_budget_is_full() -> crate::domain::Result<()> {
        let budget = StreamBudget::new(MIN_SHARE * 2);
        let mut first = budget.admit()?;
        let second = budget.admit()?;
        assert!(budget.admit().is_err());
        // Growth past the budget gets nothing more; forcing still works.
        assert_eq!(first.take(MIN_SHARE * 2), MIN_SHARE);
        first.force(MIN_SHARE);
        assert_eq!(budget.buffered(), MIN_SHARE * 3);
        first.give_back(MIN_SHARE * 2);
        assert_eq!(budget.buffered(), MIN_SHARE * 2);
        drop(first);
        drop(second);
        assert_eq!(budget.buffered(), 0);
        assert!(budget.admit().is_ok());
        Ok(())
    }

    /// A table of `(key, size)` rows, read as a store would.
    fn table(rows: Vec<(i64, usize)>) -> ReadPage<(i64, usize)> {
        let rows = Arc::new(rows);
        Arc::new(move |after, bound: ReadBound| {
            let rows = Arc::clone(&rows);
            Box::pin(async move {
                let mut page = Page {
                    rows: Vec::new(),
                    cut: false,
                };
                let mut bytes = 0;
                for &(key, size) in rows.iter().filter(|(key, _)| *key > after) {
                    if page.rows.len() == bound.rows {
                        break;
                    }
                    if !bound.admits(page.rows.len(), bytes, size) {
                        page.cut = true;
                        break;
                    }
                    bytes += size;
                    page.rows.push(((key, size), size));
                }
                Ok(page)
            })
        })
    }

    async fn drain(
        mut reader: ReadAhead<(i64, usize)>,
        budget: &StreamBudget,
    ) -> crate::domain::Result<(Vec<i64>, usize)> {
        let (mut keys, mut most) = (Vec::new(), 0);
        while let Some((key, _)) = reader.next().await? {
            keys.push(key);
            most = most.max(budget.buffered());
        }
        Ok((keys, most))
    }

    #[tokio::test]
    async fn rows_arrive_once_in_order_within_the_bound() -> crate::domain::Result<()> {
        for size in [100, 200 * 1024, 3 * 1024 * 1024] {
            let rows: Vec<(i64, usize)> =
                (0..700).filter(|k| k % 7 != 3).map(|k| (k, size)).collect();
            let expected: Vec<i64> = rows.iter().map(|(k, _)| *k).filter(|k| *k < 650).collect();
            let budget = StreamBudget::new(usize::MAX);
            let share = budget.admit()?;
            let reader = ReadAhead::ranges(table(rows.clone()), |row| row.0, share, -1, 650);
            let (keys, most) = drain(reader, &budget).await?;
            assert_eq!(keys, expected, "rows of {size} bytes");
            assert!(
                most <= READ_AHEAD_BYTES + size,
                "{most} bytes held with rows of {size}"
            );
            assert_eq!(budget.buffered(), 0);

            let share = budget.admit()?;
            let reader = ReadAhead::to_end(table(rows.clone()), |row| row.0, share, 10);
            let (keys, most) = drain(reader, &budget).await?;
            let expected: Vec<i64> = rows.iter().map(|(k, _)| *k).filter(|k| *k > 10).collect();
            assert_eq!(keys, expected, "rows of {size} bytes to the end");
            assert!(
                most <= READ_AHEAD_BYTES + size,
                "{most} bytes held with rows of {size}"
            );
        }
        Ok(())
    }

    #[tokio::test]
    async fn a_stream_progresses_on_its_share_alone() -> crate::domain::Result<()> {
        let rows: Vec<(i64, usize)> = (0..50).map(|k| (k, 300 * 1024)).collect();
        let budget = StreamBudget::new(MIN_SHARE);
        let share = budget.admit()?;
        let reader = ReadAhead::ranges(table(rows), |row| row.0, share, -1, 50);
        let (keys, _) = drain(reader, &budget).await?;
        assert_eq!(keys, (0..50).collect::<Vec<_>>());
        Ok(())
    }
}
