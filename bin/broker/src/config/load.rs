//! Where the configuration comes from: built-in defaults, then the YAML file, then the
//! `FUTUREQ_*` environment (deprecated keys moved to their new names), validated last.

use std::collections::{BTreeMap, BTreeSet};

use yaml_serde::Value;

use super::error::{err, ConfigError};
use super::schema::{Compat, Config};
use super::settings::Settings;

/// Reports keys of `file` that the defaults do not have (maps with free keys excepted).
fn unknown_keys(defaults: &Value, file: &Value, path: &str, out: &mut Vec<String>) {
    let (Value::Mapping(d), Value::Mapping(f)) = (defaults, file) else {
        return;
    };
    if d.is_empty() {
        return; // free-form map such as cluster.raft.initialMembers
    }
    for (k, v) in f {
        let name = k.as_str().map_or_else(|| format!("{k:?}"), str::to_owned);
        let full = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        match d.get(k) {
            None => out.push(full),
            Some(dv) => unknown_keys(dv, v, &full, out),
        }
    }
}

fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Mapping(b), Value::Mapping(o)) if !b.is_empty() => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(bv) => merge(bv, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

/// Applies `FUTUREQ_*` variables to every leaf of the tree (key path upper-cased, dots and
/// dashes → underscores). The shape comes from `defaults`: a map that is empty there (such as
/// `cluster.raft.initialMembers`) is one leaf, so its variable replaces the whole map, also
/// one from the file. Lists are comma-separated; maps and scalars are parsed as YAML. Every
/// variable used is added to `used`.
fn apply_env(
    defaults: &Value,
    v: &mut Value,
    path: &str,
    env: &BTreeMap<String, String>,
    used: &mut BTreeSet<String>,
) -> Result<(), ConfigError> {
    if let (Value::Mapping(d), Value::Mapping(m)) = (defaults, &mut *v) {
        if !d.is_empty() {
            for (k, dchild) in d {
                let name = k.as_str().unwrap_or_default();
                let full = if path.is_empty() {
                    name.to_owned()
                } else {
                    format!("{path}.{name}")
                };
                if let Some(child) = m.get_mut(k) {
                    apply_env(dchild, child, &full, env, used)?;
                }
            }
            return Ok(());
        }
    }
    let var = env_var_name(path);
    let Some(raw) = env.get(&var) else {
        return Ok(());
    };
    used.insert(var.clone());
    *v = match defaults {
        Value::String(_) => Value::String(raw.clone()),
        Value::Sequence(_) => Value::Sequence(
            raw.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| Value::String(s.into()))
                .collect(),
        ),
        _ => yaml_serde::from_str(raw)
            .or_else(|e| err(path, format!("environment {var}={raw:?}: {e}")))?,
    };
    Ok(())
}

/// The variable that sets configuration key `path`.
fn env_var_name(path: &str) -> String {
    format!("FUTUREQ_{}", path.to_uppercase().replace(['.', '-'], "_"))
}

/// The command-line client's own variables (`FUTUREQ_CLI_TLS_CA`, ...): not configuration keys.
pub const CLI_ENV_PREFIX: &str = "FUTUREQ_CLI_";

/// The `FUTUREQ_*` variables of this process's environment.
#[must_use]
pub fn process_env() -> BTreeMap<String, String> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| k.starts_with("FUTUREQ_"))
        .collect()
}

/// Loads the configuration: defaults, then the file (if any), then the environment.
///
/// # Errors
/// Unreadable file, bad YAML, unknown key, wrong type, or a failed validation; the message
/// names the key.
pub fn load(
    path: Option<&std::path::Path>,
    env: &BTreeMap<String, String>,
) -> Result<(Config, Settings), ConfigError> {
    load_for(path, env, Purpose::Broker)
}

/// What a configuration is loaded for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Running the broker: every file it names is read and checked.
    Broker,
    /// A command that only needs addresses (the client commands, `certs`, `token`): the
    /// broker's certificates, keys and principals file are not read (a user who may not
    /// read them can still use the configuration's addresses).
    Addresses,
}

/// [`load`] for `purpose`.
///
/// # Errors
/// As [`load`].
pub fn load_for(
    path: Option<&std::path::Path>,
    env: &BTreeMap<String, String>,
    purpose: Purpose,
) -> Result<(Config, Settings), ConfigError> {
    let defaults = yaml_serde::to_value(Config::default()).expect("defaults serialize");
    let mut tree = defaults.clone();
    let mut deprecated = Vec::new();
    let env = &compat_env(env, &mut deprecated)?;
    if let Some(p) = path {
        let text = std::fs::read_to_string(p)
            .map_err(|e| ConfigError(format!("cannot read {}: {e}", p.display())))?;
        let file: Value = yaml_serde::from_str(&text)
            .map_err(|e| ConfigError(format!("{}: {e}", p.display())))?;
        let file = if file.is_null() {
            Value::Mapping(yaml_serde::Mapping::new())
        } else {
            file
        };
        if !file.is_mapping() {
            return Err(ConfigError(format!(
                "{}: the top level must be a mapping",
                p.display()
            )));
        }
        let mut file = file;
        deprecated.extend(move_compat_keys(&mut file)?);
        let mut unknown = Vec::new();
        unknown_keys(&defaults, &file, "", &mut unknown);
        if let Some(k) = unknown.first() {
            return err(k, "unknown configuration key");
        }
        if file.get("configVersion").is_none() {
            return err(
                "configVersion",
                "is required in a configuration file (configVersion: 1)",
            );
        }
        merge(&mut tree, file);
    }
    let mut used = BTreeSet::new();
    apply_env(&defaults, &mut tree, "", env, &mut used)?;
    if let Some(var) = env
        .keys()
        .find(|k| k.starts_with("FUTUREQ_") && !k.starts_with(CLI_ENV_PREFIX) && !used.contains(*k))
    {
        return Err(ConfigError(format!(
            "environment variable {var}: no configuration key is set by it (a FUTUREQ_* variable is the key path upper-cased with dots as underscores, e.g. FUTUREQ_API_GRPC_LISTEN)"
        )));
    }
    let mut cfg: Config = serde_path_to_error::deserialize(tree)
        .map_err(|e| ConfigError(format!("{}: {}", e.path(), e.inner())))?;
    if purpose == Purpose::Addresses {
        let defaults = Config::default();
        cfg.api.grpc.tls = defaults.api.grpc.tls;
        cfg.api.auth = defaults.api.auth;
        cfg.cluster.tls = defaults.cluster.tls;
        cfg.cluster.secret = defaults.cluster.secret;
        cfg.cluster.secret_file = defaults.cluster.secret_file;
    }
    let mut settings = cfg.validate()?;
    settings.deprecated = deprecated;
    Ok((cfg, settings))
}

/// Moves the compatibility keys a file names under `delivery` (where the original broker and
/// earlier versions had them) to `compat`; one warning per key.
///
/// # Errors
/// A key set in both places.
fn move_compat_keys(file: &mut Value) -> Result<Vec<String>, ConfigError> {
    let mut moved = Vec::new();
    let Some(Value::Mapping(delivery)) = file.get_mut("delivery") else {
        return Ok(moved);
    };
    let mut taken = Vec::new();
    for name in Compat::MOVED_FROM_DELIVERY {
        if let Some(v) = delivery.remove(name) {
            taken.push((name, v));
        }
    }
    if taken.is_empty() {
        return Ok(moved);
    }
    let Value::Mapping(top) = file else {
        return Ok(moved);
    };
    let compat = top
        .entry(Value::String("compat".into()))
        .or_insert_with(|| Value::Mapping(yaml_serde::Mapping::new()));
    let Value::Mapping(compat) = compat else {
        return err("compat", "must be a mapping");
    };
    for (name, v) in taken {
        if compat.contains_key(name) {
            return err(
                &format!("delivery.{name}"),
                format!(
                    "is set twice: here (its old place) and as compat.{name}; keep compat.{name}"
                ),
            );
        }
        compat.insert(Value::String(name.into()), v);
        moved.push(format!(
            "delivery.{name} is deprecated: it is read as compat.{name}"
        ));
    }
    Ok(moved)
}

/// The environment with `FUTUREQ_DELIVERY_<KEY>` of a compatibility key renamed to
/// `FUTUREQ_COMPAT_<KEY>` (one warning each).
///
/// # Errors
/// Both names set.
fn compat_env(
    env: &BTreeMap<String, String>,
    deprecated: &mut Vec<String>,
) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut out = env.clone();
    for name in Compat::MOVED_FROM_DELIVERY {
        let old = format!("FUTUREQ_DELIVERY_{}", name.to_uppercase());
        if let Some(v) = out.remove(&old) {
            let new = format!("FUTUREQ_COMPAT_{}", name.to_uppercase());
            if out.contains_key(&new) {
                return Err(ConfigError(format!(
                    "environment variables {old} and {new} are both set (the first is the old name of the second): keep {new}"
                )));
            }
            deprecated.push(format!(
                "environment variable {old} is deprecated: it is read as {new}"
            ));
            out.insert(new, v);
        }
    }
    Ok(out)
}
