//! UTC calendar arithmetic, written once: days since 1970-01-01 to and
//! from proleptic Gregorian dates (Howard Hinnant's algorithms), and the
//! text forms the service writes (`YYYY-MM-DD`, RFC 3339).

use super::Timestamp;

/// RFC 3339 in UTC, to the second (`1970-01-01T00:00:00Z`).
pub fn rfc3339(time: Timestamp) -> String {
    let seconds = time.0.div_euclid(1_000_000);
    let (days, second_of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        second_of_day / 3600,
        second_of_day % 3600 / 60,
        second_of_day % 60
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153; // March is 0
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
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
    fn times_are_rfc3339_utc() {
        assert_eq!(rfc3339(Timestamp(0)), "1970-01-01T00:00:00Z");
        let cases = [
            (1_700_000_000_000_000, "2023-11-14T22:13:20Z"),
            (951_782_400_999_999, "2000-02-29T00:00:00Z"),
            (-1, "1969-12-31T23:59:59Z"),
        ];
        for (micros, expected) in cases {
            assert_eq!(rfc3339(Timestamp(micros)), expected);
        }
    }

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

    #[test]
    fn civil_days_round_trip() {
        for days in [-800_000, -1, 0, 1, 11_016, 19_782, 20_783, 2_932_896] {
            let (year, month, day) = civil_from_days(days);
            assert_eq!(days_from_civil(year, month, day), days);
        }
    }
}
