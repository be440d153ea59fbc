//! The configuration's error: one message that names the key.

/// A configuration error; the message names the key.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

pub(crate) fn err<T>(key: &str, msg: impl std::fmt::Display) -> Result<T, ConfigError> {
    Err(ConfigError(format!("{key}: {msg}")))
}
