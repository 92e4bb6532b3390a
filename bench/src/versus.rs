//! `--vs`: two server builds measured in one run, alternating, so that a
//! machine's drift (a busy neighbour, a warming cache) falls on both alike.
//!
//! Each build serves a database of its own on the same backend, filled the
//! same way. Every repetition of an append case runs both builds, the order
//! flipped from one repetition to the next; every replay sample reads both.
//! The figures name the builds `A` (`--server-bin`) and `B` (`--vs`), and
//! B's carry the ratio to A's.

use std::path::Path;
use std::time::Duration;

use crate::append::Spread as Writers;
use crate::report::{Figure, Report};
use crate::server::{Database, Server};
use crate::stats::{Spread, Throughput};
use crate::{Bench, Plan, Search, append, fresh_database, reads};

/// The two builds compared, and how both run.
pub struct Builds<'a> {
    /// A (`--server-bin`) and B (`--vs`).
    pub binaries: [&'a Path; 2],
    /// The `--search` both run with (`--vs-search`).
    pub search: Search,
}

impl Builds<'_> {
    /// The server options both builds start with.
    fn options(&self) -> &'static [&'static str] {
        match self.search {
            Search::On => &[],
            Search::Off => &["--search", "off"],
        }
    }
}

/// The two builds compared, each with its database.
struct Pair<'a> {
    a: (&'a Server, &'a Database),
    b: (&'a Server, &'a Database),
}

impl<'a> Pair<'a> {
    /// Both sides, A first on even `round`s and B first on odd ones.
    fn in_turn(&self, round: usize) -> [(usize, &'a Server, &'a Database); 2] {
        let a = (0, self.a.0, self.a.1);
        let b = (1, self.b.0, self.b.1);
        if round.is_multiple_of(2) {
            [a, b]
        } else {
            [b, a]
        }
    }
}

/// Runs the comparison on `backend` (`postgres` is the admin URL when the
/// backend is PostgreSQL): appends and the replay, as `--only` selects.
pub async fn benchmarks(
    plan: &Plan,
    builds: &Builds<'_>,
    backend: &str,
    postgres: Option<&str>,
    report: &mut Report,
) -> anyhow::Result<()> {
    let dbs = [
        fresh_database(backend, postgres, "vs_a").await?,
        fresh_database(backend, postgres, "vs_b").await?,
    ];
    let outcome = compare(plan, builds, &dbs, report).await;
    for db in dbs {
        db.remove().await?;
    }
    outcome
}

async fn compare(
    plan: &Plan,
    builds: &Builds<'_>,
    dbs: &[Database; 2],
    report: &mut Report,
) -> anyhow::Result<()> {
    let servers = [
        Server::start(builds.binaries[0], &dbs[0].url(), builds.options()).await?,
        Server::start(builds.binaries[1], &dbs[1].url(), builds.options()).await?,
    ];
    let pair = Pair {
        a: (&servers[0], &dbs[0]),
        b: (&servers[1], &dbs[1]),
    };
    let outcome = async {
        if plan.runs(Bench::Append) {
            appends(plan, &pair, builds.search, report).await?;
        }
        if plan.runs(Bench::Export) {
            replay(plan, &pair, report).await?;
        }
        anyhow::Ok(())
    }
    .await;
    for server in servers {
        server.stop().await;
    }
    outcome
}

/// AppendExchange, many sessions, at each client count.
async fn appends(
    plan: &Plan,
    pair: &Pair<'_>,
    search: Search,
    report: &mut Report,
) -> anyhow::Result<()> {
    let backend = pair.a.1.backend();
    eprintln!("== append on {backend}, A and B alternating");
    let max_clients = plan.clients.iter().copied().max().unwrap_or(1);
    for (server, db) in [pair.a, pair.b] {
        append::prepare(server, db, max_clients, plan.prefill).await?;
        db.analyze().await?;
    }
    for &clients in &plan.clients {
        let mut runs = [Vec::new(), Vec::new()];
        for round in 0..plan.repeat {
            for (side, server, _) in pair.in_turn(round) {
                runs[side]
                    .push(append::service(server, clients, Writers::Many, plan.timing).await?);
            }
        }
        let [a, b] = runs.map(Throughput::of);
        let case = match search {
            Search::On => format!("{clients} clients, {}", Writers::Many.label()),
            Search::Off => format!("{clients} clients, {}, --search off", Writers::Many.label()),
        };
        let figure = |subject: &str, unit: &str, value: Spread| {
            Figure::new("append, A and B", backend, subject, &case, unit, value)
        };
        report.push(figure("A", "exchanges/s", a.per_second).latency(a.latency));
        report.push(
            figure("B", "exchanges/s", b.per_second)
                .latency(b.latency)
                .ratio(b.per_second.median / a.per_second.median, "A's rate"),
        );
        if let (Some(a_cpu), Some(b_cpu)) = (a.cpu_micros, b.cpu_micros) {
            report.push(figure("A, server CPU", "µs CPU/exchange", a_cpu));
            report.push(
                figure("B, server CPU", "µs CPU/exchange", b_cpu)
                    .ratio(b_cpu.median / a_cpu.median, "A's CPU"),
            );
        }
    }
    Ok(())
}

/// WatchSession from revision 0 to `caught_up`, and the server's CPU for
/// it.
async fn replay(plan: &Plan, pair: &Pair<'_>, report: &mut Report) -> anyhow::Result<()> {
    let backend = pair.a.1.backend();
    eprintln!("== replay on {backend}, A and B alternating");
    let exchanges = plan.replay_exchanges;
    for (server, db) in [pair.a, pair.b] {
        reads::prepare_replay(server, exchanges).await?;
        db.analyze().await?;
        // One unmeasured replay warms the caches.
        reads::replay_once(server, exchanges).await?;
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut times = [Vec::new(), Vec::new()];
    let mut cpu = [Duration::ZERO; 2];
    for round in 0..plan.export_samples {
        for (side, server, _) in pair.in_turn(round) {
            let before = server.cpu_time()?;
            times[side].push(ms(reads::replay_once(server, exchanges).await?));
            cpu[side] += server.cpu_time()?.saturating_sub(before);
        }
    }
    let case = format!(
        "{exchanges} exchanges ({} messages) from revision 0",
        2 * exchanges
    );
    let [a, b] = times.map(|t| Spread::of(&t));
    // `/proc` counts CPU in ticks of 10 ms: the mean over the samples.
    let [a_cpu, b_cpu] = cpu.map(|cpu| Spread::of(&[ms(cpu) / plan.export_samples.max(1) as f64]));
    let figure = |subject: &str, unit: &str, value: Spread| {
        Figure::new("replay, A and B", backend, subject, &case, unit, value)
    };
    report.push(figure("A", "ms", a));
    report.push(figure("B", "ms", b).ratio(b.median / a.median, "A's time"));
    report.push(figure("A, server CPU", "ms CPU/call", a_cpu));
    let b_figure = figure("B, server CPU", "ms CPU/call", b_cpu);
    // A short replay can take less than one tick in all.
    report.push(if a_cpu.median > 0.0 {
        b_figure.ratio(b_cpu.median / a_cpu.median, "A's CPU")
    } else {
        b_figure
    });
    Ok(())
}
