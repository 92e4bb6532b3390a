//! A count of messages shown on stderr while an export or import runs.

use std::io::{IsTerminal as _, Write as _};

/// Shows `done` on stderr, over the same line, when stderr is a terminal.
pub(super) struct Progress {
    pub(super) on: bool,
    pub(super) what: &'static str,
    pub(super) total: Option<usize>,
}

impl Progress {
    pub(super) fn new(what: &'static str, total: Option<usize>) -> Self {
        Progress {
            on: std::io::stderr().is_terminal(),
            what,
            total,
        }
    }

    pub(super) fn show(&self, done: usize) {
        if self.on {
            let text = match self.total {
                Some(total) => format!("\r{} {done}/{total} messages", self.what),
                None => format!("\r{} {done} messages", self.what),
            };
            let _ = std::io::stderr().write_all(text.as_bytes());
        }
    }

    pub(super) fn finish(&self, done: usize) {
        if self.on {
            self.show(done);
            let _ = std::io::stderr().write_all(b"\n");
        }
    }
}
