//! Where and when a run was made, and its results file
//! (`bench/results/<date>-<commit>.json`, written by `--save`).

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// The run itself: the code it measured, when, and how busy the machine
/// was around it.
#[derive(Debug, Default, Serialize)]
pub struct RunInfo {
    /// `git rev-parse --short HEAD` of the workspace the bench was built
    /// in (empty outside a git checkout).
    pub commit: String,
    /// Tracked files that differed from `commit` when the run began: the
    /// server measured may hold those changes.
    pub dirty_paths: Vec<String>,
    /// UTC, when the run began: `YYYY-MM-DD` and `YYYY-MM-DDTHH:MM:SSZ`.
    pub date: String,
    pub started: String,
    /// The arguments the bench was run with.
    pub command: Vec<String>,
    /// `/proc/loadavg`'s 1, 5 and 15 minute averages when the run began
    /// and when it ended: what else the machine was doing.
    pub load_average_start: Option<[f64; 3]>,
    pub load_average_end: Option<[f64; 3]>,
    /// `--notes`: anything the figures should be read with.
    pub notes: String,
}

impl RunInfo {
    pub fn now(notes: Option<&str>) -> RunInfo {
        let seconds = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs());
        let (date, started) = utc(seconds);
        RunInfo {
            commit: git(&["rev-parse", "--short", "HEAD"])
                .map(|commit| commit.trim().to_owned())
                .unwrap_or_default(),
            dirty_paths: git(&["status", "--porcelain", "--untracked-files=no"])
                .map(|status| dirty_paths(&status))
                .unwrap_or_default(),
            date,
            started,
            command: std::env::args().skip(1).collect(),
            load_average_start: load_average(),
            load_average_end: None,
            notes: notes.unwrap_or_default().to_owned(),
        }
    }

    /// `bench/results/<date>-<commit>.json` under `dir`, or `-2`, `-3`, …
    /// before `.json` where that file is there already.
    pub fn results_path(&self, dir: &Path) -> PathBuf {
        let commit = if self.commit.is_empty() {
            "unknown"
        } else {
            &self.commit
        };
        let stem = format!("{}-{commit}", self.date);
        let mut path = dir.join(format!("{stem}.json"));
        let mut n = 2;
        while path.exists() {
            path = dir.join(format!("{stem}-{n}.json"));
            n += 1;
        }
        path
    }
}

/// The results folder of this workspace (`bench/results`).
pub fn results_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("results")
}

fn git(args: &[&str]) -> Option<String> {
    let output = std::process::Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The paths of `git status --porcelain` lines (`XY path`: two status
/// letters, either of which may be a space, then a space).
fn dirty_paths(status: &str) -> Vec<String> {
    status
        .lines()
        .filter_map(|line| line.get(3..))
        .map(str::to_owned)
        .collect()
}

/// When `path` was last written, as a UTC time stamp: for a server
/// binary, when it was built.
pub fn modified(path: &Path) -> Option<String> {
    let modified = std::fs::metadata(path).ok()?.modified().ok()?;
    let seconds = modified.duration_since(UNIX_EPOCH).ok()?.as_secs();
    Some(utc(seconds).1)
}

pub fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut fields = text.split_whitespace().map(str::parse::<f64>);
    Some([
        fields.next()?.ok()?,
        fields.next()?.ok()?,
        fields.next()?.ok()?,
    ])
}

/// Seconds since 1970 as a UTC date and a UTC time stamp.
pub fn utc(seconds: u64) -> (String, String) {
    let days = (seconds / 86_400) as i64;
    let of_day = seconds % 86_400;
    let (year, month, day) = civil(days);
    let date = format!("{year:04}-{month:02}-{day:02}");
    let stamp = format!(
        "{date}T{:02}:{:02}:{:02}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    );
    (date, stamp)
}

/// The proleptic Gregorian date of a day counted from 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates_and_stamps() {
        assert_eq!(utc(0), ("1970-01-01".into(), "1970-01-01T00:00:00Z".into()));
        // 2000-02-29 12:34:56 UTC, a leap day.
        assert_eq!(utc(951_827_696).1, "2000-02-29T12:34:56Z");
        // 2026-12-06 07:05:34 UTC.
        assert_eq!(utc(1_796_540_734).1, "2026-12-06T07:05:34Z");
        assert_eq!(utc(1_796_540_734 - 7 * 86_400).0, "2026-11-29");
    }

    #[test]
    fn dirty_paths_are_read_from_porcelain_status() {
        assert_eq!(
            dirty_paths(" M Cargo.lock\nM  tests/it/main.rs\nMM bench/src/main.rs\n"),
            vec![
                "Cargo.lock".to_owned(),
                "tests/it/main.rs".to_owned(),
                "bench/src/main.rs".to_owned()
            ]
        );
        assert!(dirty_paths("").is_empty());
    }

    #[test]
    fn a_results_file_is_never_overwritten() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let run = RunInfo {
            commit: "abc1234".into(),
            date: "2026-12-06".into(),
            ..RunInfo::default()
        };
        let first = run.results_path(dir.path());
        assert_eq!(first, dir.path().join("2026-12-06-abc1234.json"));
        std::fs::write(&first, "{}").expect("written");
        assert_eq!(
            run.results_path(dir.path()),
            dir.path().join("2026-12-06-abc1234-2.json")
        );
    }
}
