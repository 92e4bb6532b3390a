//! SummarizeUsage: what is summed, grouped how, and the UTC days a call's
//! time falls on.

use super::Timestamp;

/// Microseconds in a day.
pub const DAY_MICROS: i64 = 86_400 * 1_000_000;

/// What the sums are grouped by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UsageGroup {
    /// One row: the total.
    Total,
    Session,
    User,
    /// The resolved `provider/model`.
    Model,
    /// The UTC day of the call.
    Day,
}

/// Which provider calls of a tenant to sum, and which page of groups.
#[derive(Clone, Debug)]
pub struct UsageQuery {
    pub user: Option<String>,
    /// The internal key of the one session to sum.
    pub session_key: Option<i64>,
    /// Calls recorded at or after this time.
    pub start: Option<Timestamp>,
    /// Calls recorded before this time.
    pub end: Option<Timestamp>,
    pub group: UsageGroup,
    /// Only groups whose key sorts after this one (the last of the page before).
    pub after: Option<String>,
    pub limit: usize,
}

/// The sums of one group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UsageRow {
    /// A session id, a user, `provider/model` or `YYYY-MM-DD`; empty for the total.
    pub key: String,
    pub calls: i64,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cached_input_tokens: i64,
    pub cache_creation_input_tokens: i64,
    pub reasoning_tokens: i64,
    pub total_tokens: i64,
    pub cost_micros_usd: i64,
}

pub use super::calendar::{date_of_day, day_of_date};
