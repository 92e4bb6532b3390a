//! `--compare`: the figures of two runs side by side.
//!
//! A figure is the same figure in both runs when its benchmark, backend,
//! subject and case read the same (what varies from run to run, such as a
//! memory case's RSS, is kept in `detail`, outside that key). For each
//! figure in both, the two medians and new ÷ old, with the direction that
//! is better for its unit; figures in one run only are listed apart.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context as _;
use serde::Deserialize;

/// A run's figures as read back from a `--json` or results file. Only what
/// the comparison needs, so files written by older benches read too.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Saved {
    #[serde(default)]
    pub run: Option<SavedRun>,
    #[serde(default)]
    pub machine: Option<SavedMachine>,
    #[serde(default)]
    pub settings: serde_json::Value,
    #[serde(default)]
    pub figures: Vec<SavedFigure>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct SavedRun {
    #[serde(default)]
    pub commit: String,
    #[serde(default)]
    pub date: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct SavedMachine {
    #[serde(default)]
    pub cpu: String,
    #[serde(default)]
    pub cores: usize,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct SavedFigure {
    pub benchmark: String,
    pub backend: String,
    pub subject: String,
    pub case: String,
    pub unit: String,
    pub value: SavedValue,
    #[serde(default)]
    pub latency: Option<SavedLatency>,
    #[serde(default)]
    pub target: Option<String>,
    #[serde(default)]
    pub met: Option<bool>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub struct SavedValue {
    /// A value the run could not measure is written as `null` (JSON has
    /// no NaN) and read back as NaN.
    #[serde(deserialize_with = "nan_if_null")]
    pub median: f64,
}

#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub struct SavedLatency {
    #[serde(default, deserialize_with = "nan_if_null")]
    pub p99_ms: f64,
}

fn nan_if_null<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(deserializer)?.unwrap_or(f64::NAN))
}

impl Saved {
    pub fn read(path: &Path) -> anyhow::Result<Saved> {
        let text =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        serde_json::from_slice(&text)
            .with_context(|| format!("{} is not a bench results file", path.display()))
    }

    /// One line saying which run this is, for the comparison's header.
    pub fn label(&self, path: &Path) -> String {
        let mut parts = vec![path.display().to_string()];
        if let Some(run) = &self.run {
            parts.push(format!("{} {}", run.date, run.commit).trim().to_owned());
        }
        if let Some(machine) = &self.machine {
            parts.push(format!("{} ({} cores)", machine.cpu, machine.cores));
        }
        if self
            .settings
            .get("quick")
            .and_then(serde_json::Value::as_bool)
            == Some(true)
        {
            parts.push("--quick".to_owned());
        }
        parts.join(", ")
    }
}

/// Which way a figure is better, from its unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Better {
    Higher,
    Lower,
    /// A unit this comparison does not know: no verdict.
    Unknown,
}

impl Better {
    pub fn of(unit: &str) -> Better {
        let unit = unit.trim();
        if unit.ends_with("/s") {
            // Rates: exchanges/s, round trips/s.
            Better::Higher
        } else if unit == "ms"
            || unit == "s"
            || unit.starts_with("µs")
            || unit.starts_with("ms ")
            || unit.starts_with("bytes")
            || unit == "calls"
            || unit == "cores busy"
            || unit == "×"
        {
            // Times, CPU per operation, memory, failed calls, cores kept
            // busy for the same work, and the one ratio figure (the long
            // session's p99 ÷ the short one's): less is better.
            Better::Lower
        } else {
            Better::Unknown
        }
    }

    fn label(self) -> &'static str {
        match self {
            Better::Higher => "higher",
            Better::Lower => "lower",
            Better::Unknown => "?",
        }
    }
}

/// A change smaller than this either way reads as "within 5%".
pub const NOISE: f64 = 0.05;

/// One figure present in both runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Pair {
    pub benchmark: String,
    pub backend: String,
    pub subject: String,
    pub case: String,
    pub unit: String,
    pub old: f64,
    pub new: f64,
    pub better: Better,
    /// The target (the new run's, else the old one's), and whether each
    /// run met it.
    pub target: Option<String>,
    pub met: (Option<bool>, Option<bool>),
    /// p99 in ms, where both runs measured latencies.
    pub p99: Option<(f64, f64)>,
}

impl Pair {
    /// new ÷ old; `None` where old is 0 or either is not a number.
    pub fn ratio(&self) -> Option<f64> {
        let ratio = self.new / self.old;
        (self.old != 0.0 && ratio.is_finite()).then_some(ratio)
    }

    /// `better`, `worse`, `within 5%`, or empty where it cannot tell.
    pub fn verdict(&self) -> &'static str {
        let Some(ratio) = self.ratio() else {
            return if self.old == self.new { "same" } else { "" };
        };
        if (ratio - 1.0).abs() < NOISE {
            return "within 5%";
        }
        match (self.better, ratio > 1.0) {
            (Better::Higher, true) | (Better::Lower, false) => "better",
            (Better::Higher, false) | (Better::Lower, true) => "worse",
            (Better::Unknown, _) => "",
        }
    }
}

/// What two runs' figures have in common and what not.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Comparison {
    /// In the new run's order.
    pub pairs: Vec<Pair>,
    /// `(benchmark, backend, subject, case)` of figures only the new run has.
    pub only_new: Vec<[String; 4]>,
    /// Of figures only the old run has, in its order.
    pub only_old: Vec<[String; 4]>,
    /// Figures in both whose units differ: not compared.
    pub unit_changed: Vec<[String; 4]>,
}

fn key(figure: &SavedFigure) -> [String; 4] {
    [
        figure.benchmark.clone(),
        figure.backend.clone(),
        figure.subject.clone(),
        figure.case.clone(),
    ]
}

/// Each figure's key, the n-th repeat of a key told apart by n (no run
/// repeats one today; a future one would still pair in order).
fn keyed(figures: &[SavedFigure]) -> Vec<([String; 4], usize)> {
    let mut seen: HashMap<[String; 4], usize> = HashMap::new();
    figures
        .iter()
        .map(|figure| {
            let key = key(figure);
            let n = seen.entry(key.clone()).or_insert(0);
            *n += 1;
            (key, *n)
        })
        .collect()
}

/// Pairs the figures of `old` and `new`.
pub fn compare(old: &[SavedFigure], new: &[SavedFigure]) -> Comparison {
    let old_keys = keyed(old);
    let new_keys = keyed(new);
    let by_key: HashMap<&([String; 4], usize), &SavedFigure> = old_keys.iter().zip(old).collect();
    let mut comparison = Comparison::default();
    let mut matched = std::collections::HashSet::new();
    for (key, figure) in new_keys.iter().zip(new) {
        let Some(before) = by_key.get(key) else {
            comparison.only_new.push(key.0.clone());
            continue;
        };
        matched.insert(key);
        if before.unit != figure.unit {
            comparison.unit_changed.push(key.0.clone());
            continue;
        }
        comparison.pairs.push(Pair {
            benchmark: figure.benchmark.clone(),
            backend: figure.backend.clone(),
            subject: figure.subject.clone(),
            case: figure.case.clone(),
            unit: figure.unit.clone(),
            old: before.value.median,
            new: figure.value.median,
            better: Better::of(&figure.unit),
            target: figure.target.clone().or_else(|| before.target.clone()),
            met: (before.met, figure.met),
            p99: before
                .latency
                .zip(figure.latency)
                .map(|(a, b)| (a.p99_ms, b.p99_ms))
                .filter(|(a, b)| a.is_finite() && b.is_finite()),
        });
    }
    comparison.only_old = old_keys
        .iter()
        .filter(|key| !matched.contains(key))
        .map(|key| key.0.clone())
        .collect();
    comparison
}

fn decimals(unit: &str, value: f64) -> usize {
    if unit.ends_with("/s") || unit.starts_with("bytes") || value.abs() >= 100.0 {
        0
    } else {
        2
    }
}

fn show(unit: &str, value: f64) -> String {
    format!("{:.*}", decimals(unit, value), value)
}

fn met(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "MISSED",
        None => "-",
    }
}

impl Comparison {
    /// The comparison as Markdown: one table per benchmark, then the
    /// figures only one run has.
    pub fn table(&self, old: &str, new: &str) -> String {
        let mut out = format!("Comparison: old = {old}\n            new = {new}\n");
        out.push_str(&format!(
            "{} figures in both, {} only in the new run, {} only in the old\n",
            self.pairs.len(),
            self.only_new.len(),
            self.only_old.len()
        ));
        let mut benchmarks: Vec<&str> = Vec::new();
        for pair in &self.pairs {
            if !benchmarks.contains(&pair.benchmark.as_str()) {
                benchmarks.push(&pair.benchmark);
            }
        }
        for benchmark in benchmarks {
            out.push_str(&format!("\n## {benchmark}\n"));
            out.push_str(
                "| backend | case | subject | unit | better | old | new | new/old | verdict | p99 ms old → new | target old → new |\n\
                 |---|---|---|---|---|---|---|---|---|---|---|\n",
            );
            for p in self.pairs.iter().filter(|p| p.benchmark == benchmark) {
                out.push_str(&format!(
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                    p.backend,
                    p.case,
                    p.subject,
                    p.unit,
                    p.better.label(),
                    show(&p.unit, p.old),
                    show(&p.unit, p.new),
                    p.ratio().map(|r| format!("{r:.2}×")).unwrap_or_default(),
                    p.verdict(),
                    p.p99
                        .map(|(a, b)| format!("{a:.2} → {b:.2}"))
                        .unwrap_or_default(),
                    match p.met {
                        (None, None) => String::new(),
                        (a, b) => format!(
                            "{}: {} → {}",
                            p.target.as_deref().unwrap_or_default(),
                            met(a),
                            met(b)
                        ),
                    },
                ));
            }
        }
        for (title, keys) in [
            ("Only in the new run", &self.only_new),
            ("Only in the old run", &self.only_old),
            (
                "In both, but in other units (not compared)",
                &self.unit_changed,
            ),
        ] {
            if keys.is_empty() {
                continue;
            }
            out.push_str(&format!("\n{title}:\n"));
            for [benchmark, backend, subject, case] in keys {
                out.push_str(&format!("- {benchmark} · {backend} · {case} · {subject}\n"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figure(benchmark: &str, subject: &str, case: &str, unit: &str, median: f64) -> SavedFigure {
        SavedFigure {
            benchmark: benchmark.to_owned(),
            backend: "sqlite".to_owned(),
            subject: subject.to_owned(),
            case: case.to_owned(),
            unit: unit.to_owned(),
            value: SavedValue { median },
            ..SavedFigure::default()
        }
    }

    #[test]
    fn each_unit_knows_which_way_is_better() {
        for unit in ["exchanges/s", "round trips/s", "/s"] {
            assert_eq!(Better::of(unit), Better::Higher, "{unit}");
        }
        for unit in [
            "ms",
            "s",
            "µs CPU/exchange",
            "µs CPU/delivery",
            "ms CPU/call",
            "bytes/stream",
            "bytes/stalled stream",
            "calls",
            "cores busy",
            "×",
        ] {
            assert_eq!(Better::of(unit), Better::Lower, "{unit}");
        }
        assert_eq!(Better::of("furlongs"), Better::Unknown);
    }

    #[test]
    fn figures_in_both_pair_with_their_ratio_and_verdict() {
        let old = vec![
            figure(
                "append",
                "sessionstore",
                "16 clients",
                "exchanges/s",
                1000.0,
            ),
            figure("export", "sessionstore", "10000 messages", "ms", 20.0),
            figure("list", "sessionstore", "first page", "ms", 1.0),
        ];
        let new = vec![
            figure(
                "append",
                "sessionstore",
                "16 clients",
                "exchanges/s",
                1200.0,
            ),
            figure("export", "sessionstore", "10000 messages", "ms", 25.0),
            figure("list", "sessionstore", "first page", "ms", 1.02),
        ];
        let comparison = compare(&old, &new);
        assert!(comparison.only_new.is_empty() && comparison.only_old.is_empty());
        let verdicts: Vec<(&str, Option<f64>, &str)> = comparison
            .pairs
            .iter()
            .map(|p| (p.benchmark.as_str(), p.ratio(), p.verdict()))
            .collect();
        assert_eq!(verdicts[0].0, "append");
        assert!((verdicts[0].1.unwrap_or_default() - 1.2).abs() < 1e-9);
        assert_eq!(verdicts[0].2, "better", "a higher rate");
        assert!((verdicts[1].1.unwrap_or_default() - 1.25).abs() < 1e-9);
        assert_eq!(verdicts[1].2, "worse", "a longer time");
        assert_eq!(verdicts[2].2, "within 5%");
    }

    #[test]
    fn a_lower_rate_is_worse_and_less_cpu_is_better() {
        let old = vec![
            figure("append", "sessionstore", "1 clients", "exchanges/s", 1000.0),
            figure(
                "append server CPU",
                "sessionstore",
                "1 clients",
                "µs CPU/exchange",
                200.0,
            ),
        ];
        let new = vec![
            figure("append", "sessionstore", "1 clients", "exchanges/s", 800.0),
            figure(
                "append server CPU",
                "sessionstore",
                "1 clients",
                "µs CPU/exchange",
                150.0,
            ),
        ];
        let comparison = compare(&old, &new);
        assert_eq!(comparison.pairs[0].verdict(), "worse");
        assert_eq!(comparison.pairs[1].verdict(), "better");
    }

    #[test]
    fn figures_in_one_run_only_are_listed_as_such() {
        let old = vec![
            figure("append", "sessionstore", "16 clients", "exchanges/s", 1.0),
            figure("export", "SELECT sqlx", "1000 messages", "ms", 1.0),
        ];
        let new = vec![
            figure("append", "sessionstore", "16 clients", "exchanges/s", 1.0),
            figure("append", "sessionstore", "4 clients", "exchanges/s", 1.0),
        ];
        let comparison = compare(&old, &new);
        assert_eq!(comparison.pairs.len(), 1);
        assert_eq!(comparison.pairs[0].verdict(), "within 5%");
        assert_eq!(comparison.only_new.len(), 1);
        assert_eq!(comparison.only_new[0][3], "4 clients");
        assert_eq!(comparison.only_old.len(), 1);
        assert_eq!(comparison.only_old[0][0], "export");
        let table = comparison.table("a.json", "b.json");
        assert!(table.contains("Only in the new run:\n- append · sqlite · 4 clients"));
        assert!(table.contains("Only in the old run:\n- export · sqlite · 1000 messages"));
    }

    #[test]
    fn the_key_is_benchmark_backend_subject_and_case() {
        let mut postgres = figure("append", "sessionstore", "16 clients", "exchanges/s", 2.0);
        postgres.backend = "postgres".to_owned();
        let old = vec![figure(
            "append",
            "sessionstore",
            "16 clients",
            "exchanges/s",
            1.0,
        )];
        let new = vec![
            postgres,
            figure("append", "raw sqlx", "16 clients", "exchanges/s", 1.0),
        ];
        let comparison = compare(&old, &new);
        assert!(comparison.pairs.is_empty());
        assert_eq!(comparison.only_new.len(), 2);
        assert_eq!(comparison.only_old.len(), 1);
    }

    #[test]
    fn a_unit_that_changed_is_not_compared() {
        let old = vec![figure(
            "memory",
            "sessionstore",
            "idle",
            "bytes/stream",
            3000.0,
        )];
        let new = vec![figure("memory", "sessionstore", "idle", "KiB/stream", 3.0)];
        let comparison = compare(&old, &new);
        assert!(comparison.pairs.is_empty());
        assert_eq!(comparison.unit_changed.len(), 1);
        assert!(comparison.only_old.is_empty() && comparison.only_new.is_empty());
    }

    #[test]
    fn zero_before_has_no_ratio() {
        let old = vec![figure(
            "failover",
            "calls",
            "other than UNAVAILABLE",
            "calls",
            0.0,
        )];
        let new = vec![figure(
            "failover",
            "calls",
            "other than UNAVAILABLE",
            "calls",
            0.0,
        )];
        let comparison = compare(&old, &new);
        assert_eq!(comparison.pairs[0].ratio(), None);
        assert_eq!(comparison.pairs[0].verdict(), "same");
        let worse = compare(
            &old,
            &[figure(
                "failover",
                "calls",
                "other than UNAVAILABLE",
                "calls",
                3.0,
            )],
        );
        assert_eq!(worse.pairs[0].ratio(), None);
        assert_eq!(worse.pairs[0].verdict(), "");
    }

    #[test]
    fn targets_and_p99_are_carried_where_both_runs_have_them() {
        let mut old = figure("list", "sessionstore", "first page", "ms", 1.0);
        old.target = Some("p99 < 5 ms".to_owned());
        old.met = Some(true);
        old.latency = Some(SavedLatency { p99_ms: 2.0 });
        let mut new = old.clone();
        new.met = Some(false);
        new.latency = Some(SavedLatency { p99_ms: 6.0 });
        let comparison = compare(&[old], &[new]);
        assert_eq!(comparison.pairs[0].met, (Some(true), Some(false)));
        assert_eq!(comparison.pairs[0].p99, Some((2.0, 6.0)));
        let table = comparison.table("a", "b");
        assert!(
            table.contains("| 2.00 → 6.00 | p99 < 5 ms: met → MISSED |"),
            "{table}"
        );
    }

    #[test]
    fn a_repeated_key_pairs_in_order() {
        let old = vec![
            figure("watch", "sessionstore", "1 watchers", "ms", 1.0),
            figure("watch", "sessionstore", "1 watchers", "ms", 2.0),
        ];
        let new = vec![
            figure("watch", "sessionstore", "1 watchers", "ms", 3.0),
            figure("watch", "sessionstore", "1 watchers", "ms", 4.0),
            figure("watch", "sessionstore", "1 watchers", "ms", 5.0),
        ];
        let comparison = compare(&old, &new);
        let pairs: Vec<(f64, f64)> = comparison.pairs.iter().map(|p| (p.old, p.new)).collect();
        assert_eq!(pairs, vec![(1.0, 3.0), (2.0, 4.0)]);
        assert_eq!(comparison.only_new.len(), 1);
    }

    #[test]
    fn files_of_older_benches_read() {
        // A `--json` file as the bench wrote it before results files had
        // a `run` section or figures a `detail`.
        let text = r#"{
            "machine": {"cpu": "Intel Xeon", "cores": 2, "memory_gib": 23.5, "os": "Debian", "postgres": null, "sqlite": "3.46.0"},
            "settings": {"quick": true},
            "figures": [{"benchmark": "append", "backend": "sqlite", "subject": "sessionstore",
                         "case": "1 clients, many sessions", "unit": "exchanges/s",
                         "value": {"median": 10.0, "min": 9.0, "max": 11.0, "runs": 1},
                         "latency": {"p50_ms": 1.0, "p99_ms": 2.0, "max_ms": 3.0, "samples": 10}},
                        {"benchmark": "watch", "backend": "sqlite", "subject": "sessionstore",
                         "case": "1 watchers", "unit": "ms",
                         "value": {"median": null, "min": null, "max": null, "runs": 0},
                         "latency": {"p50_ms": null, "p99_ms": null}}],
            "skipped": []
        }"#;
        let saved: Saved = serde_json::from_str(text).expect("an older file reads");
        assert_eq!(saved.figures.len(), 2);
        assert_eq!(saved.figures[0].value.median, 10.0);
        assert!(saved.figures[1].value.median.is_nan(), "null reads as NaN");
        assert!(saved.label(Path::new("x.json")).contains("--quick"));
    }
}
