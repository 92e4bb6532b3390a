//! Cost that does not grow with size: an append to a session of
//! 1,000,000 messages against an append to a session of 10, and
//! ListSessions pages in a tenant of 1,000,000 sessions.
//!
//! Everything is written straight into the database ([`history`]): the
//! long session as 500,000 exchanges of a user message, a provider call
//! and the answer it produced, the tenant's other sessions as created and
//! never appended to. Through the API the fill would take most of an hour.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use sessionstore_client::{Client, Exchange, RetryPolicy};

use crate::history::{self, Chat};
use crate::server::{Database, Server};
use crate::workload;

/// How much there is.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Messages in the long session (two per exchange).
    pub long_messages: usize,
    /// Messages in the short one.
    pub short_messages: usize,
    /// Sessions in the tenant besides those two.
    pub sessions: usize,
}

/// What the fill wrote.
pub struct Written {
    pub long: Chat,
    pub short: Chat,
    /// The tenant's newest other session (and its user's newest).
    pub newest: Chat,
    pub sessions: usize,
}

/// Writes the tenant into a migrated, empty `db`: `shape.sessions`
/// sessions created over the last 90 days (1,000 users), then the long
/// session (an exchange every 9 s over the last 60 days) and the short
/// one (five exchanges a minute apart, yesterday).
pub async fn fill(db: &Database, shape: &Shape) -> anyhow::Result<Written> {
    let now = workload::now_micros();
    let day = 86_400 * 1_000_000_i64;
    let gap = 90 * day / shape.sessions.max(1) as i64;
    let sessions: Vec<Chat> = (0..shape.sessions)
        .map(|n| Chat {
            key: n as i64 + 1,
            id: format!("bench-scale-{n:07}"),
            user: format!("user-{:04}", n % 1000),
            title: format!("scale bench {n}"),
            exchanges: 0,
            create_time: now - 90 * day + n as i64 * gap,
            step: 0,
            seed: n as u64,
        })
        .collect();
    let newest = sessions.last().cloned().context("no sessions to fill")?;
    history::write(db, sessions, 20_000, "the tenant's sessions").await?;
    let long_exchanges = shape.long_messages / 2;
    let long = Chat {
        key: shape.sessions as i64 + 1,
        id: "bench-scale-long".to_owned(),
        user: "bench-scale-long-user".to_owned(),
        title: "a very long chat".to_owned(),
        exchanges: long_exchanges,
        create_time: now - 61 * day,
        step: 60 * day / long_exchanges.max(1) as i64,
        seed: 1 << 40,
    };
    let short = Chat {
        key: shape.sessions as i64 + 2,
        id: "bench-scale-short".to_owned(),
        user: "bench-scale-short-user".to_owned(),
        title: "a short chat".to_owned(),
        exchanges: shape.short_messages / 2,
        create_time: now - day,
        step: 60_000_000,
        seed: 2 << 40,
    };
    history::write(
        db,
        vec![long.clone(), short.clone()],
        2_000,
        "the long and the short session",
    )
    .await?;
    Ok(Written {
        long,
        short,
        newest,
        sessions: shape.sessions,
    })
}

/// `samples` appends to each of the two sessions from one client, one at
/// a time, alternating long and short so that drift falls on both alike,
/// after a tenth as many unmeasured. Each is the bench's exchange (a user
/// and an assistant message of 1 KB and a provider call) through the
/// client crate (retries off), with `expected_next_sequence` set, so the
/// server checks the filled counter on every append. Answers the long
/// session's times, then the short one's.
pub async fn appends(
    server: &Server,
    written: &Written,
    samples: usize,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let client = Client::builder(server.endpoint())
        .retry_policy(RetryPolicy::never())
        .connect()
        .await
        .context("connect the client")?;
    let mut next = [written.long.messages(), written.short.messages()];
    let ids = [written.long.id.as_str(), written.short.id.as_str()];
    let mut took = [Vec::with_capacity(samples), Vec::with_capacity(samples)];
    let warmup = (samples / 10).max(1);
    for i in 0..2 * (warmup + samples) {
        let which = i % 2;
        let exchange = Exchange::from(workload::exchange(ids[which], i as u64))
            .expected_next_sequence(next[which]);
        let started = Instant::now();
        let answer = client
            .append_exchange(&exchange)
            .await
            .with_context(|| format!("AppendExchange to {}", ids[which]))?;
        let elapsed = started.elapsed();
        anyhow::ensure!(
            answer.next_sequence == next[which] + 2,
            "an append to {} answered next_sequence {}, expected {}",
            ids[which],
            answer.next_sequence,
            next[which] + 2
        );
        next[which] += 2;
        if i >= 2 * warmup {
            took[which].push(elapsed);
        }
    }
    let [long, short] = took;
    Ok((long, short))
}
