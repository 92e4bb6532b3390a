//! Timed load runs and the statistics reported from them.

use std::future::Future;
use std::time::{Duration, Instant};

use serde::Serialize;

/// `samples` timed calls of `call` one after another, after a tenth as
/// many again that warm up. What each call answered goes to `check`,
/// outside its time.
pub async fn sampled<T>(
    samples: usize,
    mut call: impl AsyncFnMut() -> anyhow::Result<T>,
    mut check: impl FnMut(T) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Duration>> {
    let warmup = samples / 10;
    let mut took = Vec::with_capacity(samples);
    for i in 0..samples + warmup {
        let started = Instant::now();
        let answer = call().await?;
        let elapsed = started.elapsed();
        check(answer)?;
        if i >= warmup {
            took.push(elapsed);
        }
    }
    Ok(took)
}

/// How long a run warms up and then measures.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub warmup: Duration,
    pub measure: Duration,
}

/// One load run: operations completed inside the measured window, and the
/// latency of each.
#[derive(Debug, Default)]
pub struct Run {
    pub ops: u64,
    pub window: Duration,
    pub latencies: Vec<Duration>,
    /// The server's CPU time over the measured window (and whatever the
    /// run counts after it), where the run measured it.
    pub server_cpu: Option<Duration>,
}

impl Run {
    pub fn rate(&self) -> f64 {
        self.ops as f64 / self.window.as_secs_f64()
    }

    /// The server's CPU time per operation, in microseconds.
    pub fn cpu_micros_per_op(&self) -> Option<f64> {
        let cpu = self.server_cpu?;
        (self.ops > 0).then(|| cpu.as_secs_f64() * 1e6 / self.ops as f64)
    }
}

/// Median and spread of one figure over repeated runs.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: usize,
}

impl Spread {
    pub fn of(values: &[f64]) -> Spread {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = match n {
            0 => f64::NAN,
            _ if n % 2 == 1 => sorted[n / 2],
            _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
        };
        Spread {
            median,
            min: sorted.first().copied().unwrap_or(f64::NAN),
            max: sorted.last().copied().unwrap_or(f64::NAN),
            runs: n,
        }
    }

    /// `median (min–max)`, or just the value for a single run.
    pub fn show(&self, decimals: usize) -> String {
        if self.runs <= 1 || self.min == self.max {
            format!("{:.*}", decimals, self.median)
        } else {
            format!(
                "{:.*} ({:.*}–{:.*})",
                decimals, self.median, decimals, self.min, decimals, self.max
            )
        }
    }
}

/// Latency percentiles in milliseconds, pooled over every run.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Latency {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub samples: usize,
}

impl Latency {
    pub fn of(samples: &mut [Duration]) -> Latency {
        samples.sort_unstable();
        let at = |q: f64| -> f64 {
            if samples.is_empty() {
                return f64::NAN;
            }
            let index = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
            samples[index].as_secs_f64() * 1e3
        };
        Latency {
            p50_ms: at(0.50),
            p99_ms: at(0.99),
            max_ms: at(1.0),
            samples: samples.len(),
        }
    }
}

/// Throughput and latency over repeated runs.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Throughput {
    pub per_second: Spread,
    pub latency: Latency,
    /// The server's CPU time per operation (µs), where the runs measured it.
    pub cpu_micros: Option<Spread>,
}

impl Throughput {
    pub fn of(runs: Vec<Run>) -> Throughput {
        let rates: Vec<f64> = runs.iter().map(Run::rate).collect();
        let cpu: Vec<f64> = runs.iter().filter_map(Run::cpu_micros_per_op).collect();
        let mut latencies: Vec<Duration> = runs.into_iter().flat_map(|r| r.latencies).collect();
        Throughput {
            per_second: Spread::of(&rates),
            latency: Latency::of(&mut latencies),
            cpu_micros: (!cpu.is_empty()).then(|| Spread::of(&cpu)),
        }
    }
}

/// A client of the system under test that does one operation per call
/// (an append, a read) and keeps its own connection and state.
pub trait Worker: Send + 'static {
    fn op(&mut self) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// Runs every worker concurrently in a loop: `timing.warmup` unmeasured,
/// then `timing.measure` counted. The first failure ends the run.
pub async fn run_load<W: Worker>(workers: Vec<W>, timing: Timing) -> anyhow::Result<Run> {
    let start = Instant::now();
    let window_start = start + timing.warmup;
    let end = window_start + timing.measure;
    let mut tasks = tokio::task::JoinSet::new();
    for mut worker in workers {
        tasks.spawn(async move {
            let mut measured = Vec::new();
            loop {
                let began = Instant::now();
                if began >= end {
                    break;
                }
                worker.op().await?;
                let done = Instant::now();
                if began >= window_start && done <= end {
                    measured.push(done - began);
                }
            }
            Ok::<_, anyhow::Error>(measured)
        });
    }
    collect(tasks, timing).await
}

/// [`run_load`] for blocking workers (the SQLite engine called directly):
/// each on its own thread.
pub async fn run_blocking<W>(workers: Vec<W>, timing: Timing) -> anyhow::Result<Run>
where
    W: FnMut() -> anyhow::Result<()> + Send + 'static,
{
    let start = Instant::now();
    let window_start = start + timing.warmup;
    let end = window_start + timing.measure;
    let mut tasks = tokio::task::JoinSet::new();
    for mut op in workers {
        tasks.spawn_blocking(move || {
            let mut measured = Vec::new();
            loop {
                let began = Instant::now();
                if began >= end {
                    break;
                }
                op()?;
                let done = Instant::now();
                if began >= window_start && done <= end {
                    measured.push(done - began);
                }
            }
            Ok::<_, anyhow::Error>(measured)
        });
    }
    collect(tasks, timing).await
}

async fn collect(
    mut tasks: tokio::task::JoinSet<anyhow::Result<Vec<Duration>>>,
    timing: Timing,
) -> anyhow::Result<Run> {
    let mut run = Run {
        window: timing.measure,
        ..Run::default()
    };
    while let Some(joined) = tasks.join_next().await {
        let measured = joined??;
        run.ops += measured.len() as u64;
        run.latencies.extend(measured);
    }
    Ok(run)
}
