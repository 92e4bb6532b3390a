//! The `sessionstore sessions` CLI run against a test server.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

use super::sessionstore_binary;

/// `sessionstore sessions --server ENDPOINT ARGS`: exit code, stdout, stderr.
pub async fn sessions_cli(endpoint: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let output = tokio::process::Command::new(sessionstore_binary())
        .arg("sessions")
        .args(["--server", endpoint])
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .await
        .expect("run sessionstore sessions");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The rows of a table the CLI printed (after its header), as their cells.
pub fn table_rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .skip(1)
        .map(|line| line.split_whitespace().map(str::to_owned).collect())
        .collect()
}

/// `sessionstore sessions watch SESSION`, read a line at a time.
pub struct CliWatch {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl CliWatch {
    pub fn start(endpoint: &str, session_id: &str) -> CliWatch {
        let mut child = tokio::process::Command::new(sessionstore_binary())
            .args(["sessions", "--server", endpoint, "watch", session_id])
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start sessions watch");
        let stdout = child.stdout.take().expect("piped stdout");
        CliWatch {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// The next line it prints (within 30 s; it must not end first).
    pub async fn next_line(&mut self) -> String {
        tokio::time::timeout(Duration::from_secs(30), self.lines.next_line())
            .await
            .expect("a line within the timeout")
            .expect("read the watch's output")
            .expect("watch ended early")
    }

    /// Waits for it to exit (the session deleted); whether it exited 0.
    pub async fn exited_cleanly(mut self) -> bool {
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("watch exits within the timeout")
            .expect("wait for sessions watch")
            .success()
    }
}
