//! Appends: the decider, the one place the rules of AppendExchange live
//! ([`decide`]), the SQL it reads and writes with, per dialect
//! ([`statements`]), and its runs executed through sqlx ([`exec`]). A run
//! of requests is written with one multi-row statement per table instead
//! of a dozen statements each.
//!
//! The general path in [`super::ops`] uses the same decider for a single
//! request, as a run of one ([`append_loaded`]), after the steps the bulk
//! path leaves to it. Requests a bulk run does not decide on its own are
//! *deferred* to the general path, which the caller runs after this one,
//! in order:
//! - a `full_history` append (it diffs against the stored history);
//! - one with nothing to write (the general path words the error);
//! - a retry: its request id is stored already, or an earlier request of
//!   this run carries it;
//! - one on a session whose lease ran out (the general path settles it
//!   first);
//! - one with state changes (the general path checks the session's room
//!   for new entries, locks shared entries and writes them first).
//!
//! Once a request on a session is deferred, so is every later one on that
//! session, so each session's requests still apply in arrival order.
//!
//! A statement failing (a race with another replica, say) fails the whole
//! run; the caller rolls it back and sends every request down the general
//! path.

mod decide;
mod exec;
mod statements;
#[cfg(test)]
mod tests;

pub use decide::{Kept, Loaded, Outcome, Run, admit};
pub use exec::{Written, append_all, append_loaded, append_run};
pub use statements::{STALE_SESSION, Statement, Value};
