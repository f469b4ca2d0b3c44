//! A rate limit as an admin writes it: a count per second, minute or hour (fractions allowed)
//! and an optional burst. Kept in the written form everywhere (files, API, UI, database) so
//! what is shown is what was written; the cell interval the limiters need is derived.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};

/// The period a limit's count is given in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Period {
    Second,
    Minute,
    Hour,
}

impl Period {
    pub const ALL: [Period; 3] = [Period::Second, Period::Minute, Period::Hour];

    /// As stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Second => "second",
            Period::Minute => "minute",
            Period::Hour => "hour",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// The key it is written with: `per_second`, `per_minute`, `per_hour`.
    pub fn key(self) -> &'static str {
        match self {
            Period::Second => "per_second",
            Period::Minute => "per_minute",
            Period::Hour => "per_hour",
        }
    }

    pub fn seconds(self) -> f64 {
        match self {
            Period::Second => 1.0,
            Period::Minute => 60.0,
            Period::Hour => 3600.0,
        }
    }
}

/// The largest burst, and the most requests per second, accepted.
pub const MAX_RATE: u32 = 1_000_000;
/// The slowest rate accepted: one request per day. Slower is surely a typo, and the bound
/// keeps every key's lifetime in the shared store short.
pub const LONGEST_INTERVAL: Duration = Duration::from_secs(86_400);

/// A checked rate limit. Only [`Limit::new`] makes one, so its count is always finite and
/// positive (which is what makes `Eq` sound).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    count: f64,
    period: Period,
    burst: Option<u32>,
}

impl Eq for Limit {}

impl Limit {
    /// `count` requests per `period`, with `burst` requests at once (when not given: the
    /// count, rounded up, as governor's own quotas do).
    pub fn new(count: f64, period: Period, burst: Option<u32>) -> Result<Self, String> {
        let key = period.key();
        if !count.is_finite() || count <= 0.0 {
            return Err(format!("{key} must be a number above 0, not {count}"));
        }
        if count / period.seconds() > f64::from(MAX_RATE) {
            return Err(format!(
                "{key}: {count} is more than {MAX_RATE} requests per second"
            ));
        }
        if period.seconds() / count > LONGEST_INTERVAL.as_secs_f64() {
            return Err(format!(
                "{key}: {count} is slower than the slowest rate allowed, one request per day"
            ));
        }
        if let Some(b) = burst
            && !(1..=MAX_RATE).contains(&b)
        {
            return Err(format!("burst must be from 1 to {MAX_RATE}, not {b}"));
        }
        Ok(Self {
            count,
            period,
            burst,
        })
    }

    pub fn count(&self) -> f64 {
        self.count
    }

    pub fn period(&self) -> Period {
        self.period
    }

    /// The burst as written (`None`: not given).
    pub fn burst_written(&self) -> Option<u32> {
        self.burst
    }

    /// The burst in force.
    pub fn burst(&self) -> u32 {
        self.burst
            .unwrap_or_else(|| (self.count.ceil() as u32).clamp(1, MAX_RATE))
    }

    /// The time one request takes to earn back: the period over the count.
    pub fn interval(&self) -> Duration {
        Duration::from_secs_f64(self.period.seconds() / self.count).max(Duration::from_micros(1))
    }

    /// The interval in whole microseconds (at least 1), as the shared store counts.
    pub fn interval_micros(&self) -> u64 {
        ((self.period.seconds() * 1e6 / self.count).round() as u64).max(1)
    }
}

impl fmt::Display for Limit {
    /// `30/minute burst 5`, or `0.5/second` when the burst was not given.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.count, self.period.as_str())?;
        if let Some(b) = self.burst {
            write!(f, " burst {b}")?;
        }
        Ok(())
    }
}

/// A limit as written, before it is checked: `{per_minute: 30, burst: 5}`. Numbers are taken
/// as floats so that a negative, fractional or NaN value reaches [`LimitForm::parse`] and gets
/// its own message instead of a type error.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitForm {
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "number"
    )]
    pub per_second: Option<f64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "number"
    )]
    pub per_minute: Option<f64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "number"
    )]
    pub per_hour: Option<f64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "number"
    )]
    pub burst: Option<f64>,
}

/// A whole number is written as one (`30`, not `30.0`), so the form round-trips as written.
fn number<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(x) if x.fract() == 0.0 && x.abs() < 9.0e15 => s.serialize_i64(*x as i64),
        Some(x) => s.serialize_f64(*x),
        None => s.serialize_none(),
    }
}

impl LimitForm {
    /// Checks the form: exactly one period key with a positive count, a whole burst of at
    /// least 1 when given.
    pub fn parse(&self) -> Result<Limit, String> {
        let given: Vec<(Period, f64)> = [
            (Period::Second, self.per_second),
            (Period::Minute, self.per_minute),
            (Period::Hour, self.per_hour),
        ]
        .into_iter()
        .filter_map(|(p, v)| v.map(|v| (p, v)))
        .collect();
        let (period, count) = match given.as_slice() {
            [one] => *one,
            [] => return Err("give one of per_second, per_minute or per_hour".into()),
            _ => {
                let keys: Vec<&str> = given.iter().map(|(p, _)| p.key()).collect();
                return Err(format!(
                    "give only one of per_second, per_minute or per_hour, not {}",
                    keys.join(" and ")
                ));
            }
        };
        let burst = match self.burst {
            None => None,
            Some(b) if b.fract() == 0.0 && b >= 1.0 && b <= f64::from(MAX_RATE) => Some(b as u32),
            Some(b) => {
                return Err(format!(
                    "burst must be a whole number from 1 to {MAX_RATE}, not {b}"
                ));
            }
        };
        Limit::new(count, period, burst)
    }
}

impl From<Limit> for LimitForm {
    fn from(l: Limit) -> Self {
        let mut f = LimitForm {
            burst: l.burst.map(f64::from),
            ..LimitForm::default()
        };
        match l.period {
            Period::Second => f.per_second = Some(l.count),
            Period::Minute => f.per_minute = Some(l.count),
            Period::Hour => f.per_hour = Some(l.count),
        }
        f
    }
}

impl Serialize for Limit {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        LimitForm::from(*self).serialize(s)
    }
}

impl<'de> Deserialize<'de> for Limit {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        LimitForm::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(text: &str) -> Result<Limit, String> {
        serde_yaml::from_str::<LimitForm>(text)
            .map_err(|e| e.to_string())?
            .parse()
    }

    #[test]
    fn periods_and_fractions_are_read_as_written() {
        let l = yaml("{per_minute: 30, burst: 5}").unwrap();
        assert_eq!(
            (l.count(), l.period(), l.burst()),
            (30.0, Period::Minute, 5)
        );
        assert_eq!(l.interval(), Duration::from_secs(2));
        let l = yaml("{per_hour: 100, burst: 10}").unwrap();
        assert_eq!(l.interval_micros(), 36_000_000);
        let l = yaml("{per_second: 0.5}").unwrap();
        assert_eq!(l.interval(), Duration::from_secs(2));
        assert_eq!((l.burst_written(), l.burst()), (None, 1));
        let l = yaml("{per_second: 0.2}").unwrap();
        assert_eq!(l.interval_micros(), 5_000_000);
        assert_eq!(
            yaml("{per_minute: 1.5}").unwrap().interval_micros(),
            40_000_000
        );
        assert_eq!(yaml("{per_second: 10}").unwrap().burst(), 10);
    }

    #[test]
    fn bad_limits_are_refused_with_a_reason() {
        for (text, expect) in [
            (
                "{per_second: 0, burst: 1}",
                "per_second must be a number above 0",
            ),
            ("{per_minute: -3}", "per_minute must be a number above 0"),
            (
                "{per_hour: .nan}",
                "per_hour must be a number above 0, not NaN",
            ),
            ("{per_second: .inf}", "per_second must be a number above 0"),
            (
                "{per_second: 1, per_minute: 60}",
                "not per_second and per_minute",
            ),
            (
                "{burst: 3}",
                "give one of per_second, per_minute or per_hour",
            ),
            ("{per_second: 1, burst: 0}", "burst must be a whole number"),
            ("{per_second: 1, burst: -2}", "burst must be a whole number"),
            (
                "{per_second: 1, burst: 2.5}",
                "burst must be a whole number",
            ),
            (
                "{per_second: 2000000}",
                "more than 1000000 requests per second",
            ),
            ("{per_hour: 0.01}", "one request per day"),
        ] {
            let err = yaml(text).unwrap_err();
            assert!(err.contains(expect), "{text}: {err}");
        }
        assert!(yaml("{per_sec: 1}").unwrap_err().contains("unknown field"));
    }

    #[test]
    fn the_written_form_round_trips() {
        for text in [
            r#"{"per_minute":30,"burst":5}"#,
            r#"{"per_second":0.5}"#,
            r#"{"per_hour":100,"burst":10}"#,
            r#"{"per_second":0.2,"burst":1}"#,
        ] {
            let l: Limit = serde_json::from_str(text).unwrap();
            assert_eq!(serde_json::to_string(&l).unwrap(), text);
        }
        let l = yaml("{per_minute: 7.25, burst: 2}").unwrap();
        let back = serde_yaml::to_string(&l).unwrap();
        assert_eq!(back, "per_minute: 7.25\nburst: 2\n");
        assert_eq!(yaml(&back).unwrap(), l);
    }
}
