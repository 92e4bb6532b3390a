//! EraseUser of a user with many sessions while other users keep
//! appending: how long the erasure takes, and how long it holds up the
//! appends of everyone else (it is many short transactions so that it
//! never holds the writer for long: SQLite has one writer for every
//! tenant).
//!
//! The erased user's sessions are written straight into the database
//! ([`history`]); the writers' sessions are created and appended to
//! through the API.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use sessionstore_client::v1 as pb;
use sessionstore_client::{Client, Exchange, RetryPolicy};

use crate::history::{self, Chat, Reader};
use crate::server::{Database, Server};
use crate::workload;

/// The user erased.
pub const USER: &str = "bench-erased-user";

/// Exchanges of two messages and a provider call in each of the erased
/// user's sessions.
pub const EXCHANGES_EACH: usize = 2;

/// How much there is, and who writes meanwhile.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// The erased user's sessions.
    pub sessions: usize,
    /// Concurrent clients appending to sessions of their own.
    pub writers: usize,
    /// Exchanges appended to each writer's session before measuring.
    pub prefill: usize,
    /// How long the writers append unmeasured, then measured without an
    /// erasure running.
    pub warmup: Duration,
    pub baseline: Duration,
}

/// What the fill wrote.
pub struct Written {
    pub chats: Vec<Chat>,
    pub messages: i64,
    pub calls: i64,
    /// The erased sessions' keys, `first..=last`.
    pub first_key: i64,
    pub last_key: i64,
}

/// Writes the erased user's sessions into a migrated, empty `db`: keys
/// from 1, created over the last 30 days, two exchanges each, a minute
/// apart.
pub async fn fill(db: &Database, shape: &Shape) -> anyhow::Result<Written> {
    let now = workload::now_micros();
    let span = 30 * 86_400 * 1_000_000_i64;
    let start = now - span;
    let gap = span / shape.sessions.max(1) as i64;
    let chats: Vec<Chat> = (0..shape.sessions)
        .map(|n| Chat {
            key: n as i64 + 1,
            id: format!("bench-erase-{n:06}"),
            user: USER.to_owned(),
            title: format!("erase bench {n}"),
            exchanges: EXCHANGES_EACH,
            create_time: start + n as i64 * gap,
            step: 60_000_000,
            seed: n as u64,
        })
        .collect();
    history::write(db, chats.clone(), 2_000, "erased user's sessions").await?;
    let messages = chats.iter().map(Chat::messages).sum();
    Ok(Written {
        messages,
        calls: messages / 2,
        first_key: 1,
        last_key: chats.len() as i64,
        chats,
    })
}

/// Writes one session of [`USER`] with `exchanges` exchanges (two
/// messages and a provider call each) into a migrated, empty `db`, for
/// DeleteSession: key 1, a second between exchanges.
pub async fn fill_one(db: &Database, exchanges: usize) -> anyhow::Result<Written> {
    let step = 1_000_000_i64;
    let chat = Chat {
        key: 1,
        id: "bench-delete-long".to_owned(),
        user: USER.to_owned(),
        title: "delete bench".to_owned(),
        exchanges,
        create_time: workload::now_micros() - (exchanges as i64 + 1) * step,
        step,
        seed: 7,
    };
    history::write(db, vec![chat.clone()], 2_000, "the long session").await?;
    let messages = chat.messages();
    Ok(Written {
        chats: vec![chat],
        messages,
        calls: messages / 2,
        first_key: 1,
        last_key: 1,
    })
}

/// After DeleteSession: none of the session's messages, provider calls
/// or idempotency keys left, nor any event but its tombstone's last.
pub async fn check_deleted(db: &Database, written: &Written) -> anyhow::Result<String> {
    let mut reader = Reader::open(db).await?;
    let range = format!("BETWEEN {} AND {}", written.first_key, written.last_key);
    let mut left = Vec::new();
    for (table, allowed) in [
        ("messages", 0),
        ("provider_calls", 0),
        ("idempotency_keys", 0),
        ("events", 1),
    ] {
        let rows = reader
            .scalar(&format!(
                "SELECT count(*) FROM {table} WHERE session_key {range}"
            ))
            .await?;
        anyhow::ensure!(
            rows <= allowed,
            "{rows} rows of the deleted session are left in {table}"
        );
        left.push(format!("{rows} in {table}"));
    }
    reader.close().await;
    Ok(format!(
        "rows of the deleted session left: {}",
        left.join(", ")
    ))
}

/// The writers' sessions, one each (user `bench-writer-N`), with
/// `prefill` exchanges appended through the API.
pub async fn prepare_writers(server: &Server, shape: &Shape) -> anyhow::Result<Vec<String>> {
    let mut client = server.connect().await?;
    let mut ids = Vec::new();
    for writer in 0..shape.writers {
        let id = format!("bench-writer-{writer}");
        workload::create_session(&mut client, &id, &format!("bench-writer-{writer}"), 0, 0).await?;
        for n in 0..shape.prefill {
            client
                .append_exchange(workload::exchange(&id, n as u64))
                .await
                .with_context(|| format!("prefill {id}"))?;
        }
        ids.push(id);
    }
    Ok(ids)
}

/// Everything before a measured run: the writers' sessions
/// ([`prepare_writers`]), fresh statistics on the filled database, the
/// search index caught up with the fill, and `chat` read back as written.
/// Answers the writers' session ids.
pub async fn ready(
    server: &Server,
    db: &Database,
    shape: &Shape,
    chat: &Chat,
) -> anyhow::Result<Vec<String>> {
    let writers = prepare_writers(server, shape).await?;
    db.analyze().await?;
    crate::live::index_caught_up(server).await?;
    history::verify(server, chat).await?;
    Ok(writers)
}

/// What a measured run calls while the writers append.
#[derive(Clone, Debug)]
pub enum Op {
    /// EraseUser of [`USER`].
    EraseUser,
    /// DeleteSession of this session (one of [`USER`]'s).
    DeleteSession(String),
}

/// One append a writer made: when it started and how long it took.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub began: Instant,
    /// Until its answer, or its error.
    pub took: Duration,
    pub failed: bool,
}

/// Where the erasure was, read from the database every [`POLL`].
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub at: Duration,
    pub live: i64,
    pub tombstones: i64,
    pub messages: i64,
}

/// EraseUser calls made at most, when the earlier failed.
pub const ATTEMPTS: usize = 5;

/// How often one more client searches the writers' words while they
/// append (a search waits until every write before it is indexed).
pub const SEARCH_EVERY: Duration = Duration::from_millis(100);

/// How often the erasure's progress is read.
pub const POLL: Duration = Duration::from_millis(250);

/// What one measured run saw.
pub struct Run {
    /// Every append of every writer, from the start of the measured
    /// baseline on.
    pub samples: Vec<Sample>,
    pub baseline: (Instant, Instant),
    pub erasure: (Instant, Instant),
    /// The answer of the attempt that succeeded while the writers ran
    /// (EraseUser's counts; none for DeleteSession), or the last
    /// attempt's error.
    pub answer: Result<Option<pb::EraseUserResponse>, String>,
    /// Each failed attempt: when it ended (from the first call) and why.
    pub failed: Vec<(Duration, String)>,
    /// When no attempt succeeded while the writers ran: one more call
    /// once they have stopped, how long it took and its answer.
    pub after_writers: Option<(Duration, Result<Option<pb::EraseUserResponse>, String>)>,
    pub progress: Vec<Progress>,
    /// Appends the writers had acknowledged in all, and those that failed
    /// (with the first error).
    pub acknowledged: usize,
    pub failed_appends: usize,
    pub first_append_error: Option<String>,
    /// One client's SearchMessages, every [`SEARCH_EVERY`], from the
    /// start of the measured baseline on.
    pub searches: Vec<Sample>,
}

impl Run {
    /// "; N of the writers' appends failed (the first: …)", or nothing.
    pub fn failed_appends_note(&self) -> String {
        match &self.first_append_error {
            Some(error) => format!(
                "; {} of the writers' appends failed (the first: {error})",
                self.failed_appends
            ),
            None => String::new(),
        }
    }

    /// Appends started in the baseline window.
    pub fn baseline(&self) -> Vec<Duration> {
        started_in(&self.samples, self.baseline)
    }

    /// Searches started in the baseline window.
    pub fn searches_baseline(&self) -> Vec<Duration> {
        started_in(&self.searches, self.baseline)
    }

    /// Appends in flight at any time while EraseUser ran.
    pub fn during(&self) -> Vec<Sample> {
        in_flight(&self.samples, self.erasure)
    }

    /// Searches in flight at any time while EraseUser ran.
    pub fn searches_during(&self) -> Vec<Sample> {
        in_flight(&self.searches, self.erasure)
    }
}

fn started_in(samples: &[Sample], (from, until): (Instant, Instant)) -> Vec<Duration> {
    samples
        .iter()
        .filter(|s| s.began >= from && s.began < until)
        .map(|s| s.took)
        .collect()
}

fn in_flight(samples: &[Sample], (from, until): (Instant, Instant)) -> Vec<Sample> {
    samples
        .iter()
        .filter(|s| s.began < until && s.began + s.took > from)
        .copied()
        .collect()
}

/// The writers append continuously (each to its own session, through the
/// client crate, retries off): `warmup`, then the `baseline` window, then
/// `op` is called while they go on; they stop once it has answered.
pub async fn measure(
    server: &Server,
    db: &Database,
    written: &Written,
    writers: &[String],
    shape: &Shape,
    op: Op,
) -> anyhow::Result<Run> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = tokio::task::JoinSet::new();
    for (n, id) in writers.iter().enumerate() {
        let client = Client::builder(server.endpoint())
            .retry_policy(RetryPolicy::never())
            .connect()
            .await
            .context("connect a writer")?;
        let (id, stop) = (id.clone(), Arc::clone(&stop));
        tasks.spawn(async move {
            let mut samples = Vec::new();
            let mut errors = Vec::new();
            let mut seed = (n as u64) << 32;
            while !stop.load(Ordering::Acquire) {
                seed += 1;
                let exchange = Exchange::from(workload::exchange(&id, seed));
                let began = Instant::now();
                // A failed append is counted and reported, and the writer
                // goes on (with its client's own 30 s request timeout).
                let failed = match client.append_exchange(&exchange).await {
                    Ok(_) => false,
                    Err(error) => {
                        errors.push(format!("{error}"));
                        true
                    }
                };
                samples.push(Sample {
                    began,
                    took: began.elapsed(),
                    failed,
                });
            }
            (samples, errors)
        });
    }
    let searcher = {
        let mut client = server.connect().await?;
        let stop = Arc::clone(&stop);
        // A word of the writers' texts.
        let word = workload::text(1, 40)
            .split(' ')
            .next()
            .unwrap_or("ka")
            .to_owned();
        tokio::spawn(async move {
            let mut samples = Vec::new();
            while !stop.load(Ordering::Acquire) {
                let began = Instant::now();
                let searched = client
                    .search_messages(pb::SearchMessagesRequest {
                        query: word.clone(),
                        page_size: 10,
                        ..Default::default()
                    })
                    .await;
                samples.push(Sample {
                    began,
                    took: began.elapsed(),
                    failed: searched.is_err(),
                });
                tokio::time::sleep(SEARCH_EVERY).await;
            }
            samples
        })
    };
    let eraser = Client::builder(server.endpoint())
        .retry_policy(RetryPolicy::never())
        .no_request_timeout()
        .connect()
        .await
        .context("connect the eraser")?;
    let progress_sql = format!(
        "SELECT (SELECT count(*) FROM sessions WHERE tenant = 'default' AND user_name = '{USER}' \
         AND deleted = 0) * 1000000000000 + (SELECT count(*) FROM sessions \
         WHERE tenant = 'default' AND user_name = '{USER}' AND deleted = 1) * 1000000 \
         + (SELECT count(*) FROM messages WHERE session_key BETWEEN {} AND {})",
        written.first_key, written.last_key
    );

    tokio::time::sleep(shape.warmup).await;
    let baseline_from = Instant::now();
    tokio::time::sleep(shape.baseline).await;
    let baseline_until = Instant::now();

    // EraseUser with the client's own retries off: an attempt that fails
    // is made again here (a repeat finishes an erasure cut short), up to
    // ATTEMPTS in all, and each failure is reported.
    let started = Instant::now();
    eprintln!(
        "   {op:?} called at {:.3} s since the epoch (to match the server's log)",
        workload::now_micros() as f64 / 1e6
    );
    let erase = || {
        let (eraser, op) = (eraser.clone(), op.clone());
        async move {
            match op {
                Op::EraseUser => eraser
                    .erase_user(USER, Vec::<String>::new())
                    .await
                    .map(Some),
                Op::DeleteSession(id) => eraser.delete_session(id).await.map(|()| None),
            }
        }
    };
    let mut failed = Vec::new();
    let mut erasing = Box::pin(erase());
    let mut progress = Vec::new();
    let mut ticks = tokio::time::interval(POLL);
    let outcome = loop {
        tokio::select! {
            answer = &mut erasing => match answer {
                Err(error) if failed.len() + 1 < ATTEMPTS => {
                    eprintln!(
                        "   EraseUser failed after {:.1} s (made again): {error}",
                        started.elapsed().as_secs_f64()
                    );
                    failed.push((started.elapsed(), error.to_string()));
                    erasing = Box::pin(erase());
                }
                other => break other,
            },
            _ = ticks.tick() => {
                let at = started.elapsed();
                // A connection for each read: one left open could keep a
                // read snapshot, which holds up SQLite's TRUNCATE
                // checkpoint at the end of the erasure, and every writer
                // behind it.
                let mut reader = Reader::open(db).await?;
                let packed = reader.scalar(&progress_sql).await?;
                reader.close().await;
                progress.push(Progress {
                    at,
                    live: packed / 1_000_000_000_000,
                    tombstones: packed / 1_000_000 % 1_000_000,
                    messages: packed % 1_000_000,
                });
            }
        }
    };
    let finished = Instant::now();
    stop.store(true, Ordering::Release);
    let mut samples = Vec::new();
    let mut errors = Vec::new();
    while let Some(done) = tasks.join_next().await {
        let (mine, failures) = done?;
        samples.extend(mine);
        errors.extend(failures);
    }
    let mut searches = searcher.await?;
    searches.retain(|s| s.began >= baseline_from);
    let failed_appends = samples.iter().filter(|s| s.failed).count();
    let acknowledged = samples.len() - failed_appends;
    let answer = outcome.map_err(|error| error.to_string());
    let after_writers = match &answer {
        Ok(_) => None,
        Err(error) => {
            eprintln!(
                "   EraseUser failed {ATTEMPTS} times while the writers ran (the last after \
                 {:.1} s: {error}); once more with the writers stopped",
                started.elapsed().as_secs_f64()
            );
            let again = Instant::now();
            let answer = erase().await.map_err(|error| error.to_string());
            Some((again.elapsed(), answer))
        }
    };
    samples.retain(|s| s.began >= baseline_from);
    samples.sort_by_key(|s| s.began);
    Ok(Run {
        samples,
        baseline: (baseline_from, baseline_until),
        erasure: (started, finished),
        answer,
        failed,
        after_writers,
        progress,
        acknowledged,
        failed_appends,
        first_append_error: errors.into_iter().next(),
        searches,
    })
}

/// After the erasure: the user's rows, counted straight in the database,
/// must all be gone, and the record of the erasure must hold the counts.
/// Answers a line describing what was counted.
pub async fn check_gone(db: &Database, written: &Written) -> anyhow::Result<String> {
    let mut reader = Reader::open(db).await?;
    let range = format!("BETWEEN {} AND {}", written.first_key, written.last_key);
    let mut counts = vec![
        (
            "sessions",
            format!("SELECT count(*) FROM sessions WHERE user_name = '{USER}'"),
        ),
        (
            "messages",
            format!("SELECT count(*) FROM messages WHERE session_key {range}"),
        ),
        (
            "events",
            format!("SELECT count(*) FROM events WHERE session_key {range}"),
        ),
        (
            "provider_calls",
            format!(
                "SELECT count(*) FROM provider_calls WHERE user_name = '{USER}' \
                 OR session_key {range}"
            ),
        ),
        (
            "idempotency_keys",
            format!("SELECT count(*) FROM idempotency_keys WHERE session_key {range}"),
        ),
    ];
    if db.is_postgres() {
        counts.push((
            "message_search",
            format!("SELECT count(*) FROM message_search WHERE session_key {range}"),
        ));
    }
    for (table, sql) in &counts {
        let left = reader.scalar(sql).await?;
        anyhow::ensure!(
            left == 0,
            "{left} rows of the erased user are left in {table}"
        );
    }
    // An attempt cut short after its record was written is followed by
    // one that finds nothing more and records zeros: the counts add up.
    let record = reader
        .scalar(
            "SELECT CAST(coalesce(sum(sessions_deleted), 0) * 1000000000000 \
             + coalesce(sum(messages_deleted), 0) * 1000000 \
             + coalesce(sum(provider_calls_deleted), 0) AS BIGINT) FROM erasures",
        )
        .await?;
    let records = reader.scalar("SELECT count(*) FROM erasures").await?;
    reader.close().await;
    let record = (
        record / 1_000_000_000_000,
        record / 1_000_000 % 1_000_000,
        record % 1_000_000,
    );
    let expected = (written.chats.len() as i64, written.messages, written.calls);
    anyhow::ensure!(
        record == expected,
        "the erasure's record counts (sessions, messages, calls) {record:?}, the fill wrote \
         {expected:?}"
    );
    let tables: Vec<&str> = counts.iter().map(|(table, _)| *table).collect();
    Ok(format!(
        "0 rows left in {}; {records} erasure record(s) count {} sessions, {} messages, {} calls",
        tables.join(", "),
        record.0,
        record.1,
        record.2
    ))
}

/// The writers' sessions hold every exchange they were acknowledged (and
/// at most those whose call failed besides): the erasure took nothing of
/// theirs.
pub async fn check_writers(
    server: &Server,
    writers: &[String],
    shape: &Shape,
    run: &Run,
) -> anyhow::Result<()> {
    let mut client = server.connect().await?;
    let mut total = 0;
    for id in writers {
        let session = client
            .get_session(pb::GetSessionRequest {
                session_id: id.clone(),
                ..Default::default()
            })
            .await
            .with_context(|| format!("GetSession {id}"))?
            .into_inner();
        total += (session.next_sequence as usize) / 2 - shape.prefill;
    }
    anyhow::ensure!(
        total >= run.acknowledged && total <= run.acknowledged + run.failed_appends,
        "the writers' sessions hold {total} measured exchanges, {} were acknowledged and {} failed",
        run.acknowledged,
        run.failed_appends
    );
    Ok(())
}
