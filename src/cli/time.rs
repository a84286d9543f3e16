//! Times as the command line shows and reads them: UTC, to the second.

/// `2026-01-31 12:00:05 UTC` for epoch milliseconds.
pub(super) fn readable(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// `--since`: a duration back from `now_ms` (`24h`, `7d`) or an RFC 3339
/// time (`2026-01-31T12:00:00Z`, `2026-01-31T13:00:00+01:00`), as epoch ms.
pub(super) fn parse_since(text: &str, now_ms: i64) -> Result<i64, String> {
    let text = text.trim();
    if let Ok(back) = keygate::config::parse_duration(text) {
        return Ok(now_ms - i64::try_from(back.as_millis()).unwrap_or(i64::MAX));
    }
    rfc3339_ms(text).ok_or_else(|| {
        format!(
            "--since {text:?}: give a duration back from now (24h, 7d) \
             or an RFC 3339 time (2026-01-31T12:00:00Z)"
        )
    })
}

/// Epoch ms of `YYYY-MM-DDTHH:MM:SS[.fff](Z|±HH:MM)`.
fn rfc3339_ms(text: &str) -> Option<i64> {
    let bytes = text.as_bytes();
    if bytes.len() < 20 || !matches!(bytes[10], b'T' | b't' | b' ') {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    if bytes[4] != b'-' || bytes[7] != b'-' || bytes[13] != b':' || bytes[16] != b':' {
        return None;
    }
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    if second > 60 {
        return None;
    }
    let mut rest = &text[19..];
    let mut millis = 0;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let padded = format!("{:0<3}", &fraction[..digits.min(3)]);
        millis = padded.parse::<i64>().ok()?;
        rest = &fraction[digits..];
    }
    let offset_secs = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let zone = rest.get(1..)?;
            if zone.len() != 5 || zone.as_bytes()[2] != b':' {
                return None;
            }
            let hours: i64 = zone[..2].parse().ok()?;
            let minutes: i64 = zone[3..].parse().ok()?;
            sign * (hours * 3600 + minutes * 60)
        }
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_secs;
    Some(secs * 1000 + millis)
}

/// Days since 1970-01-01 of a date in the proleptic Gregorian calendar
/// (Howard Hinnant's civil-date algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let shifted_month = (month + 9) % 12;
    let day_of_year = (153 * shifted_month + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The date of a day number since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// An expiry column: `never`, the time, or `expired <time>`.
pub(super) fn expiry(ms: i64, now_ms: i64) -> String {
    if ms == 0 {
        return "never".into();
    }
    if ms <= now_ms {
        return format!("expired {}", readable(ms));
    }
    readable(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_utc_dates() {
        assert_eq!(readable(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(readable(1_769_860_805_000), "2026-01-31 12:00:05 UTC");
        assert_eq!(readable(951_782_400_000), "2000-02-29 00:00:00 UTC");
    }

    #[test]
    fn since_takes_a_duration_back_or_an_rfc3339_time() {
        let now = 1_769_860_805_000;
        assert_eq!(parse_since("24h", now), Ok(now - 86_400_000));
        assert_eq!(parse_since("2026-01-31T12:00:05Z", now), Ok(now));
        assert_eq!(parse_since("2026-01-31T13:00:05+01:00", now), Ok(now));
        assert_eq!(parse_since("2026-01-31T12:00:05.250Z", now), Ok(now + 250));
        for bad in ["yesterday", "2026-13-01T00:00:00Z", "2026-01-31", ""] {
            let error = parse_since(bad, now).unwrap_err();
            assert!(error.contains("RFC 3339"), "{bad:?}: {error}");
        }
    }

    #[test]
    fn dates_round_trip_through_day_numbers() {
        for days in [-1, 0, 59, 60, 365, 10_957, 20_484, 100_000] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }
}
