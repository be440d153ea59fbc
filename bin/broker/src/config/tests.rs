//! The configuration's tests: defaults, file and environment, every refused key.

use std::collections::BTreeMap;
use std::time::Duration;

use yaml_serde::Value;

use super::*;

fn no_env() -> BTreeMap<String, String> {
    BTreeMap::new()
}

fn env_of(vars: &[(&str, &str)]) -> BTreeMap<String, String> {
    vars.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn load_str(yaml: &str, env: &BTreeMap<String, String>) -> Result<Settings, ConfigError> {
    load_both(yaml, env).map(|(_, s)| s)
}

fn load_both(
    yaml: &str,
    env: &BTreeMap<String, String>,
) -> Result<(Config, Settings), ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.yaml");
    std::fs::write(&p, yaml).unwrap();
    load(Some(&p), env)
}

#[test]
fn example_file_equals_the_defaults() {
    let text = include_str!("../../../../config.example.yaml");
    let example: Value = yaml_serde::from_str(text).unwrap();
    assert_eq!(example, yaml_serde::to_value(Config::default()).unwrap());
    assert!(Config::default().validate().is_ok());
}

#[test]
fn cluster_settings_are_checked() {
    let base = "configVersion: 1\napi:\n  grpc:\n    advertise: 127.0.0.1:8443\ncluster:\n  enabled: true\n  nodeId: 2\n  raft:\n    advertise: 127.0.0.2:50005\n";
    let ok = load_str(
        &format!("{base}    initialMembers: {{1: \"127.0.0.1:50005\", 2: \"127.0.0.2:50005\"}}\n"),
        &no_env(),
    )
    .unwrap();
    let c = ok.cluster.unwrap();
    assert_eq!(c.node_id, 2);
    assert_eq!(c.initial_members.len(), 2);
    assert_eq!(c.rtt, Duration::from_millis(20));
    for (yaml, fragment) in [
        (
            "configVersion: 1\ncluster:\n  enabled: true\n  raft:\n    advertise: 127.0.0.2:1\n",
            "api.grpc.advertise",
        ),
        (
            &format!("{base}    initialMembers: {{1: \"127.0.0.1:50005\"}}\n"),
            "must map this node",
        ),
        (
            &format!("{base}    initialMembers: {{0: \"127.0.0.1:50005\"}}\n"),
            "must not be 0",
        ),
        (
            &format!("{base}    initialMembers: {{2: \"0.0.0.0:50005\"}}\n"),
            "wildcard",
        ),
        (
            &base.replace("127.0.0.2:50005", "0.0.0.0:50005"),
            "cluster.raft.advertise",
        ),
        (&base.replace("nodeId: 2", "nodeId: 0"), "nodeId"),
        (
            &format!("{base}  joinSeeds: [nohost]\n")
                .replace(
                    "  raft:\n    advertise: 127.0.0.2:50005\n  joinSeeds",
                    "  joinSeeds",
                )
                .replace("]\n", "]\n  raft:\n    advertise: 127.0.0.2:50005\n"),
            "cluster.joinSeeds",
        ),
    ] {
        let e = load_str(yaml, &no_env()).unwrap_err().to_string();
        assert!(e.contains(fragment), "{yaml}: {e}");
    }
}

#[test]
fn defaults_without_a_file() {
    let (_, s) = load(None, &no_env()).unwrap();
    assert_eq!(s.grpc_listen.to_string(), "127.0.0.1:8443");
    assert_eq!(s.metrics_listen.unwrap().to_string(), "127.0.0.1:9090");
    assert_eq!(s.max_recv_message_len, 4 << 20);
    assert_eq!(s.consumer_queue_size, 1024);
    assert_eq!(s.in_flight_timeout, Duration::from_secs(5));
    assert_eq!(s.max_delay, Duration::from_secs(365 * 86_400));
    assert!(!s.memory_storage);
}

#[test]
fn the_write_core_is_the_last_executor_unless_named() {
    let (_, s) = load(None, &no_env()).unwrap();
    assert_eq!(s.raft_core, None);
    let s = load_str("configVersion: 1\nruntime:\n  raftCore: 0\n", &no_env()).unwrap();
    assert_eq!(s.raft_core, Some(0));
    let env = env_of(&[("FUTUREQ_RUNTIME_RAFTCORE", "1")]);
    assert_eq!(load(None, &env).unwrap().1.raft_core, Some(1));
    let err = load_str("configVersion: 1\nruntime:\n  raftCore: -1\n", &no_env());
    assert!(err.unwrap_err().to_string().contains("runtime"));
}

#[test]
fn file_then_env_override() {
    let env = env_of(&[
        ("FUTUREQ_API_GRPC_LISTEN", "127.0.0.1:7000"),
        ("FUTUREQ_OBSERVABILITY_METRICS_LISTEN", ""),
        ("FUTUREQ_DELIVERY_CONSUMERQUEUESIZE", "7"),
    ]);
    let s = load_str(
        "configVersion: 1\napi:\n  grpc:\n    listen: 127.0.0.1:6000\nstorage:\n  mode: memory\n",
        &env,
    )
    .unwrap();
    assert_eq!(s.grpc_listen.to_string(), "127.0.0.1:7000");
    assert_eq!(
        s.metrics_listen, None,
        "an empty env value disables metrics"
    );
    assert_eq!(s.consumer_queue_size, 7);
    assert!(s.memory_storage);
}

#[test]
fn errors_name_the_key() {
    let cases = [
            ("configVersion: 2\n", "configVersion"),
            ("api: {}\n", "configVersion"),
            ("configVersion: 1\nserver: {}\n", "server"),
            ("configVersion: 1\napi:\n  grpc:\n    bogus: 1\n", "api.grpc.bogus"),
            ("configVersion: 1\napi:\n  grpc:\n    maxSendMessageSize: 0B\n", "maxSendMessageSize"),
            ("configVersion: 1\napi:\n  grpc:\n    listen: nowhere\n", "api.grpc.listen"),
            ("configVersion: 1\napi:\n  grpc:\n    advertise: 0.0.0.0:1\n", "api.grpc.advertise"),
            ("configVersion: 1\ndelivery:\n  consumerQueueSize: 0\n", "consumerQueueSize"),
            ("configVersion: 1\ndelivery:\n  consumerQueueSize: many\n", "consumerQueueSize"),
            ("configVersion: 1\ndelivery:\n  inFlightTimeout: 0s\n", "delivery.inFlightTimeout"),
            ("configVersion: 1\ncompat:\n  prepareBatchSize: 65\n", "compat.prepareBatchSize"),
            ("configVersion: 1\ncompat:\n  prepareWorkers: 0\n", "compat.prepareWorkers"),
            ("configVersion: 1\ndelivery:\n  scanMaxKeys: 32\n", "at least compat.prepareBatchSize"),
            ("configVersion: 1\ndelivery:\n  prepareBatchSize: 8\ncompat:\n  prepareBatchSize: 8\n", "delivery.prepareBatchSize: is set twice"),
            ("configVersion: 1\nstorage:\n  mode: tape\n", "storage.mode"),
            ("configVersion: 1\npublish:\n  minAckLevel: maybe\n", "publish.minAckLevel"),
            ("configVersion: 1\npublish:\n  maxDelay: 5 parsecs\n", "publish.maxDelay"),
            ("configVersion: 1\npublish:\n  dedupWindow: 5s\n", "publish.dedupWindow"),
            ("configVersion: 1\npublish:\n  maxQueueDelay: 0ms\n", "publish.maxQueueDelay"),
            ("configVersion: 1\npublish:\n  proposalTimeout: 1000d\n  maxQueueDelay: 61s\n", "publish.maxQueueDelay: must be between 1ms and 60s"),
            ("configVersion: 1\npublish:\n  maxQueueDelay: 6s\n", "publish.maxQueueDelay (6s) must be at most publish.proposalTimeout (5s)"),
            ("configVersion: 1\npublish:\n  proposalTimeout: 20ms\n", "publish.maxQueueDelay (50ms) must be at most publish.proposalTimeout (20ms)"),
            ("configVersion: 1\nobservability:\n  metrics:\n    topicsInterval: 10ms\n", "topicsInterval: must be at least 100ms"),
            ("configVersion: 1\ncluster:\n  joinSeeds: [a:1]\n  raft:\n    initialMembers: {1: b:2}\n", "cannot both be set"),
        ];
    for (yaml, want) in cases {
        let e = load_str(yaml, &no_env()).unwrap_err().to_string();
        assert!(e.contains(want), "{yaml:?}: {e:?} should mention {want}");
    }
    let env = env_of(&[("FUTUREQ_CLUSTER_NODEID", "abc")]);
    let e = load_str("configVersion: 1\n", &env)
        .unwrap_err()
        .to_string();
    assert!(e.contains("nodeId"), "{e}");
}

/// Compatibility keys under their old place (`delivery`, in a file or the environment)
/// are read as `compat.*`, with a warning each.
#[test]
fn compat_keys_are_read_from_their_old_place() {
    let (cfg, s) = load_both(
        "configVersion: 1\ndelivery:\n  prepareBatchSize: 8\n  scanMaxKeys: 16\n",
        &no_env(),
    )
    .unwrap();
    assert_eq!(cfg.compat.prepare_batch_size, 8);
    assert_eq!(s.deprecated.len(), 1, "{:?}", s.deprecated);
    assert!(s.deprecated[0].contains("compat.prepareBatchSize"));
    let env = env_of(&[("FUTUREQ_DELIVERY_PREPAREWORKERS", "3")]);
    let (cfg, s) = load_both("configVersion: 1\n", &env).unwrap();
    assert_eq!(cfg.compat.prepare_workers, 3);
    assert!(s.deprecated[0].contains("FUTUREQ_COMPAT_PREPAREWORKERS"));
    let both = env_of(&[
        ("FUTUREQ_DELIVERY_PREPAREWORKERS", "3"),
        ("FUTUREQ_COMPAT_PREPAREWORKERS", "4"),
    ]);
    let e = load_str("configVersion: 1\n", &both)
        .unwrap_err()
        .to_string();
    assert!(e.contains("both set"), "{e}");
    assert!(load_str("configVersion: 1\n", &no_env())
        .unwrap()
        .deprecated
        .is_empty());
}

/// Issue 10.9: the cluster secret, inline or from a file, never both.
#[test]
fn cluster_secret_inline_or_from_a_file() {
    let base = "configVersion: 1\napi:\n  grpc:\n    advertise: 127.0.0.1:8443\ncluster:\n  enabled: true\n  nodeId: 1\n  raft:\n    advertise: 127.0.0.1:50005\n    initialMembers: {1: \"127.0.0.1:50005\"}\n";
    let open = load_str(base, &no_env()).unwrap().cluster.unwrap();
    assert!(open.secret.is_open());
    let inline = load_str(
        &base.replace("  nodeId: 1\n", "  nodeId: 1\n  secret: s3cret\n"),
        &no_env(),
    )
    .unwrap()
    .cluster
    .unwrap();
    assert!(inline.secret.matches(b"s3cret"));
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("secret");
    std::fs::write(&f, "from-file\n").unwrap();
    let with_file = base.replace(
        "  nodeId: 1\n",
        &format!("  nodeId: 1\n  secretFile: {}\n", f.display()),
    );
    let c = load_str(&with_file, &no_env()).unwrap().cluster.unwrap();
    assert!(c.secret.matches(b"from-file"));
    let both = with_file.replace("  nodeId: 1\n", "  nodeId: 1\n  secret: x\n");
    let e = load_str(&both, &no_env()).unwrap_err().to_string();
    assert!(e.contains("cannot both be set"), "{e}");
    let missing = base.replace(
        "  nodeId: 1\n",
        "  nodeId: 1\n  secretFile: /nonexistent/s\n",
    );
    let e = load_str(&missing, &no_env()).unwrap_err().to_string();
    assert!(e.starts_with("cluster.secretFile:"), "{e}");
}

/// The YAML reading users rely on (guards the YAML crate, see the workspace Cargo.toml):
/// YAML 1.2 scalars (`no` is a string, not false), a number where a string is expected is
/// refused naming the key, and a duplicate key is refused naming it.
#[test]
fn yaml_scalars_and_duplicate_keys() {
    let base = "configVersion: 1\napi:\n  grpc:\n    advertise: 127.0.0.1:8443\ncluster:\n  enabled: true\n  nodeId: 1\n  raft:\n    advertise: 127.0.0.1:50005\n    initialMembers: {1: \"127.0.0.1:50005\"}\n";
    let with = |secret: &str| {
        base.replace(
            "  nodeId: 1\n",
            &format!("  nodeId: 1\n  secret: {secret}\n"),
        )
    };
    let c = load_str(&with("no"), &no_env()).unwrap().cluster.unwrap();
    assert!(c.secret.matches(b"no"));
    let e = load_str(&with("12345"), &no_env()).unwrap_err().to_string();
    assert!(e.starts_with("cluster.secret:"), "{e}");
    let e = load_str("configVersion: 1\ndelivery: {}\ndelivery: {}\n", &no_env())
        .unwrap_err()
        .to_string();
    assert!(e.contains("duplicate") && e.contains("\"delivery\""), "{e}");
}

/// Issue 10.3: a memory store cannot back a Raft replica.
#[test]
fn memory_storage_is_refused_with_clustering() {
    let yaml = "configVersion: 1\napi:\n  grpc:\n    advertise: 127.0.0.1:8443\nstorage:\n  mode: memory\ncluster:\n  enabled: true\n  nodeId: 1\n  raft:\n    advertise: 127.0.0.1:50005\n    initialMembers: {1: \"127.0.0.1:50005\"}\n";
    let e = load_str(yaml, &no_env()).unwrap_err().to_string();
    assert!(e.starts_with("storage.mode:"), "{e}");
    assert!(load_str(&yaml.replace("mode: memory", "mode: disk"), &no_env()).is_ok());
}

/// Issue 10.13: a mistyped variable is refused, naming it; a whole-map variable replaces
/// the file's map.
#[test]
fn environment_variables_are_checked_and_maps_replaced_whole() {
    let e = load_str(
        "configVersion: 1\n",
        &env_of(&[("FUTUREQ_API_GRPC_LISTN", "127.0.0.1:1")]),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("FUTUREQ_API_GRPC_LISTN"), "{e}");
    // A section is not a leaf.
    let e = load_str("configVersion: 1\n", &env_of(&[("FUTUREQ_API", "x")]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("FUTUREQ_API:") || e.contains("FUTUREQ_API "),
        "{e}"
    );
    let yaml = "configVersion: 1\napi:\n  grpc:\n    advertise: 127.0.0.1:8443\ncluster:\n  enabled: true\n  nodeId: 1\n  raft:\n    advertise: 127.0.0.1:50005\n    initialMembers: {1: \"127.0.0.1:50005\", 2: \"127.0.0.2:50005\"}\n";
    let s = load_str(
        yaml,
        &env_of(&[
            ("FUTUREQ_CLUSTER_RAFT_INITIALMEMBERS", "{}"),
            ("FUTUREQ_CLUSTER_JOINSEEDS", "127.0.0.9:1"),
        ]),
    )
    .unwrap();
    let c = s.cluster.unwrap();
    assert!(c.initial_members.is_empty(), "{:?}", c.initial_members);
    assert_eq!(c.join_seeds, vec!["127.0.0.9:1".to_owned()]);
    let s = load_str(
        yaml,
        &env_of(&[(
            "FUTUREQ_CLUSTER_RAFT_INITIALMEMBERS",
            "{1: \"127.0.0.1:50005\"}",
        )]),
    )
    .unwrap();
    assert_eq!(s.cluster.unwrap().initial_members.len(), 1);
}

#[test]
fn durations_and_sizes() {
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
    assert!(parse_duration("5").is_err());
    assert!(parse_duration("5y").is_err());
    assert_eq!(parse_size("4MiB"), Ok(4 << 20));
    assert_eq!(parse_size("100KiB"), Ok(100 << 10));
    assert!(parse_size("0B").is_err());
    assert_eq!(parse_size("4MB"), Ok(4_000_000));
    assert_eq!(parse_size("64KB"), Ok(64_000));
    assert!(parse_size("4mb").is_err());
}
