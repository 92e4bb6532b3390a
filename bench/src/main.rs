//! `sessionstore-bench`: drives the real `sessionstore` binary over real
//! gRPC from this separate process, measures the same work issued straight
//! to the database (the ceiling) and through the libraries users would pick
//! instead (the peers), and prints one table (and, with `--json` or
//! `--save`, the figures as JSON; with `--compare`, set beside an earlier
//! run's). See BENCHMARKS.md.
//!
//! ```text
//! cargo run --release -p sessionstore-bench -- --postgres-url postgres://postgres@127.0.0.1:5432/postgres --save
//! cargo run -p sessionstore-bench -- --quick      # the seconds-long smoke run CI does
//! cargo run -p sessionstore-bench -- --compare OLD.json --against NEW.json
//! ```

// A benchmark's output is its table: printing is the point.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod append;
mod compare;
mod control;
mod erase;
mod failover;
mod history;
mod live;
mod peers;
mod reads;
mod report;
mod results;
mod scale;
mod server;
mod stats;
mod usage;
mod versus;
mod watch;
mod workload;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use sqlx::Connection as _;

use crate::append::Routing;
use crate::append::Spread as Writers;
use crate::report::{Figure, Machine, Report};
use crate::server::{Database, Server};
use crate::stats::{Latency, Spread, Throughput, Timing};

#[derive(Debug, Parser)]
#[command(
    name = "sessionstore-bench",
    about = "Benchmarks sessionstore over gRPC against the database's ceiling and peer libraries"
)]
struct Args {
    /// A smoke run of a few seconds: tiny sizes, one repetition, no peers.
    #[arg(long)]
    quick: bool,

    /// PostgreSQL URL to an existing database (`postgres` will do): each
    /// benchmark creates its own database beside it and drops it after.
    /// Without it, only SQLite is measured.
    #[arg(long, env = "SESSIONSTORE_BENCH_POSTGRES_URL")]
    postgres_url: Option<String>,

    /// Only these benchmarks.
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Bench>,

    /// Only this backend (both by default; PostgreSQL needs
    /// `--postgres-url`). With `--vs` too.
    #[arg(long, value_enum)]
    backend: Option<Backend>,

    /// Repetitions of each throughput run (default 3; 1 with --quick).
    #[arg(long)]
    repeat: Option<usize>,

    /// Seconds each throughput run measures, after a third as long warming
    /// up (default 2; 0.3 with --quick).
    #[arg(long)]
    seconds: Option<f64>,

    /// Timed reads of each export and replay case, alternating where two
    /// are compared (default 15; 3 with --quick). More separate smaller
    /// changes from a noisy machine's drift.
    #[arg(long)]
    samples: Option<usize>,

    /// Messages in the session `--only delete` deletes (default 200,000;
    /// 4,000 with --quick); even, two per exchange.
    #[arg(long)]
    delete_messages: Option<usize>,

    /// Concurrent clients for the append runs (default 1,16,64; 1,4 with --quick).
    #[arg(long, value_delimiter = ',')]
    clients: Vec<usize>,

    /// Exchange shapes sessionstore's many-session appends (search on and
    /// off) and the peers write, at every client count (default
    /// small,1kb): `small`, a 64-byte user message and a 512-byte answer;
    /// `1kb`, 1,000 bytes each. Each with a provider call. The ceilings,
    /// the floor and the one-session case write 1kb.
    #[arg(long, value_enum, value_delimiter = ',')]
    shapes: Vec<workload::Shape>,

    /// Repetitions of each run of the shapes after the first in
    /// `--shapes` (default and at most `--repeat`'s; the 1kb runs beside
    /// the ceilings always make `--repeat`).
    #[arg(long)]
    repeat_later_shapes: Option<usize>,

    /// Also write the figures as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,

    /// Also write the figures, with the machine, the commit and the date,
    /// to `bench/results/<date>-<commit>.json` (never over an existing
    /// file): how a full run's results are kept in the repository.
    #[arg(long)]
    save: bool,

    /// A note kept with the figures (`--json`, `--save`): what else the
    /// machine was doing, why the run was made.
    #[arg(long, value_name = "TEXT")]
    notes: Option<String>,

    /// After the run, print each figure it shares with this earlier
    /// `--json` or results file: both values, new ÷ old, and which way is
    /// better; figures in one of the two only are listed apart.
    #[arg(long, value_name = "OLD_JSON")]
    compare: Option<PathBuf>,

    /// With `--compare OLD`: compare OLD with this file instead of a new
    /// run (nothing is run).
    #[arg(long, value_name = "NEW_JSON", requires = "compare")]
    against: Option<PathBuf>,

    /// The `sessionstore` binary (default: the one beside this bench,
    /// rebuilt first when run through cargo).
    #[arg(long)]
    server_bin: Option<PathBuf>,

    /// Compare this `sessionstore` binary (B) with `--server-bin` (A)
    /// instead: appends and the replay (as `--only append,export` selects),
    /// each build on a database of its own, alternating run by run.
    #[arg(long, value_name = "SERVER_BIN")]
    vs: Option<PathBuf>,

    /// With `--vs`: the `--search` both builds run with (`off` compares
    /// them as the peers are compared like for like).
    #[arg(long, value_name = "SEARCH", default_value = "on", requires = "vs")]
    vs_search: Search,

    /// Keep each database the run made (SQLite files, PostgreSQL
    /// databases) instead of removing it, and print where it is: for
    /// looking at a plan or a size after the run.
    #[arg(long)]
    keep: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Bench {
    Append,
    Export,
    List,
    Watch,
    Memory,
    Peers,
    Agents,
    Live,
    Usage,
    Erase,
    /// DeleteSession of one long session while others append.
    Delete,
    Scale,
    /// Appends through one replica and through two of one PostgreSQL
    /// database (only when asked for).
    Replicas,
    /// A PostgreSQL primary's failover to its synchronous standby under
    /// 16 clients' appends through two replicas, on servers the run makes
    /// itself (only when asked for).
    Failover,
    /// The run control plane: queued input submitted and taken, an
    /// approval decided on one replica seen by a watcher on another, and
    /// appends beside idle approvals and queued inputs.
    Control,
}

/// Sizes and durations of one run.
struct Plan {
    timing: Timing,
    repeat: usize,
    clients: Vec<usize>,
    /// The exchange shapes of the many-session appends and the peers'.
    shapes: Vec<workload::Shape>,
    /// Repetitions of the runs of each shape after the first.
    repeat_later_shapes: usize,
    /// Messages already in each append session before measuring.
    prefill: usize,
    export_sizes: Vec<usize>,
    export_samples: usize,
    /// Exchanges (one event each) in the session WatchSession replays.
    replay_exchanges: usize,
    list: reads::ListShape,
    list_samples: usize,
    /// Pages skipped before the deep page.
    deep_pages: usize,
    watchers: Vec<usize>,
    watch_appends: usize,
    watch_interval: Duration,
    idle_streams: usize,
    /// Stalled replays in the memory case, and the messages (250 KB each)
    /// of the session they replay.
    stalled_streams: usize,
    stalled_messages: usize,
    idle_sessions: usize,
    /// Messages in the long session the newest-page case reads, and the
    /// `before_sequence` of its deep page.
    long_session: usize,
    deep_before: i64,
    live_samples: usize,
    /// CancelRun trials across two replicas (PostgreSQL).
    cancel_trials: usize,
    /// The provider calls SummarizeUsage sums, and how many calls of it
    /// are timed for one user's month and for the whole tenant's.
    usage: usage::Shape,
    usage_user_samples: usize,
    usage_tenant_samples: usize,
    /// The user EraseUser erases, and the writers appending meanwhile (also
    /// while DeleteSession runs).
    erase: erase::Shape,
    /// The exchanges of the session DeleteSession deletes.
    delete_exchanges: usize,
    /// The long and short sessions appended to, and the tenant listed.
    scale: scale::Shape,
    scale_samples: usize,
    /// The failover's warm-up and its measured windows.
    failover: failover::Shape,
    /// The control plane's decisions timed, idle rows and rounds.
    control: control::Shape,
    /// The agent frameworks' round trips: per measured session, runs, and
    /// the pre-fill of each store.
    agents: peers::AgentsShape,
    /// Whether the agents figures are held to their goals (not in a quick
    /// run, whose sessions are too short to say anything).
    agents_targets: bool,
    benches: Vec<Bench>,
}

impl Plan {
    fn from(args: &Args) -> Plan {
        let quick = args.quick;
        let seconds = args.seconds.unwrap_or(if quick { 0.3 } else { 2.0 });
        let repeat = args.repeat.unwrap_or(if quick { 1 } else { 3 });
        let benches = if args.only.is_empty() {
            let mut all = vec![
                Bench::Append,
                Bench::Export,
                Bench::List,
                Bench::Watch,
                Bench::Memory,
                Bench::Live,
                Bench::Control,
            ];
            if !quick {
                all.push(Bench::Peers);
                all.push(Bench::Agents);
            }
            all
        } else {
            args.only.clone()
        };
        Plan {
            timing: Timing {
                warmup: Duration::from_secs_f64(seconds / 3.0),
                measure: Duration::from_secs_f64(seconds),
            },
            repeat,
            clients: if !args.clients.is_empty() {
                args.clients.clone()
            } else if quick {
                vec![1, 4]
            } else {
                vec![1, 16, 64]
            },
            shapes: if args.shapes.is_empty() {
                vec![workload::Shape::Small, workload::Shape::Kb1]
            } else {
                let mut shapes = args.shapes.clone();
                shapes.dedup();
                shapes
            },
            repeat_later_shapes: args.repeat_later_shapes.unwrap_or(repeat).clamp(1, repeat),
            prefill: if quick { 10 } else { 200 },
            export_sizes: if quick {
                vec![100, 1_000]
            } else {
                vec![1_000, 10_000]
            },
            export_samples: args.samples.unwrap_or(if quick { 3 } else { 15 }).max(1),
            replay_exchanges: if quick { 100 } else { 5_000 },
            list: if quick {
                reads::ListShape {
                    sessions: 500,
                    messages_each: 2,
                }
            } else {
                reads::ListShape {
                    sessions: 100_000,
                    messages_each: 10,
                }
            },
            list_samples: if quick { 20 } else { 500 },
            deep_pages: if quick { 5 } else { 1_000 },
            watchers: if quick {
                vec![1, 10]
            } else {
                vec![1, 100, 1_000]
            },
            watch_appends: if quick { 10 } else { 200 },
            watch_interval: Duration::from_millis(if quick { 2 } else { 10 }),
            idle_streams: if quick { 200 } else { 10_000 },
            stalled_streams: if quick { 4 } else { 10 },
            stalled_messages: if quick { 40 } else { 600 },
            idle_sessions: if quick { 2 } else { 100 },
            long_session: if quick { 10_000 } else { 1_000_000 },
            deep_before: if quick { 5_000 } else { 500_000 },
            live_samples: if quick { 20 } else { 500 },
            cancel_trials: if quick { 5 } else { 50 },
            usage: if quick {
                usage::Shape {
                    users: 50,
                    sessions: 1_000,
                    calls_per_session: 10,
                    days: 90,
                }
            } else {
                usage::Shape {
                    users: 1_000,
                    sessions: 100_000,
                    calls_per_session: 10,
                    days: 90,
                }
            },
            usage_user_samples: if quick { 20 } else { 200 },
            usage_tenant_samples: if quick { 5 } else { 20 },
            erase: if quick {
                erase::Shape {
                    sessions: 200,
                    writers: 4,
                    prefill: 5,
                    warmup: Duration::from_millis(200),
                    baseline: Duration::from_millis(500),
                }
            } else {
                erase::Shape {
                    sessions: 10_000,
                    writers: 8,
                    prefill: 20,
                    warmup: Duration::from_secs(1),
                    baseline: Duration::from_secs(10),
                }
            },
            delete_exchanges: args
                .delete_messages
                .map_or(if quick { 2_000 } else { 100_000 }, |messages| {
                    (messages / 2).max(1)
                }),
            scale: if quick {
                scale::Shape {
                    long_messages: 10_000,
                    short_messages: 10,
                    sessions: 5_000,
                }
            } else {
                scale::Shape {
                    long_messages: 1_000_000,
                    short_messages: 10,
                    sessions: 1_000_000,
                }
            },
            scale_samples: if quick { 20 } else { 2_000 },
            failover: failover::Shape {
                warmup: Duration::from_secs_f64(if quick { 0.3 } else { 1.0 }),
                window: Duration::from_secs_f64(args.seconds.unwrap_or(if quick {
                    1.0
                } else {
                    5.0
                })),
            },
            control: if quick {
                control::Shape {
                    decisions: 20,
                    approval_sessions: 10,
                    approvals_each: 10,
                    queue_sessions: 4,
                    inputs_each: 5,
                    rounds: repeat,
                }
            } else {
                control::Shape {
                    decisions: 200,
                    approval_sessions: 200,
                    approvals_each: 50,
                    queue_sessions: 100,
                    inputs_each: 50,
                    rounds: args.repeat.unwrap_or(5),
                }
            },
            agents: peers::AgentsShape {
                round_trips: if quick { 20 } else { 200 },
                repeat,
                prefill_sessions: if quick { 2 } else { 20 },
                prefill_items: if quick { 10 } else { 100 },
            },
            agents_targets: !quick,
            benches,
        }
    }

    fn runs(&self, bench: Bench) -> bool {
        self.benches.contains(&bench)
    }

    /// Repetitions of the runs of `shape`: the first of `--shapes` gets
    /// `--repeat`, the others `--repeat-later-shapes`.
    fn repeats(&self, shape: workload::Shape) -> usize {
        if self.shapes.first() == Some(&shape) {
            self.repeat
        } else {
            self.repeat_later_shapes
        }
    }
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if let (Some(old), Some(new)) = (&args.compare, &args.against) {
        return match compare_files(old, new) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("sessionstore-bench: {error:#}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    if args.keep {
        server::keep_databases();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("sessionstore-bench: cannot start the runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("sessionstore-bench: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> anyhow::Result<()> {
    let plan = Plan::from(args);
    let started = Instant::now();
    let binary = server::binary(args.server_bin.as_deref())?;
    // Read before the run, so that a wrong path fails in a second, not
    // after half an hour of benchmarks.
    if let Some(old) = &args.compare {
        compare::Saved::read(old)?;
    }
    let mut report = Report {
        run: results::RunInfo::now(args.notes.as_deref()),
        machine: Machine::read(),
        settings: serde_json::json!({
            "quick": args.quick,
            "seconds": plan.timing.measure.as_secs_f64(),
            "warmup_seconds": plan.timing.warmup.as_secs_f64(),
            "repeat": plan.repeat,
            "clients": plan.clients,
            "shapes": plan.shapes.iter().map(|shape| shape.name()).collect::<Vec<_>>(),
            "repeat_later_shapes": plan.repeat_later_shapes,
            "server_binary": binary.display().to_string(),
            // When it was built: the commit in `run` is the checkout's
            // HEAD when the run began, which a binary built earlier may
            // not match.
            "server_binary_built": results::modified(&binary),
        }),
        ..Report::default()
    };
    let postgres = args.postgres_url.as_deref();
    match postgres {
        Some(url) => {
            let mut conn = sqlx::PgConnection::connect(url).await?;
            let version: String = sqlx::query_scalar("SHOW server_version")
                .fetch_one(&mut conn)
                .await?;
            report.machine.postgres = Some(format!("PostgreSQL {version}"));
        }
        // The failover makes its own PostgreSQL servers.
        None if plan.benches.iter().all(|bench| *bench == Bench::Failover) => {}
        None => {
            eprintln!("!! no --postgres-url: PostgreSQL is NOT measured");
            report
                .skipped
                .push("PostgreSQL: no --postgres-url (or SESSIONSTORE_BENCH_POSTGRES_URL)".into());
        }
    }

    if let Some(only) = args.backend {
        report.settings["backend"] = serde_json::json!(only.name());
        let other = match only {
            Backend::Sqlite => "PostgreSQL",
            Backend::Postgres => "SQLite",
        };
        report
            .skipped
            .push(format!("{other}: --backend {}", only.name()));
    }
    if let Some(vs) = &args.vs {
        report.settings["vs_server_binary"] = serde_json::json!(vs.display().to_string());
        report.settings["vs_search"] = serde_json::json!(match args.vs_search {
            Search::On => "on",
            Search::Off => "off",
        });
        for backend in backends(args.backend) {
            if backend == "sqlite" || postgres.is_some() {
                let builds = versus::Builds {
                    binaries: [&binary, vs],
                    search: args.vs_search,
                };
                versus::benchmarks(&plan, &builds, backend, postgres, &mut report).await?;
            }
        }
        return finish(args, started, report);
    }

    // sessionstore's append rates (many sessions), for the peer ratios.
    let mut append_rates = HashMap::new();
    let mut export_ms = HashMap::new();
    for backend in backends(args.backend) {
        let db = match (backend, postgres) {
            ("sqlite", _) => Database::sqlite("main")?,
            (_, Some(url)) => Database::postgres(url, "main").await?,
            (_, None) => continue,
        };
        on(db, async |db| {
            core_benchmarks(
                &plan,
                &binary,
                db,
                &mut report,
                &mut append_rates,
                &mut export_ms,
            )
            .await
        })
        .await?;
        // Each further group on a database of its own.
        let groups = [
            (Bench::Append, "nosearch"),
            (Bench::Watch, "watch"),
            (Bench::Live, "live"),
            (Bench::Usage, "usage"),
            (Bench::Erase, "erase"),
            (Bench::Delete, "delete"),
            (Bench::Scale, "scale"),
            (Bench::Replicas, "replicas"),
            (Bench::Control, "control"),
        ];
        for (group, name) in groups.into_iter().filter(|(group, _)| plan.runs(*group)) {
            let db = fresh_database(backend, postgres, name).await?;
            on(db, async |db| match group {
                Bench::Append => {
                    search_off_benchmarks(&plan, &binary, db, &mut report, &mut append_rates).await
                }
                Bench::Watch => watch_benchmarks(&plan, &binary, db, &mut report).await,
                Bench::Live => live_benchmarks(&plan, &binary, db, &mut report).await,
                Bench::Usage => usage_benchmarks(&plan, &binary, db, &mut report).await,
                Bench::Erase => erase_benchmarks(&plan, &binary, db, &mut report).await,
                Bench::Delete => delete_benchmarks(&plan, &binary, db, &mut report).await,
                Bench::Scale => scale_benchmarks(&plan, &binary, db, &mut report).await,
                Bench::Replicas => replicas_benchmarks(&plan, &binary, db, &mut report).await,
                Bench::Control => {
                    control::benchmarks(&plan, &binary, db, postgres, &mut report).await
                }
                // The others run on the main database above, or on none.
                _ => Ok(()),
            })
            .await?;
        }
    }
    if plan.runs(Bench::Failover) {
        if args.backend == Some(Backend::Sqlite) {
            report
                .skipped
                .push("failover: PostgreSQL only (--backend sqlite)".into());
        } else {
            failover::benchmark(&plan.failover, &binary, &mut report).await?;
        }
    }
    if plan.runs(Bench::Memory) {
        on(Database::sqlite("memory")?, async |db| {
            memory_benchmark(&plan, &binary, db, &mut report).await
        })
        .await?;
    }
    if plan.runs(Bench::Peers) {
        peer_benchmarks(&plan, postgres, &append_rates, &export_ms, &mut report).await?;
    }
    if plan.runs(Bench::Agents) {
        agents_benchmark(&plan, &binary, postgres, args.backend, &mut report).await?;
    }

    finish(args, started, report)
}

/// Prints the figures, writes them as JSON where asked, and compares them
/// with an earlier run's where asked.
fn finish(args: &Args, started: Instant, mut report: Report) -> anyhow::Result<()> {
    report.settings["wall_seconds"] = serde_json::json!(started.elapsed().as_secs());
    report.run.load_average_end = results::load_average();
    println!("{}", report.table());
    let json = serde_json::to_vec_pretty(&report)?;
    let mut paths: Vec<PathBuf> = args.json.iter().cloned().collect();
    if args.save {
        paths.push(report.run.results_path(&results::results_dir()));
    }
    for path in paths {
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&path, &json)?;
        eprintln!("figures written to {}", path.display());
    }
    if let Some(old_path) = &args.compare {
        let old = compare::Saved::read(old_path)?;
        let new: compare::Saved = serde_json::from_slice(&json)?;
        let comparison = compare::compare(&old.figures, &new.figures);
        println!(
            "\n{}",
            comparison.table(&old.label(old_path), &new.label(Path::new("this run")))
        );
    }
    Ok(())
}

/// `--compare OLD --against NEW`: two files' figures, nothing run.
fn compare_files(old_path: &Path, new_path: &Path) -> anyhow::Result<()> {
    let old = compare::Saved::read(old_path)?;
    let new = compare::Saved::read(new_path)?;
    let comparison = compare::compare(&old.figures, &new.figures);
    println!(
        "{}",
        comparison.table(&old.label(old_path), &new.label(new_path))
    );
    Ok(())
}

/// A database of its own for one group of benchmarks, named `name`, on
/// `backend` (PostgreSQL beside `postgres`, when that is the backend).
/// Runs `benchmarks` on `db`, then removes `db` whether they succeeded or
/// not.
async fn on(
    db: Database,
    benchmarks: impl AsyncFnOnce(&Database) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let outcome = benchmarks(&db).await;
    db.remove().await?;
    outcome
}

async fn fresh_database(
    backend: &str,
    postgres: Option<&str>,
    name: &str,
) -> anyhow::Result<Database> {
    match postgres.filter(|_| backend == "postgres") {
        Some(url) => Database::postgres(url, name).await,
        None => Database::sqlite(name),
    }
}

/// The backends measured: both, or the one `--backend` names.
fn backends(only: Option<Backend>) -> Vec<&'static str> {
    match only {
        Some(backend) => vec![backend.name()],
        None => vec!["sqlite", "postgres"],
    }
}

/// A backend `--backend` selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// Whether the server keeps its search index (`--search`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, ValueEnum)]
enum Search {
    On,
    Off,
}

impl Search {
    fn label(self) -> &'static str {
        match self {
            Search::On => "with search on (default)",
            Search::Off => "with --search off (like for like)",
        }
    }
}

/// sessionstore's median append rate with many sessions, by backend,
/// search setting, exchange shape and client count: what each peer's rate
/// at the same client count, with the same shape, is compared with.
type AppendRates = HashMap<(&'static str, Search, workload::Shape, usize), f64>;

/// How far ahead of a peer sessionstore's appends should be at the same
/// client count, with either shape, where a goal holds them: on
/// PostgreSQL at 16 and 64 clients, langchain-postgres 1.2× (search on)
/// and 2× (like for like), `SQLAlchemySession` (any other peer) 3× with
/// search on; on SQLite at 16 clients, `SQLiteSession` 2× and 3×.
fn peer_goal(peer: &str, backend: &str, search: Search, clients: usize) -> Option<f64> {
    match (backend, clients) {
        ("postgres", 16 | 64) => match (peer.contains("langchain"), search) {
            (true, Search::On) => Some(1.2),
            (true, Search::Off) => Some(2.0),
            (false, Search::On) => Some(3.0),
            (false, Search::Off) => None,
        },
        ("sqlite", 16) => Some(match search {
            Search::On => 2.0,
            Search::Off => 3.0,
        }),
        _ => None,
    }
}

/// An append case's name: the clients, where they write, the exchange.
fn append_case_name(clients: usize, writers: Writers, shape: workload::Shape) -> String {
    format!("{clients} clients, {}, {}", writers.label(), shape.label())
}

/// Appends with `--search off` on a database of their own: the rate the
/// peers (which keep no search index) are compared with like for like.
async fn search_off_benchmarks(
    plan: &Plan,
    binary: &Path,
    db: &Database,
    report: &mut Report,
    append_rates: &mut AppendRates,
) -> anyhow::Result<()> {
    let backend = db.backend();
    eprintln!("== append on {backend}, --search off");
    let server = Server::start(binary, &db.url(), &["--search", "off"]).await?;
    let max_clients = plan.clients.iter().copied().max().unwrap_or(1);
    append::prepare(&server, db, max_clients, plan.prefill).await?;
    db.analyze().await?;
    for &clients in &plan.clients {
        // The shapes in turn, so drift falls on them alike.
        let mut runs: Vec<(workload::Shape, Vec<stats::Run>)> = plan
            .shapes
            .iter()
            .map(|&shape| (shape, Vec::new()))
            .collect();
        for round in 0..plan.repeat {
            for (shape, runs) in &mut runs {
                if round < plan.repeats(*shape) {
                    runs.push(
                        append::service_shaped(
                            &server,
                            clients,
                            Writers::Many,
                            *shape,
                            plan.timing,
                        )
                        .await?,
                    );
                }
            }
        }
        for (shape, runs) in runs {
            let service = Throughput::of(runs);
            let case = append_case_name(clients, Writers::Many, shape);
            let (rate, cpu) =
                service_figures(backend, "sessionstore --search off", &case, &service);
            report.push(rate);
            // Goal 2's CPU is held with the 1 KB exchange.
            report.extend(cpu.map(|cpu| match shape {
                workload::Shape::Kb1 => cpu_goal(cpu, backend, clients),
                workload::Shape::Small => cpu,
            }));
            append_rates.insert(
                (backend, Search::Off, shape, clients),
                service.per_second.median,
            );
        }
    }
    server.stop().await;
    Ok(())
}

/// Appends through one replica, then through two on the same PostgreSQL
/// database (each client talks to one of them), many sessions, search on:
/// what several replicas' writers cost each other in the database (their
/// commits, and their commit hints), which one replica cannot show.
async fn replicas_benchmarks(
    plan: &Plan,
    binary: &Path,
    db: &Database,
    report: &mut Report,
) -> anyhow::Result<()> {
    if !db.is_postgres() {
        return Ok(());
    }
    let backend = db.backend();
    eprintln!("== append on {backend}, one replica and two");
    let a = Server::start(binary, &db.url(), &[]).await?;
    let b = Server::start(binary, &db.url(), &[]).await?;
    let max_clients = plan.clients.iter().copied().max().unwrap_or(1);
    append::prepare(&a, db, max_clients, plan.prefill).await?;
    db.analyze().await?;
    for &clients in &plan.clients {
        for (subject, servers, routing) in [
            ("sessionstore, one replica", vec![&a], Routing::Sticky),
            ("sessionstore, two replicas", vec![&a, &b], Routing::Sticky),
            (
                "sessionstore, two replicas, each append to the other",
                vec![&a, &b],
                Routing::Alternating,
            ),
        ] {
            let mut runs = Vec::new();
            for _ in 0..plan.repeat {
                runs.push(
                    append::service_across(&servers, clients, Writers::Many, routing, plan.timing)
                        .await?,
                );
            }
            let service = Throughput::of(runs);
            let case = format!("{clients} clients, {}", Writers::Many.label());
            let (rate, cpu) = service_figures(backend, subject, &case, &service);
            report.push(rate);
            report.extend(cpu);
        }
    }
    b.stop().await;
    a.stop().await;
    Ok(())
}

/// Appends, exports and listings on one database, one server.
async fn core_benchmarks(
    plan: &Plan,
    binary: &Path,
    db: &Database,
    report: &mut Report,
    append_rates: &mut AppendRates,
    export_ms: &mut HashMap<(&'static str, usize), f64>,
) -> anyhow::Result<()> {
    if !(plan.runs(Bench::Append) || plan.runs(Bench::Export) || plan.runs(Bench::List)) {
        return Ok(());
    }
    let backend = db.backend();
    let server = Server::start(binary, &db.url(), &[]).await?;
    if plan.runs(Bench::Append) {
        eprintln!("== append on {backend}");
        let max_clients = plan.clients.iter().copied().max().unwrap_or(1);
        append::prepare(&server, db, max_clients, plan.prefill).await?;
        db.analyze().await?;
        for &clients in &plan.clients {
            for writers in [Writers::Many, Writers::One] {
                append_case(plan, &server, db, clients, writers, report, append_rates).await?;
            }
        }
    }
    if plan.runs(Bench::Export) {
        eprintln!("== export on {backend}");
        for &size in &plan.export_sizes {
            reads::prepare_export(&server, size).await?;
        }
        db.analyze().await?;
        for &size in &plan.export_sizes {
            export_case(plan, &server, db, size, report, export_ms).await?;
        }
        let size = plan.export_sizes.iter().copied().max().unwrap_or(0);
        reads::prepare_reasoning_export(&server, size).await?;
        db.analyze().await?;
        target_export_case(plan, &server, db, size, report).await?;
        reads::prepare_replay(&server, plan.replay_exchanges).await?;
        db.analyze().await?;
        replay_case(plan, &server, db, report).await?;
    }
    if plan.runs(Bench::List) {
        eprintln!(
            "== list on {backend}: filling {} sessions of {} messages",
            plan.list.sessions, plan.list.messages_each
        );
        let filling = Instant::now();
        reads::prepare_list(&server, &plan.list, 16).await?;
        db.analyze().await?;
        eprintln!("   filled in {:.1} s", filling.elapsed().as_secs_f64());
        let case = format!(
            "{} sessions, {} messages",
            plan.list.sessions,
            plan.list.sessions * plan.list.messages_each
        );
        let selective = reads::selective_filter();
        let apps = reads::apps(plan.list.sessions);
        for (page, token, filter) in [
            ("first page".to_owned(), String::new(), String::new()),
            (
                format!("page {} (deep)", plan.deep_pages + 1),
                reads::token_after(&server, plan.deep_pages).await?,
                String::new(),
            ),
            (
                format!("filter {selective} (1 in {apps}), first page"),
                String::new(),
                selective.clone(),
            ),
            (
                format!("filter {} (9 in 10), first page", reads::common_filter()),
                String::new(),
                reads::common_filter(),
            ),
        ] {
            let mut took = reads::list_pages(&server, &token, &filter, plan.list_samples).await?;
            let ms: Vec<f64> = took.iter().map(|d| d.as_secs_f64() * 1e3).collect();
            let latency = Latency::of(&mut took);
            let mut figure = Figure::new(
                "list",
                backend,
                "sessionstore",
                &format!("{case}, {page} of {}", reads::PAGE_SIZE),
                "ms",
                Spread::of(&ms),
            )
            .latency(latency);
            // The target is for 100,000 sessions, not the smoke run's few.
            if plan.list.sessions >= 100_000 {
                figure = figure.target("p99 < 5 ms", latency.p99_ms < 5.0);
            }
            report.push(figure);
        }
    }
    server.stop().await;
    Ok(())
}

/// sessionstore's figures in an append `case`: its rate, for the caller
/// to complete, and its server CPU per exchange, where the runs measured
/// it.
fn service_figures(
    backend: &'static str,
    subject: &str,
    case: &str,
    service: &Throughput,
) -> (Figure, Option<Figure>) {
    let rate = Figure::new(
        "append",
        backend,
        subject,
        case,
        "exchanges/s",
        service.per_second,
    )
    .latency(service.latency);
    let cpu = service.cpu_micros.map(|cpu| {
        Figure::new(
            "append server CPU",
            backend,
            subject,
            case,
            "µs CPU/exchange",
            cpu,
        )
    });
    (rate, cpu)
}

/// Goal 2's server CPU: at most 120 µs an exchange on SQLite at 16
/// clients, many sessions, held with search on and like for like.
fn cpu_goal(figure: Figure, backend: &str, clients: usize) -> Figure {
    if backend == "sqlite" && clients == 16 {
        let met = figure.value.median <= 120.0;
        figure.target("≤ 120 µs", met)
    } else {
        figure
    }
}

async fn append_case(
    plan: &Plan,
    server: &Server,
    db: &Database,
    clients: usize,
    writers: Writers,
    report: &mut Report,
    append_rates: &mut AppendRates,
) -> anyhow::Result<()> {
    let backend = db.backend();
    let (mut service, mut raw, mut engine) = (Vec::new(), Vec::new(), Vec::new());
    let mut rejected = Vec::new();
    // The other shapes' many-session runs (the 1 KB exchange's is
    // `service`), for the peers.
    let mut shaped: Vec<(workload::Shape, Vec<stats::Run>)> = match writers {
        Writers::Many => plan
            .shapes
            .iter()
            .filter(|&&shape| shape != workload::Shape::Kb1)
            .map(|&shape| (shape, Vec::new()))
            .collect(),
        Writers::One => Vec::new(),
    };
    // Interleaved, so drift (a growing database, a busy neighbour) falls on
    // all of them alike.
    for round in 0..plan.repeat {
        service.push(append::service(server, clients, writers, plan.timing).await?);
        for (shape, runs) in &mut shaped {
            if round < plan.repeats(*shape) {
                runs.push(
                    append::service_shaped(server, clients, writers, *shape, plan.timing).await?,
                );
            }
        }
        if writers == Writers::Many {
            rejected.push(append::rejected(server, clients, plan.timing).await?);
        }
        raw.push(append::raw_sqlx(db, clients, writers, plan.timing).await?);
        if !db.is_postgres() {
            engine.push(append::raw_engine(db, clients, writers, plan.timing).await?);
        }
    }
    let case = append_case_name(clients, writers, workload::Shape::Kb1);
    let unit = "exchanges/s";
    let raw = Throughput::of(raw);
    report.push(
        Figure::new("append", backend, "raw sqlx", &case, unit, raw.per_second)
            .latency(raw.latency),
    );
    let mut ceiling = ("raw sqlx", raw.per_second.median);
    if !engine.is_empty() {
        let engine = Throughput::of(engine);
        report.push(
            Figure::new(
                "append",
                backend,
                "raw rusqlite",
                &case,
                unit,
                engine.per_second,
            )
            .latency(engine.latency),
        );
        if engine.per_second.median > ceiling.1 {
            ceiling = ("raw rusqlite", engine.per_second.median);
        }
    }
    let service = Throughput::of(service);
    let ratio = service.per_second.median / ceiling.1;
    let (rate, cpu) = service_figures(backend, "sessionstore", &case, &service);
    let cpu = match writers {
        Writers::Many => cpu.map(|cpu| cpu_goal(cpu, backend, clients)),
        Writers::One => cpu,
    };
    let mut figure = rate.ratio(ratio, ceiling.0);
    if clients == 16 && writers == Writers::Many {
        figure = match backend {
            "sqlite" => figure.target("≥ 2.0× raw", ratio >= 2.0),
            _ => figure.target("≥ 1.0× raw", ratio >= 1.0),
        };
    }
    report.push(figure);
    report.extend(cpu);
    if !rejected.is_empty() {
        // The server's floor: the same requests, decoded and checked in
        // full, then rejected before the store.
        let rejected = Throughput::of(rejected);
        let (rate, cpu) = service_figures(backend, "rejected (floor)", &case, &rejected);
        report.push(rate);
        report.extend(cpu);
    }
    if writers == Writers::Many {
        append_rates.insert(
            (backend, Search::On, workload::Shape::Kb1, clients),
            service.per_second.median,
        );
    }
    for (shape, runs) in shaped {
        let service = Throughput::of(runs);
        let case = append_case_name(clients, writers, shape);
        let (rate, cpu) = service_figures(backend, "sessionstore", &case, &service);
        report.push(rate);
        report.extend(cpu);
        append_rates.insert(
            (backend, Search::On, shape, clients),
            service.per_second.median,
        );
    }
    Ok(())
}

async fn export_case(
    plan: &Plan,
    server: &Server,
    db: &Database,
    size: usize,
    report: &mut Report,
    export_ms: &mut HashMap<(&'static str, usize), f64>,
) -> anyhow::Result<()> {
    let backend = db.backend();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (mut service, mut raw, mut engine) = (Vec::new(), Vec::new(), Vec::new());
    // One unmeasured round warms the caches.
    reads::export_once(server, size).await?;
    for _ in 0..plan.export_samples {
        service.push(ms(reads::export_once(server, size).await?));
        raw.push(ms(reads::select_sqlx(db, size).await?));
        if !db.is_postgres() {
            engine.push(ms(reads::select_engine(db, size)?));
        }
    }
    let case = format!("{size} messages");
    let raw = Spread::of(&raw);
    report.push(Figure::new(
        "export",
        backend,
        "SELECT sqlx",
        &case,
        "ms",
        raw,
    ));
    let mut baseline = ("SELECT sqlx", raw.median);
    if !engine.is_empty() {
        let engine = Spread::of(&engine);
        report.push(Figure::new(
            "export",
            backend,
            "SELECT rusqlite",
            &case,
            "ms",
            engine,
        ));
        if engine.median < baseline.1 {
            baseline = ("SELECT rusqlite", engine.median);
        }
    }
    let service = Spread::of(&service);
    let ratio = service.median / baseline.1;
    let mut figure = Figure::new(
        "export",
        backend,
        "sessionstore ExportHistory",
        &case,
        "ms",
        service,
    )
    .ratio(ratio, &format!("{} time", baseline.0));
    if size == 10_000 {
        figure = figure.target("≤ 1.3× SELECT", ratio <= 1.3);
    }
    report.push(figure);
    export_ms.insert((backend, size), service.median);
    Ok(())
}

/// ExportHistory for a target against the plain export of the same
/// session (a third of its messages with reasoning), alternating.
async fn target_export_case(
    plan: &Plan,
    server: &Server,
    db: &Database,
    size: usize,
    report: &mut Report,
) -> anyhow::Result<()> {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    // For Claude: its own thinking kept, GPT's dropped; every call paired.
    use sessionstore_client::v1 as pb;
    let target = Some(pb::ExportTarget {
        provider: "anthropic".into(),
        model: "claude-sonnet-4-5".into(),
        reasoning: pb::ReasoningPolicy::SameModel.into(),
    });
    let (mut plain, mut targeted) = (Vec::new(), Vec::new());
    reads::export_reasoning_once(server, size, None).await?;
    reads::export_reasoning_once(server, size, target.clone()).await?;
    let mut sent = 0;
    for _ in 0..plan.export_samples {
        plain.push(ms(reads::export_reasoning_once(server, size, None)
            .await?
            .0));
        let (took, received) = reads::export_reasoning_once(server, size, target.clone()).await?;
        targeted.push(ms(took));
        sent = received;
    }
    let case = format!("{size} messages, a third with reasoning");
    let plain = Spread::of(&plain);
    let targeted = Spread::of(&targeted);
    report.push(Figure::new(
        "export",
        db.backend(),
        "sessionstore ExportHistory",
        &case,
        "ms",
        plain,
    ));
    let ratio = targeted.median / plain.median;
    report.push(
        Figure::new(
            "export",
            db.backend(),
            &format!("sessionstore ExportHistory for a target ({sent} sent)"),
            &case,
            "ms",
            targeted,
        )
        .ratio(ratio, "the plain export")
        .target("≤ 1.2×", ratio <= 1.2),
    );
    Ok(())
}

/// WatchSession's replay of a long event log (one small exchange per
/// event), against ExportHistory of the same messages.
async fn replay_case(
    plan: &Plan,
    server: &Server,
    db: &Database,
    report: &mut Report,
) -> anyhow::Result<()> {
    let exchanges = plan.replay_exchanges;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (mut replay, mut export) = (Vec::new(), Vec::new());
    // The server's CPU over all samples of each: `/proc` counts it in
    // ticks of 10 ms, about half a call, so only the sum is exact enough.
    let (mut replay_cpu, mut export_cpu) = (Duration::ZERO, Duration::ZERO);
    // One unmeasured round of each warms the caches.
    reads::replay_once(server, exchanges).await?;
    reads::export_replay_session(server, exchanges).await?;
    for _ in 0..plan.export_samples {
        let before = server.cpu_time()?;
        replay.push(ms(reads::replay_once(server, exchanges).await?));
        let between = server.cpu_time()?;
        export.push(ms(reads::export_replay_session(server, exchanges).await?));
        let after = server.cpu_time()?;
        replay_cpu += between.saturating_sub(before);
        export_cpu += after.saturating_sub(between);
    }
    let case = format!(
        "{exchanges} exchanges ({} messages) from revision 0",
        2 * exchanges
    );
    let export = Spread::of(&export);
    let replay = Spread::of(&replay);
    report.push(Figure::new(
        "replay",
        db.backend(),
        "sessionstore ExportHistory",
        &case,
        "ms",
        export,
    ));
    let ratio = replay.median / export.median;
    let mut figure = Figure::new(
        "replay",
        db.backend(),
        "sessionstore WatchSession to caught_up",
        &case,
        "ms",
        replay,
    )
    .ratio(ratio, "ExportHistory time");
    // Goal 3's replay, for the session of 5,000 exchanges, not the smoke
    // run's.
    if exchanges >= 5_000 {
        figure = figure.target("≤ 1.2×", ratio <= 1.2);
    }
    report.push(figure);
    // Per call, the mean over the samples.
    let per_call = |cpu: Duration| Spread::of(&[ms(cpu) / plan.export_samples.max(1) as f64]);
    let (replay_cpu, export_cpu) = (per_call(replay_cpu), per_call(export_cpu));
    report.push(Figure::new(
        "replay server CPU",
        db.backend(),
        "sessionstore ExportHistory",
        &case,
        "ms CPU/call",
        export_cpu,
    ));
    report.push(
        Figure::new(
            "replay server CPU",
            db.backend(),
            "sessionstore WatchSession to caught_up",
            &case,
            "ms CPU/call",
            replay_cpu,
        )
        .ratio(replay_cpu.median / export_cpu.median, "ExportHistory's CPU"),
    );
    Ok(())
}

/// Watch delivery on one replica, and on PostgreSQL also across two.
async fn watch_benchmarks(
    plan: &Plan,
    binary: &Path,
    db: &Database,
    report: &mut Report,
) -> anyhow::Result<()> {
    let backend = db.backend();
    eprintln!("== watch on {backend}");
    let one = Server::start(binary, &db.url(), &[]).await?;
    let other = if db.is_postgres() {
        Some(Server::start(binary, &db.url(), &[]).await?)
    } else {
        None
    };
    let mut client = one.connect().await?;
    for &watchers in &plan.watchers {
        let mut replicas = vec![("one replica", &one)];
        if let Some(other) = &other {
            replicas.push(("across two replicas", other));
        }
        for (where_, reader) in replicas {
            let session = format!("bench-watch-{watchers}-{}", where_.len());
            workload::create_session(&mut client, &session, "bench", 0, 0).await?;
            let mut deliveries = watch::delivery(
                &one,
                reader,
                &session,
                watchers,
                plan.watch_appends,
                plan.watch_interval,
            )
            .await?;
            let ms: Vec<f64> = deliveries
                .all
                .iter()
                .map(|d| d.as_secs_f64() * 1e3)
                .collect();
            let latency = Latency::of(&mut deliveries.all);
            let mut figure = Figure::new(
                "watch",
                backend,
                "sessionstore",
                &format!("{watchers} watchers, {where_}"),
                "ms",
                Spread::of(&ms),
            )
            .latency(latency);
            if watchers == 1_000 {
                figure = if reader.port == one.port {
                    figure.target("p99 < 10 ms", latency.p99_ms < 10.0)
                } else {
                    figure.target("p99 < 50 ms", latency.p99_ms < 50.0)
                };
            }
            report.push(figure);
            if watchers > 1 {
                // What the deliveries cost, and how busy they kept the
                // machine.
                let case = format!("{watchers} watchers, {where_}");
                let cpu = [
                    ("watchers' server", deliveries.reader_cpu),
                    ("bench (the watchers' client)", deliveries.client_cpu),
                ];
                for (subject, used) in cpu {
                    let micros = deliveries.micros_per_delivery(used);
                    report.push(Figure::new(
                        "watch CPU",
                        backend,
                        subject,
                        &case,
                        "µs CPU/delivery",
                        Spread::of(&[micros]),
                    ));
                }
                let cores = deliveries.cores_busy();
                report.push(Figure::new(
                    "watch CPU",
                    backend,
                    "watchers' server and bench together",
                    &case,
                    "cores busy",
                    Spread::of(&[cores]),
                ));
                // Where a slow delivery waited: before any watcher heard of
                // the exchange, or in the fan-out to all of them.
                for (subject, mut per_exchange) in [
                    (
                        "sessionstore, each exchange's first delivery",
                        deliveries.first,
                    ),
                    (
                        "sessionstore, each exchange's last delivery",
                        deliveries.last,
                    ),
                ] {
                    let ms: Vec<f64> = per_exchange.iter().map(|d| d.as_secs_f64() * 1e3).collect();
                    report.push(
                        Figure::new(
                            "watch",
                            backend,
                            subject,
                            &format!("{watchers} watchers, {where_}"),
                            "ms",
                            Spread::of(&ms),
                        )
                        .latency(Latency::of(&mut per_exchange)),
                    );
                }
            }
        }
    }
    one.stop().await;
    if let Some(other) = other {
        other.stop().await;
    }
    Ok(())
}

/// What a chat UI does live: the newest page of a long session, and (on
/// PostgreSQL) a CancelRun on one replica reaching the run's producer on
/// another.
async fn live_benchmarks(
    plan: &Plan,
    binary: &Path,
    db: &Database,
    report: &mut Report,
) -> anyhow::Result<()> {
    let backend = db.backend();
    let long = plan.long_session;
    eprintln!(
        "== live on {backend}: filling a session of {long} messages, {} per AppendExchange",
        live::FILL_BATCH
    );
    let one = Server::start(binary, &db.url(), &[]).await?;
    let filling = Instant::now();
    let next = live::fill(&one, "bench-live-long", long).await?;
    anyhow::ensure!(
        next == long as i64,
        "the long session's next sequence is {next}, expected {long}"
    );
    let appended = filling.elapsed();
    live::index_caught_up(&one).await?;
    eprintln!(
        "   filled in {:.1} s ({:.0} messages/s), search index caught up {:.1} s later",
        appended.as_secs_f64(),
        long as f64 / appended.as_secs_f64(),
        (filling.elapsed() - appended).as_secs_f64()
    );
    let short = 10;
    live::fill(&one, "bench-live-short", short).await?;
    live::index_caught_up(&one).await?;
    db.analyze().await?;
    let page = live::PAGE_SIZE;
    for (session, messages, before, label) in [
        ("bench-live-long", long, None, "newest page".to_owned()),
        ("bench-live-short", short, None, "newest page".to_owned()),
        (
            "bench-live-long",
            long,
            Some(plan.deep_before),
            format!("deep page, before sequence {}", plan.deep_before),
        ),
    ] {
        let first = before.unwrap_or(messages as i64) - 1;
        let rows = (first + 1).min(i64::from(page));
        let label = format!("{label} (sequence desc, page_size {page}): {rows} rows");
        let mut took = live::newest_pages(&one, session, before, first, plan.live_samples).await?;
        let ms: Vec<f64> = took.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        let latency = Latency::of(&mut took);
        let mut figure = Figure::new(
            "newest page",
            backend,
            "sessionstore ListMessages, full rows decoded (a real client's work)",
            &format!("session of {messages} messages, {label}"),
            "ms",
            Spread::of(&ms),
        )
        .latency(latency);
        // The target is for a session of 1,000,000, not the smoke run's.
        if messages >= 1_000_000 && before.is_none() {
            figure = figure.target("p99 < 5 ms", latency.p99_ms < 5.0);
        }
        report.push(figure);
    }
    if !db.is_postgres() {
        one.stop().await;
        return Ok(());
    }

    let trials = plan.cancel_trials;
    eprintln!("== live on {backend}: {trials} CancelRun trials across two replicas");
    let other = Server::start(binary, &db.url(), &[]).await?;
    let session = "bench-live-cancel";
    let mut client = one.connect().await?;
    workload::create_session(&mut client, session, "bench", 0, 0).await?;
    let (mut seen, mut calls, mut deltas, mut retries) = (Vec::new(), Vec::new(), 0, 0);
    for trial in 0..trials {
        let run_id = format!("bench-run-{trial}-{}", uuid::Uuid::now_v7());
        // Where in the producer's 20 ms the cancel lands, spread evenly.
        let phase = live::DELTA_INTERVAL * (trial % 10) as u32 / 10;
        let outcome = live::cancel_trial(&one, &other, session, &run_id, phase).await?;
        seen.push(outcome.seen_after);
        calls.push(outcome.cancel_call);
        deltas += outcome.deltas;
        retries += outcome.retries;
    }
    other.stop().await;
    one.stop().await;
    if retries > 0 {
        eprintln!(
            "   replica B refused {retries} CancelRun calls as RUN_NOT_ACTIVE before taking them"
        );
    }
    let case = format!(
        "{trials} runs, a text delta every {} ms on replica A (no lease), CancelRun on replica B \
         after {} deltas and 0–{} ms more",
        live::DELTA_INTERVAL.as_millis(),
        live::DELTAS_BEFORE_CANCEL,
        (live::DELTA_INTERVAL * 9 / 10).as_millis(),
    );
    let detail = format!("{:.1} deltas per run", deltas as f64 / trials as f64);
    let ms = |samples: &[Duration]| -> Vec<f64> {
        samples.iter().map(|d| d.as_secs_f64() * 1e3).collect()
    };
    report.push(
        Figure::new(
            "cancel run",
            backend,
            "CancelRun call on B",
            &case,
            "ms",
            Spread::of(&ms(&calls)),
        )
        .detail(&detail)
        .latency(Latency::of(&mut calls)),
    );
    let latency = Latency::of(&mut seen);
    let mut figure = Figure::new(
        "cancel run",
        backend,
        "B's answer → producer's cancel_requested on A",
        &case,
        "ms",
        Spread::of(&ms(&seen)),
    )
    .detail(&detail)
    .latency(latency);
    if trials >= 50 {
        figure = figure.target("p99 < 100 ms", latency.p99_ms < 100.0);
    }
    report.push(figure);
    Ok(())
}

/// What a billing page asks: SummarizeUsage over a tenant of 1,000,000
/// provider calls written straight into the database, for one user's month
/// and for the whole tenant's.
async fn usage_benchmarks(
    plan: &Plan,
    binary: &Path,
    db: &Database,
    report: &mut Report,
) -> anyhow::Result<()> {
    let backend = db.backend();
    let shape = plan.usage;
    eprintln!(
        "== usage on {backend}: filling {} provider calls over {} sessions of {} users, {} days",
        shape.calls(),
        shape.sessions,
        shape.users,
        shape.days
    );
    usage::migrate(binary, db).await?;
    let filling = Instant::now();
    let written = usage::fill(db, &shape).await?;
    db.analyze().await?;
    eprintln!(
        "   filled in {:.1} s; {} of the calls fall in the month measured",
        filling.elapsed().as_secs_f64(),
        written.month_calls
    );
    let server = Server::start(binary, &db.url(), &[]).await?;
    let case_of = |query: usage::Query| {
        let of = if query == usage::Query::TenantByModel {
            format!("{} calls", written.month_calls)
        } else {
            format!("about {} calls", written.month_calls / shape.users as i64)
        };
        format!(
            "{} provider calls, {} users; {} (January 2026, {of})",
            written.calls,
            shape.users,
            query.label()
        )
    };
    for (query, samples, target_ms) in [
        (usage::Query::UserByDay, plan.usage_user_samples, 50.0),
        (usage::Query::UserByModel, plan.usage_user_samples, 50.0),
        (
            usage::Query::TenantByModel,
            plan.usage_tenant_samples,
            1000.0,
        ),
    ] {
        let outcome = usage::summaries(&server, &written, &shape, query, samples).await;
        let mut took = match outcome {
            Ok(took) => took,
            Err(error) => {
                server.stop().await;
                return Err(error);
            }
        };
        let ms: Vec<f64> = took.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        let latency = Latency::of(&mut took);
        let mut figure = Figure::new(
            "usage",
            backend,
            "sessionstore SummarizeUsage (Client::summarize_usage)",
            &case_of(query),
            "ms",
            Spread::of(&ms),
        )
        .latency(latency);
        // The targets are for 1,000,000 calls, not the smoke run's.
        if written.calls >= 1_000_000 {
            let target = if target_ms >= 1000.0 {
                "p99 < 1 s".to_owned()
            } else {
                format!("p99 < {target_ms:.0} ms")
            };
            figure = figure.target(&target, latency.p99_ms < target_ms);
        }
        report.push(figure);
    }
    server.stop().await;
    Ok(())
}

/// EraseUser of one user's sessions, written straight into the database,
/// while other users' writers keep appending: the erasure's time, and the
/// appends' latency during it against a baseline window just before.
async fn erase_benchmarks(
    plan: &Plan,
    binary: &Path,
    db: &Database,
    report: &mut Report,
) -> anyhow::Result<()> {
    let backend = db.backend();
    let shape = plan.erase;
    eprintln!(
        "== erase on {backend}: filling {} sessions of one user ({} exchanges each)",
        shape.sessions,
        erase::EXCHANGES_EACH
    );
    let written = migrated_and_filled(binary, db, erase::fill(db, &shape)).await?;
    on_server(binary, db, async |server| {
        erase_case(&shape, server, db, &written, report).await
    })
    .await
}

/// Migrates `db`, then writes into it what `fill` writes, saying how long
/// that took and what it wrote.
async fn migrated_and_filled(
    binary: &Path,
    db: &Database,
    fill: impl Future<Output = anyhow::Result<erase::Written>>,
) -> anyhow::Result<erase::Written> {
    usage::migrate(binary, db).await?;
    let filling = Instant::now();
    let written = fill.await?;
    eprintln!(
        "   filled in {:.1} s: {} messages, {} provider calls",
        filling.elapsed().as_secs_f64(),
        written.messages,
        written.calls
    );
    Ok(written)
}

/// Runs `case` against a server started on `db`, then stops the server.
async fn on_server(
    binary: &Path,
    db: &Database,
    case: impl AsyncFnOnce(&Server) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let server = Server::start(binary, &db.url(), &[]).await?;
    let outcome = case(&server).await;
    server.stop().await;
    outcome
}

async fn erase_case(
    shape: &erase::Shape,
    server: &Server,
    db: &Database,
    written: &erase::Written,
    report: &mut Report,
) -> anyhow::Result<()> {
    let backend = db.backend();
    let newest = written.chats.last().context("no session was filled")?;
    let readying = Instant::now();
    let writers = erase::ready(server, db, shape, newest).await?;
    eprintln!(
        "   writers ready, statistics taken and search index caught up in {:.1} s; the server \
         reads the filled sessions as written",
        readying.elapsed().as_secs_f64()
    );
    let run = erase::measure(server, db, written, &writers, shape, erase::Op::EraseUser).await?;
    let expected = (written.chats.len() as i64, written.messages, written.calls);
    let counts = |answer: &sessionstore_client::v1::EraseUserResponse| {
        (
            answer.sessions_deleted,
            answer.messages_deleted,
            answer.provider_calls_deleted,
        )
    };
    // An attempt that failed took its counts with it; the erasures'
    // records hold them (checked below).
    if let (Ok(Some(answer)), true) = (&run.answer, run.failed.is_empty()) {
        anyhow::ensure!(
            counts(answer) == expected,
            "EraseUser answered (sessions, messages, calls) {:?}, the fill wrote {expected:?}",
            counts(answer)
        );
    }
    let took = run.erasure.1 - run.erasure.0;
    match &run.answer {
        Ok(answer) => eprintln!(
            "   EraseUser answered {:?} after {} call(s), {:.2} s from the first",
            answer.as_ref().map(counts),
            run.failed.len() + 1,
            took.as_secs_f64()
        ),
        Err(error) => eprintln!(
            "   no EraseUser call succeeded while the writers ran ({} calls, {:.2} s; the last: \
             {error})",
            run.failed.len() + 1,
            took.as_secs_f64()
        ),
    }
    if let Some((again, answer)) = &run.after_writers {
        match answer {
            Ok(answer) => eprintln!(
                "   with the writers stopped, EraseUser answered {:?} in {:.2} s",
                answer.as_ref().map(counts),
                again.as_secs_f64()
            ),
            Err(error) => eprintln!(
                "   with the writers stopped, EraseUser failed after {:.2} s: {error}",
                again.as_secs_f64()
            ),
        }
    }
    // Where the erasure was, read from the database as it ran.
    let first = |test: &dyn Fn(&erase::Progress) -> bool| {
        run.progress
            .iter()
            .find(|p| test(p))
            .map_or("after the last read".to_owned(), |p| {
                format!("{:.2} s", p.at.as_secs_f64())
            })
    };
    eprintln!(
        "   progress (read every {} ms): no live session left at {}, no message left at {}, \
         no tombstone left at {}",
        erase::POLL.as_millis(),
        first(&|p| p.live == 0),
        first(&|p| p.live == 0 && p.messages == 0),
        first(&|p| p.live == 0 && p.tombstones == 0),
    );
    let mut during = run.during();
    during.sort_by_key(|s| std::cmp::Reverse(s.took));
    let slowest: Vec<String> = during
        .iter()
        .take(5)
        .map(|s| {
            let at = s
                .began
                .saturating_duration_since(run.erasure.0)
                .as_secs_f64()
                - run
                    .erasure
                    .0
                    .saturating_duration_since(s.began)
                    .as_secs_f64();
            format!("{:.0} ms at {at:+.2} s", s.took.as_secs_f64() * 1e3)
        })
        .collect();
    eprintln!(
        "   slowest appends during the erasure (started, from its start): {}",
        slowest.join(", ")
    );
    // The slowest append started in each second of the erasure.
    let seconds = (run.erasure.1 - run.erasure.0).as_secs() as usize + 1;
    let mut worst = vec![(0.0_f64, 0_usize); seconds];
    for sample in &during {
        let second = sample
            .began
            .saturating_duration_since(run.erasure.0)
            .as_secs() as usize;
        if let Some(slot) = worst.get_mut(second) {
            slot.0 = slot.0.max(sample.took.as_secs_f64() * 1e3);
            slot.1 += 1;
        }
    }
    let worst: Vec<String> = worst.iter().map(|(ms, n)| format!("{ms:.0}/{n}")).collect();
    eprintln!(
        "   each second of the erasure, the slowest append started in it (ms) / appends started: {}",
        worst.join(" ")
    );
    let case = format!(
        "{} sessions of one user ({} messages, {} provider calls); {} writers appending to \
         other users' sessions",
        written.chats.len(),
        written.messages,
        written.calls,
        shape.writers,
    );
    // What went wrong in this run, beside the figures (not part of their
    // names, so that --compare pairs them with another run's).
    let mut notes = Vec::new();
    if run.answer.is_err() {
        notes.push("no EraseUser call succeeded".to_owned());
    }
    if !run.failed.is_empty() {
        notes.push(format!(
            "EraseUser called {} times (earlier calls failed: {})",
            run.failed.len() + 1,
            run.failed
                .iter()
                .map(|(at, why)| format!("at {:.1} s, {why}", at.as_secs_f64()))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    let appends_note = run.failed_appends_note();
    if !appends_note.is_empty() {
        notes.push(appends_note.trim_start_matches("; ").to_owned());
    }
    let notes = notes.join("; ");
    report.push(
        Figure::new(
            "erase",
            backend,
            "sessionstore EraseUser (Client::erase_user), until answered",
            &case,
            "s",
            Spread::of(&[took.as_secs_f64()]),
        )
        .detail(&notes),
    );
    let ms = |samples: &[Duration]| -> Vec<f64> {
        samples.iter().map(|d| d.as_secs_f64() * 1e3).collect()
    };
    let (baseline, figure) = append_figures(
        ("erase", "erasure", "EraseUser"),
        backend,
        &case,
        shape,
        &run,
    );
    let mut figure = figure.detail(&notes);
    report.push(baseline);
    // The target is for a user of 10,000 sessions, not the smoke run's.
    if written.chats.len() >= 10_000 {
        let max_ms = figure.latency.unwrap_or_default().max_ms;
        figure = figure.target("max < 500 ms", max_ms < 500.0);
    }
    report.push(figure);
    let mut quiet = run.searches_baseline();
    report.push(
        Figure::new(
            "erase",
            backend,
            &format!(
                "SearchMessages (one client, every {} ms), no erasure running",
                erase::SEARCH_EVERY.as_millis()
            ),
            &case,
            "ms",
            Spread::of(&ms(&quiet)),
        )
        .latency(Latency::of(&mut quiet)),
    );
    let searches = run.searches_during();
    let failed_searches = searches.iter().filter(|s| s.failed).count();
    let mut searches: Vec<Duration> = searches.iter().map(|s| s.took).collect();
    report.push(
        Figure::new(
            "erase",
            backend,
            &format!(
                "SearchMessages (one client, every {} ms) while EraseUser runs",
                erase::SEARCH_EVERY.as_millis(),
            ),
            &case,
            "ms",
            Spread::of(&ms(&searches)),
        )
        .detail(&if failed_searches == 0 {
            String::new()
        } else {
            format!("{failed_searches} searches failed")
        })
        .latency(Latency::of(&mut searches)),
    );
    if let Some((again, answer)) = &run.after_writers {
        report.push(
            Figure::new(
                "erase",
                backend,
                "sessionstore EraseUser once more, the writers stopped",
                &case,
                "s",
                Spread::of(&[again.as_secs_f64()]),
            )
            .detail(&match answer {
                Ok(_) => "answered".to_owned(),
                Err(error) => format!("failed: {error}"),
            }),
        );
    }
    let gone = erase::check_gone(db, written).await?;
    eprintln!("   {gone}");
    erase::check_writers(server, &writers, shape, &run).await
}

/// DeleteSession of one long session (written straight into the database)
/// while other users' writers keep appending, as the erase benchmark runs
/// EraseUser: how long the deletion takes, and the appends' latency during
/// it against a baseline window just before.
async fn delete_benchmarks(
    plan: &Plan,
    binary: &Path,
    db: &Database,
    report: &mut Report,
) -> anyhow::Result<()> {
    let backend = db.backend();
    let exchanges = plan.delete_exchanges;
    eprintln!(
        "== delete on {backend}: filling one session of {} messages",
        2 * exchanges
    );
    let written = migrated_and_filled(binary, db, erase::fill_one(db, exchanges)).await?;
    on_server(binary, db, async |server| {
        delete_case(&plan.erase, server, db, &written, report).await
    })
    .await
}

async fn delete_case(
    shape: &erase::Shape,
    server: &Server,
    db: &Database,
    written: &erase::Written,
    report: &mut Report,
) -> anyhow::Result<()> {
    let backend = db.backend();
    let chat = written.chats.first().context("no session was filled")?;
    let writers = erase::ready(server, db, shape, chat).await?;
    let op = erase::Op::DeleteSession(chat.id.clone());
    let run = erase::measure(server, db, written, &writers, shape, op).await?;
    let took = run.erasure.1 - run.erasure.0;
    if let Err(error) = &run.answer {
        anyhow::bail!("DeleteSession failed: {error}");
    }
    eprintln!("   DeleteSession answered in {:.2} s", took.as_secs_f64());
    let case = format!(
        "one session of {} messages and {} provider calls; {} writers appending to other \
         sessions",
        written.messages, written.calls, shape.writers,
    );
    let note = run.failed_appends_note();
    let note = note.trim_start_matches("; ");
    report.push(
        Figure::new(
            "delete",
            backend,
            "sessionstore DeleteSession, until answered",
            &case,
            "s",
            Spread::of(&[took.as_secs_f64()]),
        )
        .detail(note),
    );
    let (baseline, during) = append_figures(
        ("delete", "deletion", "DeleteSession"),
        backend,
        &case,
        shape,
        &run,
    );
    report.push(baseline);
    report.push(during.detail(note));
    let gone = erase::check_deleted(db, written).await?;
    eprintln!("   {gone}");
    erase::check_writers(server, &writers, shape, &run).await
}

/// The writers' appends of `run` as two figures of `kind`: those started
/// in the baseline window just before the `operation` (an `activity`)
/// was called, and every one in flight while it ran.
fn append_figures(
    (kind, activity, operation): (&str, &str, &str),
    backend: &'static str,
    case: &str,
    shape: &erase::Shape,
    run: &erase::Run,
) -> (Figure, Figure) {
    let ms = |samples: &[Duration]| -> Vec<f64> {
        samples.iter().map(|d| d.as_secs_f64() * 1e3).collect()
    };
    let mut baseline = run.baseline();
    let before = Figure::new(
        kind,
        backend,
        &format!(
            "AppendExchange, no {activity} running ({:.1} s just before)",
            shape.baseline.as_secs_f64()
        ),
        case,
        "ms",
        Spread::of(&ms(&baseline)),
    )
    .latency(Latency::of(&mut baseline));
    let mut during: Vec<Duration> = run.during().iter().map(|s| s.took).collect();
    let while_it_runs = Figure::new(
        kind,
        backend,
        &format!("AppendExchange while {operation} runs"),
        case,
        "ms",
        Spread::of(&ms(&during)),
    )
    .latency(Latency::of(&mut during));
    (before, while_it_runs)
}

/// Cost that does not grow with size: appends to a session of 1,000,000
/// messages against appends to one of 10, and ListSessions in a tenant of
/// 1,000,000 sessions, all written straight into the database.
async fn scale_benchmarks(
    plan: &Plan,
    binary: &Path,
    db: &Database,
    report: &mut Report,
) -> anyhow::Result<()> {
    let backend = db.backend();
    let shape = plan.scale;
    eprintln!(
        "== scale on {backend}: filling {} sessions, one of {} messages and one of {}",
        shape.sessions, shape.long_messages, shape.short_messages
    );
    usage::migrate(binary, db).await?;
    let filling = Instant::now();
    let written = scale::fill(db, &shape).await?;
    let filled = filling.elapsed();
    db.analyze().await?;
    eprintln!(
        "   filled in {:.1} s, analyzed {:.1} s later",
        filled.as_secs_f64(),
        (filling.elapsed() - filled).as_secs_f64()
    );
    let server = Server::start(binary, &db.url(), &[]).await?;
    let outcome = scale_case(plan, &server, &written, backend, report).await;
    server.stop().await;
    outcome
}

async fn scale_case(
    plan: &Plan,
    server: &Server,
    written: &scale::Written,
    backend: &'static str,
    report: &mut Report,
) -> anyhow::Result<()> {
    // SQLite builds its search file from every message at the first start.
    let indexing = Instant::now();
    live::index_caught_up(server).await?;
    eprintln!(
        "   search index caught up {:.1} s after the server started",
        indexing.elapsed().as_secs_f64()
    );
    history::verify(server, &written.long).await?;
    history::verify(server, &written.short).await?;
    history::verify(server, &written.newest).await?;
    eprintln!("   the server reads the filled sessions as written");

    let samples = plan.scale_samples;
    let (mut long, mut short) = scale::appends(server, written, samples).await?;
    let ms = |samples: &[Duration]| -> Vec<f64> {
        samples.iter().map(|d| d.as_secs_f64() * 1e3).collect()
    };
    let (long_ms, short_ms) = (ms(&long), ms(&short));
    let (long_latency, short_latency) = (Latency::of(&mut long), Latency::of(&mut short));
    let case_of = |messages: i64| {
        format!(
            "session of {messages} messages, {samples} appends, one client alternating with the \
             session of {}",
            if messages == written.long.messages() {
                written.short.messages()
            } else {
                written.long.messages()
            }
        )
    };
    let p50_ratio = long_latency.p50_ms / short_latency.p50_ms;
    let p99_ratio = long_latency.p99_ms / short_latency.p99_ms;
    let at_scale = written.long.messages() >= 1_000_000;
    let subject = "sessionstore AppendExchange (Client::append_exchange)";
    report.push(
        Figure::new(
            "scale append",
            backend,
            subject,
            &case_of(written.short.messages()),
            "ms",
            Spread::of(&short_ms),
        )
        .latency(short_latency),
    );
    let mut figure = Figure::new(
        "scale append",
        backend,
        subject,
        &case_of(written.long.messages()),
        "ms",
        Spread::of(&long_ms),
    )
    .latency(long_latency)
    .ratio(p50_ratio, "p50 ÷ the short session's p50");
    if at_scale {
        figure = figure.target("p50 ≤ 1.2×", p50_ratio <= 1.2);
    }
    report.push(figure);
    let mut figure = Figure::new(
        "scale append",
        backend,
        "p99 of the long session's appends ÷ p99 of the short one's",
        &case_of(written.long.messages()),
        "×",
        Spread::of(&[p99_ratio]),
    )
    .ratio(p99_ratio, "p99 ÷ the short session's p99");
    if at_scale {
        figure = figure.target("p99 ≤ 1.2×", p99_ratio <= 1.2);
    }
    report.push(figure);

    let sessions = written.sessions + 2;
    for (page, token) in [
        ("first page".to_owned(), String::new()),
        (
            format!("page {} (deep)", plan.deep_pages + 1),
            reads::token_after(server, plan.deep_pages).await?,
        ),
    ] {
        let mut took = reads::list_pages(server, &token, "", plan.list_samples).await?;
        let ms = ms(&took);
        let latency = Latency::of(&mut took);
        let mut figure = Figure::new(
            "scale list",
            backend,
            "sessionstore ListSessions",
            &format!("{sessions} sessions, {page} of {}", reads::PAGE_SIZE),
            "ms",
            Spread::of(&ms),
        )
        .latency(latency);
        // The target is for 1,000,000 sessions, not the smoke run's.
        if written.sessions >= 1_000_000 {
            figure = figure.target("p99 < 5 ms", latency.p99_ms < 5.0);
        }
        report.push(figure);
    }
    Ok(())
}

async fn memory_benchmark(
    plan: &Plan,
    binary: &Path,
    db: &Database,
    report: &mut Report,
) -> anyhow::Result<()> {
    eprintln!("== memory: {} idle watch streams", plan.idle_streams);
    let limit = (plan.idle_streams * 2).to_string();
    let server = Server::start(
        binary,
        &db.url(),
        &["--max-watch-streams-per-tenant", &limit],
    )
    .await?;
    let (per_stream, before, after) =
        watch::idle_stream_memory(&server, plan.idle_streams, plan.idle_sessions).await?;
    server.stop().await;
    let mut figure = Figure::new(
        "memory",
        db.backend(),
        "sessionstore",
        &format!(
            "{} idle watch streams, {} per connection",
            plan.idle_streams,
            watch::STREAMS_PER_CONNECTION,
        ),
        "bytes/stream",
        Spread::of(&[per_stream]),
    )
    .detail(&format!(
        "RSS {:.1} → {:.1} MiB",
        before as f64 / 1048576.0,
        after as f64 / 1048576.0
    ));
    // The target is for 10,000 streams: with fewer (the smoke run's 200),
    // the server's fixed growth is shared by too few to mean anything.
    if plan.idle_streams >= 10_000 {
        figure = figure.target("≤ 10 KB", per_stream <= 10_240.0);
    }
    report.push(figure);

    let (streams, messages, message_bytes) = (plan.stalled_streams, plan.stalled_messages, 250_000);
    eprintln!("== memory: {streams} stalled WatchSession replays");
    let server = Server::start(binary, &db.url(), &[]).await?;
    let (per_stream, before, after) =
        watch::stalled_replay_memory(&server, streams, messages, message_bytes).await?;
    server.stop().await;
    report.push(
        Figure::new(
            "memory",
            db.backend(),
            "sessionstore",
            &format!(
                "{streams} stalled WatchSession replays from revision 0, 64 KB window, of {messages} \
                 messages of {} KB",
                message_bytes / 1000,
            ),
            "bytes/stalled stream",
            Spread::of(&[per_stream]),
        )
        .detail(&format!(
            "RSS {:.1} → {:.1} MiB",
            before as f64 / 1048576.0,
            after as f64 / 1048576.0
        ))
        .target("≤ 16 MiB", per_stream <= 16.0 * 1048576.0),
    );
    Ok(())
}

/// Round trips (add one item, then read the whole history back) through
/// three agent frameworks' session APIs, one client each: sessionstore's
/// adapters on a server on each backend, and the stores the frameworks
/// ship, in one Python process (`bench/agents/run.sh`). The servers'
/// databases and the PostgreSQL peers' are made here and removed after.
async fn agents_benchmark(
    plan: &Plan,
    binary: &Path,
    postgres: Option<&str>,
    only: Option<Backend>,
    report: &mut Report,
) -> anyhow::Result<()> {
    eprintln!("== agents (Python; first run installs a venv)");
    let mut servers_dbs = Vec::new();
    let mut peers_db = None;
    let outcome = agents_cases(
        plan,
        binary,
        postgres,
        only,
        &mut servers_dbs,
        &mut peers_db,
        report,
    )
    .await;
    for db in servers_dbs.into_iter().chain(peers_db) {
        db.remove().await?;
    }
    outcome
}

async fn agents_cases(
    plan: &Plan,
    binary: &Path,
    postgres: Option<&str>,
    only: Option<Backend>,
    servers_dbs: &mut Vec<Database>,
    peers_db: &mut Option<Database>,
    report: &mut Report,
) -> anyhow::Result<()> {
    for backend in backends(only) {
        match (backend, postgres) {
            ("sqlite", _) => servers_dbs.push(Database::sqlite("agents")?),
            (_, Some(url)) => servers_dbs.push(Database::postgres(url, "agents").await?),
            (_, None) => {}
        }
    }
    // The PostgreSQL peers' database, on the same server as sessionstore's.
    if let Some(url) = postgres {
        *peers_db = Some(Database::postgres(url, "agents_peers").await?);
    }
    let mut servers = Vec::new();
    for db in servers_dbs.iter() {
        servers.push(Server::start(binary, &db.url(), &[]).await?);
    }
    let places = peers::AgentsPlaces {
        servers: servers_dbs
            .iter()
            .zip(&servers)
            .map(|(db, server)| (db.backend(), server.endpoint(), db.url()))
            .collect(),
        peer_postgres_url: peers_db.as_ref().map(Database::url),
    };
    let workspace = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let run = peers::agents(workspace, &places, &plan.agents).await;
    for server in servers {
        server.stop().await;
    }
    let run = run?;
    report
        .skipped
        .extend(run.skipped.iter().map(|s| format!("agents: {s}")));
    let case = |row: &peers::AgentsRow| {
        format!(
            "{}, {} a session from empty, 1 client",
            row.round_trip, run.round_trips
        )
    };
    let figure = |row: &peers::AgentsRow, subject: &str, case: &str| {
        Figure::new(
            "agents",
            &row.backend,
            &format!("{subject} ({} {})", row.distribution, row.version),
            case,
            "round trips/s",
            row.per_sec.spread(row.runs),
        )
        .latency(Latency {
            p50_ms: row.p50_ms,
            p99_ms: row.p99_ms,
            max_ms: row.max_ms,
            samples: row.samples,
        })
    };
    let calls = |row: &peers::AgentsRow| {
        format!(
            "add p50 {:.2} ms, read p50 {:.2} ms",
            row.add_p50_ms, row.read_p50_ms
        )
    };
    let peers: Vec<&peers::AgentsRow> = run.rows.iter().filter(|r| r.role == "peer").collect();
    for peer in &peers {
        let mut detail = calls(peer);
        if let Some(note) = agents_durability(peer) {
            detail = format!("{detail}; {note}");
        }
        report.push(figure(peer, &peer.subject, &case(peer)).detail(&detail));
    }
    for ours in run.rows.iter().filter(|r| r.role == "sessionstore") {
        for peer in peers.iter().filter(|p| p.framework == ours.framework) {
            let ratio = ours.per_sec.median / peer.per_sec.median;
            let mut detail = calls(ours);
            if let Some(note) = agents_durability(peer) {
                detail = format!("{detail}; {note}");
            }
            let mut row = figure(
                ours,
                &format!("sessionstore {}", ours.subject),
                &format!("{}; against {}", case(ours), peer.subject),
            )
            .detail(&detail)
            .ratio(ratio, &format!("÷ {} ({})", peer.subject, peer.backend));
            if let Some(goal) = agents_goal(&peer.subject).filter(|_| plan.agents_targets) {
                row = row.target(&format!("≥ {goal}×"), ratio >= goal);
            }
            report.push(row);
        }
    }
    Ok(())
}

/// How far ahead of a framework's own store sessionstore's adapter should
/// be, one client each: 2× the PostgreSQL stores, 0.5× Redis (which keeps
/// its data in memory and acknowledges before it reaches disk); none for
/// `SQLiteSession`, an in-process file, kept as a reference.
fn agents_goal(peer: &str) -> Option<f64> {
    match peer {
        "SQLAlchemySession" | "DatabaseSessionService" | "PostgresChatMessageHistory" => Some(2.0),
        "RedisSession" => Some(0.5),
        _ => None,
    }
}

/// What a reader must know about a peer's acknowledgement beside its rate.
fn agents_durability(peer: &peers::AgentsRow) -> Option<&'static str> {
    (peer.backend == "redis").then_some(
        "Redis (appendonly, appendfsync everysec) acknowledges before its writes reach disk, \
         sessionstore after",
    )
}

async fn peer_benchmarks(
    plan: &Plan,
    postgres: Option<&str>,
    append_rates: &AppendRates,
    export_ms: &HashMap<(&'static str, usize), f64>,
    report: &mut Report,
) -> anyhow::Result<()> {
    eprintln!("== peers (Python, in-process; first run installs a venv)");
    let workspace = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let peer_plan = peers::PeerPlan {
        warmup: plan.timing.warmup.as_secs_f64(),
        seconds: plan.timing.measure.as_secs_f64(),
        repeat: plan.repeat,
        repeat_later: plan.repeat_later_shapes,
        clients: &plan.clients,
        shapes: &plan.shapes,
        read_sizes: &plan.export_sizes,
    };
    let run = peers::run(workspace, postgres, &peer_plan).await?;
    report
        .skipped
        .extend(run.skipped.iter().map(|s| format!("peers: {s}")));
    for peer in &run.peers {
        let backend = peer_backend(peer);
        let subject = format!("{} {}", peer.name, peer.version);
        // At each client count the peer ran at, against sessionstore at the
        // same count, with the same exchange: twice, against sessionstore
        // as deployed (search on, the default: it indexes every message,
        // which no peer does), and like for like (--search off).
        for append in &peer.append {
            let clients = append.concurrency;
            let shape = peer_shape(append)?;
            for search in [Search::On, Search::Off] {
                let mut figure = Figure::new(
                    "peer append",
                    backend,
                    &subject,
                    &format!(
                        "{}; sessionstore {}",
                        append_case_name(clients, Writers::Many, shape),
                        search.label()
                    ),
                    "exchanges/s",
                    append.exchanges_per_sec.spread(append.runs),
                )
                .latency(Latency {
                    p50_ms: append.p50_ms,
                    p99_ms: append.p99_ms,
                    ..Latency::default()
                });
                if let Some(ours) = append_rates.get(&(backend, search, shape, clients)) {
                    let ratio = ours / append.exchanges_per_sec.median;
                    figure = figure.ratio(ratio, "sessionstore at the same clients ÷ this");
                    if let Some(goal) = peer_goal(&peer.name, backend, search, clients) {
                        figure = figure.target(&format!("≥ {goal:.1}×"), ratio >= goal);
                    }
                }
                report.push(figure);
            }
        }
        // Each side at its own best client count: a separate figure, held
        // to no goal.
        for &shape in &plan.shapes {
            let Some(best) = peer_best(peer, shape) else {
                continue;
            };
            for search in [Search::On, Search::Off] {
                let Some((clients, ours)) = ours_best(plan, append_rates, backend, search, shape)
                else {
                    continue;
                };
                report.push(
                    Figure::new(
                        "peer append",
                        backend,
                        &subject,
                        &format!(
                            "best vs best, many sessions, {}; sessionstore {}",
                            shape.label(),
                            search.label()
                        ),
                        "exchanges/s",
                        best.exchanges_per_sec.spread(best.runs),
                    )
                    .detail(&format!(
                        "this at {} workers, sessionstore at {clients} clients",
                        best.concurrency
                    ))
                    .ratio(
                        ours / best.exchanges_per_sec.median,
                        "sessionstore's best ÷ this's best",
                    ),
                );
            }
        }
        for read in &peer.read {
            let mut figure = Figure::new(
                "peer read",
                backend,
                &subject,
                &format!("{} messages", read.messages),
                "ms",
                read.ms.spread(plan.repeat),
            );
            if let Some(ours) = export_ms.get(&(backend, read.messages)) {
                figure = figure.ratio(read.ms.median / ours, "this ÷ sessionstore ExportHistory");
            }
            report.push(figure);
        }
    }
    for backend in ["sqlite", "postgres"] {
        if let Some(table) = peer_table(plan, append_rates, &run, backend)? {
            report.tables.push(table);
        }
    }
    Ok(())
}

fn peer_backend(peer: &peers::Peer) -> &'static str {
    if peer.database.contains("postgres") {
        "postgres"
    } else {
        "sqlite"
    }
}

/// The shape a peer's append run wrote, from its name.
fn peer_shape(append: &peers::PeerAppend) -> anyhow::Result<workload::Shape> {
    <workload::Shape as ValueEnum>::from_str(&append.shape, false)
        .map_err(|error| anyhow::anyhow!("the peers' shape {:?}: {error}", append.shape))
}

/// A peer's fastest append run of `shape` over the client counts.
fn peer_best(peer: &peers::Peer, shape: workload::Shape) -> Option<&peers::PeerAppend> {
    peer.append
        .iter()
        .filter(|append| peer_shape(append).ok() == Some(shape))
        .max_by(|a, b| {
            a.exchanges_per_sec
                .median
                .total_cmp(&b.exchanges_per_sec.median)
        })
}

/// sessionstore's fastest client count with `shape`, and its rate.
fn ours_best(
    plan: &Plan,
    append_rates: &AppendRates,
    backend: &'static str,
    search: Search,
    shape: workload::Shape,
) -> Option<(usize, f64)> {
    plan.clients
        .iter()
        .filter_map(|&clients| {
            let rate = append_rates.get(&(backend, search, shape, clients))?;
            Some((clients, *rate))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

/// One backend's peers beside sessionstore, a row per shape and client
/// count: sessionstore's rates with search on and off, each peer's at the
/// same count and sessionstore's ÷ it (with the goal's mark where one
/// holds), then each shape's best against best.
fn peer_table(
    plan: &Plan,
    append_rates: &AppendRates,
    run: &peers::PeerRun,
    backend: &'static str,
) -> anyhow::Result<Option<report::Table>> {
    let peers: Vec<&peers::Peer> = run
        .peers
        .iter()
        .filter(|peer| peer_backend(peer) == backend)
        .collect();
    if peers.is_empty() {
        return Ok(None);
    }
    let mut header: Vec<String> = [
        "shape",
        "clients",
        "sessionstore, search on",
        "sessionstore, --search off",
    ]
    .map(str::to_owned)
    .to_vec();
    for peer in &peers {
        header.push(peer.name.clone());
        header.push("search on ÷ it".to_owned());
        header.push("--search off ÷ it".to_owned());
    }
    let rate = |rate: Option<f64>| rate.map_or("–".to_owned(), |rate| format!("{rate:.0}"));
    let versus = |ours: Option<f64>, theirs: f64, goal: Option<f64>| match ours {
        None => "–".to_owned(),
        Some(ours) => {
            let ratio = ours / theirs;
            match goal {
                Some(goal) if ratio >= goal => format!("{ratio:.2}× ✓ (≥ {goal:.1}×)"),
                Some(goal) => format!("{ratio:.2}× ✗ (≥ {goal:.1}×)"),
                None => format!("{ratio:.2}×"),
            }
        }
    };
    let mut rows = Vec::new();
    for &shape in &plan.shapes {
        for &clients in &plan.clients {
            let on = append_rates
                .get(&(backend, Search::On, shape, clients))
                .copied();
            let off = append_rates
                .get(&(backend, Search::Off, shape, clients))
                .copied();
            let mut row = vec![
                shape.name().to_owned(),
                clients.to_string(),
                rate(on),
                rate(off),
            ];
            for peer in &peers {
                let mut theirs = None;
                for append in &peer.append {
                    if append.concurrency == clients && peer_shape(append)? == shape {
                        theirs = Some(append.exchanges_per_sec.median);
                    }
                }
                match theirs {
                    Some(theirs) => row.extend([
                        format!("{theirs:.0}"),
                        versus(
                            on,
                            theirs,
                            peer_goal(&peer.name, backend, Search::On, clients),
                        ),
                        versus(
                            off,
                            theirs,
                            peer_goal(&peer.name, backend, Search::Off, clients),
                        ),
                    ]),
                    None => row.extend(["–", "–", "–"].map(str::to_owned)),
                }
            }
            rows.push(row);
        }
        let best = |search| ours_best(plan, append_rates, backend, search, shape);
        let (on, off) = (best(Search::On), best(Search::Off));
        let shown = |best: Option<(usize, f64)>| {
            best.map_or("–".to_owned(), |(clients, rate)| {
                format!("{rate:.0} ({clients})")
            })
        };
        let mut row = vec![
            shape.name().to_owned(),
            "best vs best".to_owned(),
            shown(on),
            shown(off),
        ];
        for peer in &peers {
            match peer_best(peer, shape) {
                Some(theirs) => {
                    let rate = theirs.exchanges_per_sec.median;
                    row.extend([
                        format!("{rate:.0} ({})", theirs.concurrency),
                        versus(on.map(|(_, ours)| ours), rate, None),
                        versus(off.map(|(_, ours)| ours), rate, None),
                    ]);
                }
                None => row.extend(["–", "–", "–"].map(str::to_owned)),
            }
        }
        rows.push(row);
    }
    Ok(Some(report::Table {
        title: format!(
            "peer append on {backend}: exchanges/s, many sessions, sessionstore ÷ each peer at the same client count"
        ),
        header,
        rows,
        note: "Medians. Search on: sessionstore as deployed (it indexes every message; no peer \
               does); --search off: like for like. A best-vs-best row sets each side's fastest \
               client count (in brackets) against the other's; it is held to no goal."
            .to_owned(),
    }))
}
