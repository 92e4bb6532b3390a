//! The figures of one bench run: printed as a table, written as JSON.

use serde::Serialize;

use crate::results::RunInfo;
use crate::stats::{Latency, Spread};

/// One measured figure.
#[derive(Clone, Debug, Serialize)]
pub struct Figure {
    /// `append`, `append server CPU`, `export`, `replay`, `replay server
    /// CPU`, `list`, `watch`, `memory`, `newest page`, `cancel run`,
    /// `usage`, `peer append`, `peer read`, `agents`.
    pub benchmark: String,
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// What was measured: `sessionstore`, `raw sqlx`, `raw rusqlite`,
    /// `SELECT sqlx`, or a peer library.
    pub subject: String,
    /// The case: clients and spread, session size, page, watchers.
    pub case: String,
    /// What this run saw beside the figure that varies from run to run
    /// (a memory case's RSS, the calls that failed): printed after the
    /// case, but not part of what names the figure, so `--compare` pairs
    /// it with the same figure of another run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The unit of `value`.
    pub unit: String,
    pub value: Spread,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency: Option<Latency>,
    /// The comparison `baseline` names: by default this figure's value ÷
    /// the baseline's (`1.7×` of `raw sqlx`: 1.7 times its rate; of a
    /// `SELECT` time: 1.7 times as long).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<String>,
    /// The target this figure is held to, and whether this run met it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub met: Option<bool>,
}

impl Figure {
    pub fn new(
        benchmark: &str,
        backend: &str,
        subject: &str,
        case: &str,
        unit: &str,
        value: Spread,
    ) -> Figure {
        Figure {
            benchmark: benchmark.to_owned(),
            backend: backend.to_owned(),
            subject: subject.to_owned(),
            case: case.to_owned(),
            detail: None,
            unit: unit.to_owned(),
            value,
            latency: None,
            ratio: None,
            baseline: None,
            target: None,
            met: None,
        }
    }

    /// Sets `detail`; an empty `detail` leaves it unset.
    pub fn detail(mut self, detail: &str) -> Figure {
        self.detail = (!detail.is_empty()).then(|| detail.to_owned());
        self
    }

    /// The case, with the detail after it in brackets.
    fn case_shown(&self) -> String {
        match &self.detail {
            Some(detail) => format!("{} ({detail})", self.case),
            None => self.case.clone(),
        }
    }

    pub fn latency(mut self, latency: Latency) -> Figure {
        self.latency = Some(latency);
        self
    }

    pub fn ratio(mut self, ratio: f64, baseline: &str) -> Figure {
        self.ratio = Some(ratio);
        self.baseline = Some(baseline.to_owned());
        self
    }

    pub fn target(mut self, target: &str, met: bool) -> Figure {
        self.target = Some(target.to_owned());
        self.met = Some(met);
        self
    }
}

/// Everything one run measured, and where.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub run: RunInfo,
    pub machine: Machine,
    pub settings: serde_json::Value,
    pub figures: Vec<Figure>,
    /// What was not measured, and why.
    pub skipped: Vec<String>,
    /// Tables printed after the figures', set out from figures the run
    /// also lists (so not in the JSON).
    #[serde(skip)]
    pub tables: Vec<Table>,
}

/// A table of its own: a title, a header and rows of cells, and a note
/// printed under it.
#[derive(Debug, Default)]
pub struct Table {
    pub title: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
    pub note: String,
}

impl Table {
    /// As Markdown, beginning with a blank line.
    fn show(&self) -> String {
        let row = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
        let mut out = format!("\n## {}\n", self.title);
        out.push_str(&row(&self.header));
        out.push_str(&row(&vec!["---".to_owned(); self.header.len()]));
        for cells in &self.rows {
            out.push_str(&row(cells));
        }
        if !self.note.is_empty() {
            out.push_str(&format!("\n{}\n", self.note));
        }
        out
    }
}

#[derive(Debug, Default, Serialize)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub memory_gib: f64,
    pub os: String,
    pub postgres: Option<String>,
    pub sqlite: String,
}

impl Machine {
    pub fn read() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_owned())
            .unwrap_or_default();
        let memory_gib = std::fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
            .map_or(0.0, |kib| (kib / 1024.0 / 1024.0 * 10.0).round() / 10.0);
        let os = std::fs::read_to_string("/etc/os-release")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map(|name| name.trim_matches('"').to_owned())
            .unwrap_or_default();
        Machine {
            cpu,
            cores: std::thread::available_parallelism().map_or(0, usize::from),
            memory_gib,
            os,
            postgres: None,
            sqlite: rusqlite::version().to_owned(),
        }
    }
}

impl Report {
    pub fn push(&mut self, figure: Figure) {
        eprintln!("   {}", line(&figure));
        self.figures.push(figure);
    }

    /// Pushes each of `figures`.
    pub fn extend(&mut self, figures: impl IntoIterator<Item = Figure>) {
        for figure in figures {
            self.push(figure);
        }
    }

    /// The table, one section per benchmark.
    pub fn table(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "sessionstore-bench on {} ({} cores, {} GiB), {}, SQLite {}{}\n",
            self.machine.cpu,
            self.machine.cores,
            self.machine.memory_gib,
            self.machine.os,
            self.machine.sqlite,
            self.machine
                .postgres
                .as_deref()
                .map(|v| format!(", {v}"))
                .unwrap_or_default(),
        ));
        if !self.run.commit.is_empty() {
            out.push_str(&format!(
                "commit {}{}, started {}\n",
                self.run.commit,
                if self.run.dirty_paths.is_empty() {
                    ""
                } else {
                    " (with uncommitted changes)"
                },
                self.run.started
            ));
        }
        let mut benchmarks: Vec<&str> = Vec::new();
        for figure in &self.figures {
            if !benchmarks.contains(&figure.benchmark.as_str()) {
                benchmarks.push(&figure.benchmark);
            }
        }
        for benchmark in benchmarks {
            out.push_str(&format!("\n## {benchmark}\n"));
            out.push_str(
                "| backend | case | subject | value | p50 ms | p99 ms | ratio | target |\n\
                 |---|---|---|---|---|---|---|---|\n",
            );
            for f in self.figures.iter().filter(|f| f.benchmark == benchmark) {
                out.push_str(&format!(
                    "| {} | {} | {} | {} {} | {} | {} | {} | {} |\n",
                    f.backend,
                    f.case_shown(),
                    f.subject,
                    f.value.show(decimals(&f.unit)),
                    f.unit,
                    f.latency
                        .map(|l| format!("{:.2}", l.p50_ms))
                        .unwrap_or_default(),
                    f.latency
                        .map(|l| format!("{:.2}", l.p99_ms))
                        .unwrap_or_default(),
                    f.ratio
                        .map(|r| format!("{r:.2}× {}", f.baseline.as_deref().unwrap_or_default()))
                        .unwrap_or_default(),
                    match (&f.target, f.met) {
                        (Some(t), Some(true)) => format!("{t} ✓"),
                        (Some(t), _) => format!("{t} ✗ MISSED"),
                        _ => String::new(),
                    },
                ));
            }
        }
        for table in &self.tables {
            out.push_str(&table.show());
        }
        if !self.skipped.is_empty() {
            out.push_str("\nNot measured:\n");
            for reason in &self.skipped {
                out.push_str(&format!("- {reason}\n"));
            }
        }
        out
    }
}

fn decimals(unit: &str) -> usize {
    if unit.ends_with("/s") || unit.starts_with("bytes") || unit.starts_with("µs") {
        0
    } else {
        2
    }
}

/// One figure on one line, for progress output.
fn line(f: &Figure) -> String {
    let mut text = format!(
        "{} {} · {} · {}: {} {}",
        f.benchmark,
        f.backend,
        f.case_shown(),
        f.subject,
        f.value.show(decimals(&f.unit)),
        f.unit
    );
    if let Some(l) = f.latency {
        text.push_str(&format!(
            " (p50 {:.2} ms, p99 {:.2} ms)",
            l.p50_ms, l.p99_ms
        ));
    }
    if let Some(r) = f.ratio {
        text.push_str(&format!(
            " = {r:.2}× {}",
            f.baseline.as_deref().unwrap_or_default()
        ));
    }
    if let (Some(t), Some(met)) = (&f.target, f.met) {
        text.push_str(&format!(" [{t}: {}]", if met { "met" } else { "MISSED" }));
    }
    text
}
