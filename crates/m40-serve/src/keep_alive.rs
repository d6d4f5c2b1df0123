//! Ollama's `keep_alive`: how long a model stays loaded once its last
//! request has ended, and the watch that unloads it when that runs out.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{ApiError, AppState};

/// How long a model stays loaded once idle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeepAlive {
    /// Unloaded once idle this long; zero: as soon as its requests end.
    For(Duration),
    /// Never unloaded (a negative duration, as in Ollama).
    Forever,
}

impl Default for KeepAlive {
    /// Ollama's default: 5 minutes.
    fn default() -> Self {
        KeepAlive::For(Duration::from_secs(5 * 60))
    }
}

impl KeepAlive {
    /// Ollama's forms: a number of seconds (`300`, `-1`, `0.5`), or a Go
    /// duration (`"5m"`, `"1h30m"`, `"-1s"`, `"0"`); a string of a plain
    /// number is seconds too (as `OLLAMA_KEEP_ALIVE` reads it). Negative:
    /// forever.
    pub fn parse(s: &str) -> Result<KeepAlive, String> {
        let s = s.trim();
        let secs = match s.parse::<f64>() {
            Ok(v) => v,
            Err(_) => go_duration_secs(s).ok_or_else(|| {
                format!(
                    "invalid duration {s:?}; use seconds or a duration like \"5m\", \"1h\", \"-1\""
                )
            })?,
        };
        Self::from_secs(secs).ok_or_else(|| format!("invalid duration {s:?}"))
    }

    /// A request's `keep_alive` field: absent or null is `None` (the
    /// model's current setting stands).
    pub fn from_json(v: Option<&Value>) -> Result<Option<KeepAlive>, String> {
        match v {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => n
                .as_f64()
                .and_then(Self::from_secs)
                .map(Some)
                .ok_or_else(|| format!("invalid duration {n}")),
            Some(Value::String(s)) => Self::parse(s).map(Some),
            Some(other) => Err(format!(
                "invalid duration {other}; use seconds or a duration like \"5m\", \"1h\", \"-1\""
            )),
        }
    }

    fn from_secs(secs: f64) -> Option<KeepAlive> {
        if secs.is_nan() {
            return None;
        }
        if secs < 0.0 {
            return Some(KeepAlive::Forever);
        }
        // Past any real uptime (Duration's own limit is larger still).
        Some(KeepAlive::For(Duration::from_secs_f64(secs.min(1e12))))
    }

    /// Whether it says to unload as soon as the model is idle (`0`).
    pub fn is_zero(self) -> bool {
        self == KeepAlive::For(Duration::ZERO)
    }

    /// When a model idle since `since` is unloaded; None: never.
    pub fn expiry(self, since: Instant) -> Option<Instant> {
        match self {
            KeepAlive::For(d) => since.checked_add(d),
            KeepAlive::Forever => None,
        }
    }
}

impl AppState {
    /// A request's `keep_alive`, or the server's where it says none (as
    /// Ollama: each request sets the model's anew); a 400 when invalid.
    pub(crate) fn keep_alive_of(&self, v: Option<&Value>) -> Result<KeepAlive, ApiError> {
        let k = KeepAlive::from_json(v)
            .map_err(|e| ApiError::bad_request(format!("keep_alive: {e}")))?;
        Ok(k.unwrap_or(self.inner.config.keep_alive))
    }

    /// The server's `keep_alive` (for requests that cannot say one).
    pub(crate) fn default_keep_alive(&self) -> KeepAlive {
        self.inner.config.keep_alive
    }

    /// Unload every model that has been idle for its `keep_alive` (the
    /// server's task while it serves).
    pub(crate) async fn watch_idle(self) {
        loop {
            let now = Instant::now();
            let next = self
                .slots()
                .iter()
                .filter_map(|s| s.reap(None))
                .min()
                .map_or(Duration::from_secs(1), |due| {
                    due.saturating_duration_since(now)
                });
            // Short enough to follow a request that changes the time.
            let wait = next.clamp(Duration::from_millis(20), Duration::from_millis(500));
            tokio::time::sleep(wait).await;
        }
    }
}

/// The seconds of a Go duration: an optional sign, then numbers each with
/// a unit (ns, us, µs, ms, s, m, h); "0" alone needs none.
fn go_duration_secs(s: &str) -> Option<f64> {
    let (sign, mut rest) = match s.strip_prefix('-') {
        Some(r) => (-1.0, r),
        None => (1.0, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest == "0" {
        return Some(0.0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let (unit, scale) = [
            ("ns", 1e-9),
            ("us", 1e-6),
            ("µs", 1e-6),
            ("ms", 1e-3),
            ("s", 1.0),
            ("m", 60.0),
            ("h", 3600.0),
        ]
        .into_iter()
        .filter(|(u, _)| rest.starts_with(u))
        .max_by_key(|(u, _)| u.len())?;
        rest = &rest[unit.len()..];
        total += value * scale;
    }
    Some(sign * total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ollamas_forms_parse() {
        let d = |s: f64| KeepAlive::For(Duration::from_secs_f64(s));
        for (text, want) in [
            ("5m", d(300.0)),
            ("1h30m", d(5400.0)),
            ("1.5s", d(1.5)),
            ("250ms", d(0.25)),
            ("0", d(0.0)),
            ("0s", d(0.0)),
            ("300", d(300.0)),
            ("-1", KeepAlive::Forever),
            ("-1m", KeepAlive::Forever),
            ("+2m", d(120.0)),
            ("1.5h", d(5400.0)),
            ("2.5", d(2.5)),
            ("300ms", d(0.3)),
        ] {
            assert_eq!(KeepAlive::parse(text), Ok(want), "{text}");
        }
        for bad in [
            "",
            "5x",
            "m",
            "5m3",
            "--1",
            "1e",
            "five",
            "5 minutes",
            "1h-",
            "forever",
        ] {
            assert!(KeepAlive::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(KeepAlive::from_json(None), Ok(None));
        assert_eq!(KeepAlive::from_json(Some(&json!(null))), Ok(None));
        assert_eq!(KeepAlive::from_json(Some(&json!(30))), Ok(Some(d(30.0))));
        assert_eq!(
            KeepAlive::from_json(Some(&json!(-5))),
            Ok(Some(KeepAlive::Forever))
        );
        assert_eq!(KeepAlive::from_json(Some(&json!("10s"))), Ok(Some(d(10.0))));
        assert!(KeepAlive::from_json(Some(&json!(true))).is_err());
        assert!(KeepAlive::from_json(Some(&json!([1]))).is_err());
        assert!(KeepAlive::parse("0").unwrap().is_zero());
        assert_eq!(KeepAlive::default(), d(300.0));
    }

    #[test]
    fn expiry_counts_from_idle() {
        let t = Instant::now();
        let k = KeepAlive::For(Duration::from_secs(7));
        assert_eq!(k.expiry(t), Some(t + Duration::from_secs(7)));
        assert_eq!(KeepAlive::Forever.expiry(t), None);
        // An hour-long keep_alive far in the future does not overflow.
        assert!(KeepAlive::parse("1e12").is_ok());
    }
}
