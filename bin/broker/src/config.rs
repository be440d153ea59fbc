//! Configuration: built-in defaults → YAML file → `FUTUREQ_*` environment, then validation
//! into typed [`Settings`]. Unknown keys are errors; every error names its key.
//!
//! - `schema`: the keys as written and their defaults.
//! - `load`: defaults, file and environment merged (deprecated keys moved).
//! - `validate`: every key checked, [`Settings`] built.
//! - `settings`: what the broker runs on.
//! - `units`: durations and sizes.

mod error;
mod load;
mod schema;
mod settings;
#[cfg(test)]
mod tests;
mod units;
mod validate;

pub use error::ConfigError;
pub use load::{load, load_for, process_env, Purpose, CLI_ENV_PREFIX};
pub use schema::*;
pub use settings::{ClusterSettings, Settings};
pub use units::{parse_duration, parse_size, UnitError};
