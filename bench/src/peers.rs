//! The libraries users would pick instead, measured in-process in Python
//! by `bench/peers/run.sh` (which makes its own throwaway venv) on the same
//! machine and databases, with the same exchange.

use std::path::Path;
use std::process::Stdio;

use anyhow::Context as _;
use serde::Deserialize;

use crate::stats::Spread;
use crate::workload::Shape;

#[derive(Debug, Deserialize)]
pub struct PeerRun {
    pub peers: Vec<Peer>,
    #[serde(default)]
    pub skipped: Vec<String>,
}

#[derive(Debug, Deserialize)]
pub struct Peer {
    pub name: String,
    pub database: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub append: Vec<PeerAppend>,
    #[serde(default)]
    pub read: Vec<PeerRead>,
}

#[derive(Debug, Deserialize)]
pub struct PeerAppend {
    pub concurrency: usize,
    /// The exchange's [`Shape`] by its name (`small`, `1kb`).
    pub shape: String,
    /// The runs the spread is of.
    pub runs: usize,
    pub exchanges_per_sec: PeerSpread,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

#[derive(Debug, Deserialize)]
pub struct PeerRead {
    pub messages: usize,
    pub ms: PeerSpread,
}

#[derive(Clone, Copy, Debug, Deserialize)]
pub struct PeerSpread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl PeerSpread {
    pub fn spread(self, runs: usize) -> Spread {
        Spread {
            median: self.median,
            min: self.min,
            max: self.max,
            runs,
        }
    }
}

/// What `bench/agents/run.sh` prints: one row per framework session store
/// measured (sessionstore's adapters on each server, and the peers).
#[derive(Debug, Deserialize)]
pub struct AgentsRun {
    pub rows: Vec<AgentsRow>,
    #[serde(default)]
    pub skipped: Vec<String>,
    /// Round trips a measured session gets, from empty.
    pub round_trips: usize,
}

#[derive(Debug, Deserialize)]
pub struct AgentsRow {
    /// `openai-agents`, `google-adk`, `langchain`.
    pub framework: String,
    /// The class: `SessionstoreSession`, `SQLAlchemySession`, …
    pub subject: String,
    /// `sessionstore` for sessionstore's adapters, `peer` for the others.
    pub role: String,
    /// Where it keeps its data: the server's backend for sessionstore;
    /// `postgres`, `redis` or `sqlite` for a peer.
    pub backend: String,
    /// The distribution the class comes from (or, for sessionstore's
    /// adapters, the framework's), and its version.
    pub distribution: String,
    pub version: String,
    /// The two calls one round trip makes.
    pub round_trip: String,
    pub per_sec: PeerSpread,
    pub runs: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub samples: usize,
    pub add_p50_ms: f64,
    pub read_p50_ms: f64,
}

/// Where `bench/agents/run.sh` finds what it measures.
pub struct AgentsPlaces<'a> {
    /// The running servers: backend, gRPC endpoint, database URL (which
    /// the script ANALYZEs after its pre-fill).
    pub servers: Vec<(&'a str, String, String)>,
    /// An empty PostgreSQL database for the PostgreSQL peers.
    pub peer_postgres_url: Option<String>,
}

/// Sizes of the agents run.
pub struct AgentsShape {
    pub round_trips: usize,
    pub repeat: usize,
    pub prefill_sessions: usize,
    pub prefill_items: usize,
}

/// Runs the framework round-trip script (`bench/agents/run.sh`).
pub async fn agents(
    workspace: &Path,
    places: &AgentsPlaces<'_>,
    shape: &AgentsShape,
) -> anyhow::Result<AgentsRun> {
    let mut command = tokio::process::Command::new("bash");
    command
        .current_dir(workspace)
        .arg("bench/agents/run.sh")
        .args(["--round-trips", &shape.round_trips.to_string()])
        .args(["--repeat", &shape.repeat.to_string()])
        .args(["--prefill-sessions", &shape.prefill_sessions.to_string()])
        .args(["--prefill-items", &shape.prefill_items.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (backend, endpoint, database_url) in &places.servers {
        command.args(["--server", backend, endpoint, database_url]);
    }
    if let Some(url) = &places.peer_postgres_url {
        command.args(["--peer-postgres-url", url]);
    }
    // spawn, not output(): tokio's output() pipes stderr too, which would
    // swallow the script's progress and its errors.
    let output = command
        .spawn()
        .context("run bench/agents/run.sh")?
        .wait_with_output()
        .await
        .context("run bench/agents/run.sh")?;
    anyhow::ensure!(
        output.status.success(),
        "bench/agents/run.sh failed ({})",
        output.status
    );
    serde_json::from_slice(&output.stdout).context("parse the agents run's JSON")
}

/// What the peers run: sessionstore's client counts and exchange shapes,
/// for as long and as often as its own runs.
pub struct PeerPlan<'a> {
    pub warmup: f64,
    pub seconds: f64,
    /// Runs of each measurement of the first shape, and of the others.
    pub repeat: usize,
    pub repeat_later: usize,
    pub clients: &'a [usize],
    pub shapes: &'a [Shape],
    /// Sizes, in messages, of the sessions read back.
    pub read_sizes: &'a [usize],
}

/// Runs the peer script and parses its JSON.
pub async fn run(
    workspace: &Path,
    postgres_url: Option<&str>,
    plan: &PeerPlan<'_>,
) -> anyhow::Result<PeerRun> {
    let list = |values: &mut dyn Iterator<Item = String>| values.collect::<Vec<_>>().join(",");
    let mut command = tokio::process::Command::new("bash");
    command
        .current_dir(workspace)
        .arg("bench/peers/run.sh")
        .args(["--warmup", &plan.warmup.to_string()])
        .args(["--duration", &plan.seconds.to_string()])
        .args(["--repeat", &plan.repeat.to_string()])
        .args(["--repeat-later", &plan.repeat_later.to_string()])
        .args([
            "--concurrency",
            &list(&mut plan.clients.iter().map(usize::to_string)),
        ])
        .args([
            "--shapes",
            &list(&mut plan.shapes.iter().map(|shape| shape.name().to_owned())),
        ])
        .args([
            "--read-sizes",
            &list(&mut plan.read_sizes.iter().map(usize::to_string)),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(url) = postgres_url {
        command.args(["--postgres-url", url]);
    }
    let output = command.output().await.context("run bench/peers/run.sh")?;
    anyhow::ensure!(
        output.status.success(),
        "bench/peers/run.sh failed ({})",
        output.status
    );
    serde_json::from_slice(&output.stdout).context("parse the peers' JSON")
}
