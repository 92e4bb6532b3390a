//! The libraries users would pick instead, measured in-process in Python
//! by `bench/peers/run.sh` (which makes its own throwaway venv) on the same
//! machine and databases, with the same exchange.

use std::path::Path;
use std::process::Stdio;

use anyhow::Context as _;
use serde::Deserialize;

use crate::stats::Spread;

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

/// What `bench/agents/run.sh` prints.
#[derive(Debug, Deserialize)]
pub struct AgentsRun {
    pub agents_version: String,
    pub sqlite_session: AgentsRate,
    pub sessionstore_session: AgentsRate,
}

#[derive(Debug, Deserialize)]
pub struct AgentsRate {
    pub per_sec: f64,
}

/// Runs the Agents SDK round-trip script against the server at `url`.
pub async fn agents(workspace: &Path, url: &str, seconds: f64) -> anyhow::Result<AgentsRun> {
    let output = tokio::process::Command::new("bash")
        .current_dir(workspace)
        .arg("bench/agents/run.sh")
        .args(["--json", "--url", url, "--seconds", &seconds.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .await
        .context("run bench/agents/run.sh")?;
    anyhow::ensure!(
        output.status.success(),
        "bench/agents/run.sh failed ({})",
        output.status
    );
    serde_json::from_slice(&output.stdout).context("parse the agents run's JSON")
}

/// Runs the peer script and parses its JSON.
pub async fn run(
    workspace: &Path,
    postgres_url: Option<&str>,
    seconds: f64,
    repeat: usize,
    read_sizes: &[usize],
) -> anyhow::Result<PeerRun> {
    let mut command = tokio::process::Command::new("bash");
    command
        .current_dir(workspace)
        .arg("bench/peers/run.sh")
        .args(["--duration", &seconds.to_string()])
        .args(["--repeat", &repeat.to_string()])
        .args(["--concurrency", "1,16"])
        .args([
            "--read-sizes",
            &read_sizes
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(","),
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
