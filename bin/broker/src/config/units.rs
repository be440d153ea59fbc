//! Durations and sizes as the configuration spells them (`500ms`, `64MiB`).

use std::time::Duration;

/// A duration or size in the configuration that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UnitError {
    /// Digits only.
    #[error("{input:?} has no unit ({units})")]
    NoUnit {
        /// The value.
        input: String,
        /// The units accepted.
        units: &'static str,
    },
    /// No number before the unit.
    #[error("{input:?} is not {what} (e.g. {example})")]
    NotANumber {
        /// The value.
        input: String,
        /// "a duration" or "a size".
        what: &'static str,
        /// An example.
        example: &'static str,
    },
    /// A unit that is not accepted.
    #[error("{input:?} has unknown unit {unit:?} ({units})")]
    UnknownUnit {
        /// The value.
        input: String,
        /// Its unit.
        unit: String,
        /// The units accepted.
        units: &'static str,
    },
    /// A size of zero.
    #[error("{0:?} must be greater than zero")]
    Zero(String),
    /// A size past the address space.
    #[error("{0:?} is too large")]
    TooLarge(String),
}

pub(super) const DURATION_UNITS: &str = "ns, us, ms, s, m, h, d";
pub(super) const SIZE_UNITS: &str = "B, KiB, MiB, GiB (binary), KB, MB, GB (decimal)";

/// Splits `s` into its digits and its unit.
fn number_and_unit(
    s: &str,
    units: &'static str,
    what: &'static str,
    example: &'static str,
) -> Result<(u64, String), UnitError> {
    let split = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or(UnitError::NoUnit {
            input: s.to_owned(),
            units,
        })?;
    let (num, unit) = s.split_at(split);
    let n = num.parse().map_err(|_| UnitError::NotANumber {
        input: s.to_owned(),
        what,
        example,
    })?;
    Ok((n, unit.to_owned()))
}

/// Parses a duration such as `500ms`, `5s`, `1m`, `2h`, `365d` (also `us`, `ns`).
///
/// # Errors
/// Not a non-negative integer followed by a known unit.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let s = s.trim();
    let (n, unit) = number_and_unit(s, DURATION_UNITS, "a duration", "500ms, 5s")?;
    Ok(match unit.as_str() {
        "ns" => Duration::from_nanos(n),
        "us" | "µs" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        "d" => Duration::from_secs(n.saturating_mul(86_400)),
        _ => {
            return Err(UnitError::UnknownUnit {
                input: s.to_owned(),
                unit,
                units: DURATION_UNITS,
            })
        }
    })
}

/// Parses a size such as `4MiB` or `4MB` (units B, KiB, MiB, GiB: binary; KB, MB, GB:
/// decimal).
///
/// # Errors
/// Not a positive integer followed by a known unit.
pub fn parse_size(s: &str) -> Result<usize, UnitError> {
    let s = s.trim();
    let (n, unit) = number_and_unit(s, SIZE_UNITS, "a size", "4MiB")?;
    let mult: u64 = match unit.as_str() {
        "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => {
            return Err(UnitError::UnknownUnit {
                input: s.to_owned(),
                unit,
                units: SIZE_UNITS,
            })
        }
    };
    if n == 0 {
        return Err(UnitError::Zero(s.to_owned()));
    }
    n.checked_mul(mult)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| UnitError::TooLarge(s.to_owned()))
}
