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

/// `YYYY-MM-DD` of a day counted from 1970-01-01 (Howard Hinnant's
/// civil-from-days).
pub fn date_of_day(day: i64) -> String {
    let z = day + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The day (counted from 1970-01-01) of a `YYYY-MM-DD` date, if it is one.
pub fn day_of_date(date: &str) -> Option<i64> {
    let mut parts = date.splitn(3, '-');
    let (y, m, d) = (parts.next()?, parts.next()?, parts.next()?);
    if y.len() != 4 || m.len() != 2 || d.len() != 2 {
        return None;
    }
    let (y, m, d): (i64, i64, i64) = (y.parse().ok()?, m.parse().ok()?, d.parse().ok()?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let day = era * 146_097 + doe - 719_468;
    (date_of_day(day) == date).then_some(day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_and_dates_round_trip() {
        assert_eq!(date_of_day(0), "1970-01-01");
        assert_eq!(date_of_day(20_512), "2026-02-28");
        assert_eq!(date_of_day(20_513), "2026-03-01");
        assert_eq!(date_of_day(19_782), "2024-02-29");
        for day in [-1, 0, 1, 11_016, 19_782, 20_783, 40_000] {
            assert_eq!(day_of_date(&date_of_day(day)), Some(day));
        }
        assert_eq!(day_of_date("2026-02-30"), None);
        assert_eq!(day_of_date("2026-2-3"), None);
        assert_eq!(day_of_date("x"), None);
    }
}
