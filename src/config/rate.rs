//! Request rates as configured: `"100/s"`, `"2000/m"`, `"50000/h"`, `"1000000/d"`.

use std::time::Duration;

/// A number of requests per fixed window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    pub limit: u64,
    pub window: Duration,
}

impl Rate {
    /// Parses `N/unit` with N ≥ 1 and unit `s`, `m`, `h` or `d`.
    pub fn parse(text: &str) -> Result<Rate, String> {
        let text = text.trim();
        let (count, unit) = text
            .split_once('/')
            .ok_or_else(|| format!("{text:?} is not a rate like \"100/s\""))?;
        let limit: u64 = count
            .trim()
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("{text:?}: the count must be a whole number from 1"))?;
        let seconds = match unit.trim() {
            "s" => 1,
            "m" => 60,
            "h" => 3_600,
            "d" => 86_400,
            other => return Err(format!("{text:?}: unknown unit {other:?} (s, m, h, d)")),
        };
        Ok(Rate {
            limit,
            window: Duration::from_secs(seconds),
        })
    }

    pub(crate) fn window_ms(&self) -> u64 {
        self.window.as_millis() as u64
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let unit = match self.window.as_secs() {
            1 => "s",
            60 => "m",
            3_600 => "h",
            _ => "d",
        };
        write!(f, "{}/{unit}", self.limit)
    }
}

/// A route's setting for one quota dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RouteRate {
    /// `""`: the global setting applies, counted in the global budget.
    #[default]
    Inherit,
    /// `"off"`: no quota of this dimension on the route.
    Off,
    /// A rate of the route's own, counted in a budget of the route's own.
    Own(Rate),
}

impl RouteRate {
    pub fn parse(text: &str) -> Result<RouteRate, String> {
        match text.trim() {
            "" => Ok(RouteRate::Inherit),
            "off" => Ok(RouteRate::Off),
            rate => Rate::parse(rate).map(RouteRate::Own),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_with_each_unit() {
        for (text, limit, secs) in [
            ("100/s", 100, 1),
            (" 2000/m ", 2000, 60),
            ("5 / h", 5, 3600),
            ("1/d", 1, 86_400),
        ] {
            let rate = Rate::parse(text).unwrap();
            assert_eq!(rate.limit, limit, "{text}");
            assert_eq!(rate.window, Duration::from_secs(secs), "{text}");
        }
        assert_eq!(Rate::parse("2000/m").unwrap().to_string(), "2000/m");
    }

    #[test]
    fn malformed_rates_are_refused_with_the_reason() {
        for (text, needle) in [
            ("100", "not a rate"),
            ("0/s", "from 1"),
            ("-5/s", "from 1"),
            ("ten/s", "from 1"),
            ("10/w", "unknown unit"),
            ("10/", "unknown unit"),
            ("99999999999999999999/s", "from 1"),
        ] {
            let error = Rate::parse(text).unwrap_err();
            assert!(error.contains(needle), "{text}: {error}");
        }
    }

    #[test]
    fn route_rates_inherit_turn_off_or_override() {
        assert_eq!(RouteRate::parse("").unwrap(), RouteRate::Inherit);
        assert_eq!(RouteRate::parse("off").unwrap(), RouteRate::Off);
        assert_eq!(
            RouteRate::parse("7/m").unwrap(),
            RouteRate::Own(Rate::parse("7/m").unwrap())
        );
        assert!(RouteRate::parse("none").is_err());
    }
}
