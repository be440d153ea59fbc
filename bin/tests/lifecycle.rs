//! End-to-end process lifecycle: crash recovery, id monotonicity, graceful shutdown.

mod common;

use futureq_storage::durability::JOURNAL_DURABLE_APPLY_INTERVAL;
use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const QUORUM: i32 = 0;

fn event_id(tag: &[u8]) -> u64 {
    u64::from_be_bytes(tag[16..24].try_into().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_loses_no_acked_batch_and_ids_never_regress() {
    let mut b = Broker::start("").await;
    let mut acked = HashSet::new();
    let mut max_id = 0;
    {
        let mut p = Publisher::open(b.channel().await).await;
        // Pipeline batches and kill the broker while some are still in flight.
        for i in 0..200u64 {
            p.send(batch(
                i,
                QUORUM,
                (0..10)
                    .map(|j| msg("crash", &format!("{i}-{j}"), 1500, 0))
                    .collect(),
            ));
        }
        for _ in 0..100 {
            let a = p.ack().await;
            assert!(a.success, "{a:?}");
            for t in a.delivery_tags {
                max_id = max_id.max(event_id(&t));
                acked.insert(t);
            }
        }
        b.kill9();
    }
    assert_eq!(acked.len(), 1000);
    b.spawn().await;
    let mut sub = Subscriber::open(b.channel().await, "crash", "", 65_536).await;
    let mut seen = HashSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !acked.is_subset(&seen) {
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {} acked messages delivered",
            acked.intersection(&seen).count(),
            acked.len()
        );
        if let Some(m) = sub.next(Duration::from_millis(500)).await {
            seen.insert(m.delivery_tag);
        }
    }
    // New ids start above every id handed out before the crash.
    let mut p = Publisher::open(b.channel().await).await;
    let a = p
        .publish(batch(1, QUORUM, vec![msg("after", "x", 0, 0)]))
        .await;
    assert!(
        event_id(&a.delivery_tags[0]) > max_id,
        "id {} after {max_id}",
        event_id(&a.delivery_tags[0])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_deletes_survive_a_graceful_restart() {
    let mut b = Broker::start("delivery:\n  deleteBatchInterval: 5s\n").await;
    let mut p = Publisher::open(b.channel().await).await;
    assert!(
        p.publish(batch(
            1,
            QUORUM,
            vec![msg("t", "a", 0, 0), msg("t", "b", 0, 0)]
        ))
        .await
        .success
    );
    let mut sub = Subscriber::open(b.channel().await, "t", "", 0).await;
    let got = sub.drain(Duration::from_millis(400)).await;
    assert_eq!(got.len(), 2);
    sub.ack(&got[0].delivery_tag, true);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // SIGTERM flushes the pending delete although the 5 s interval has not passed.
    let st = b.sigterm(Duration::from_secs(10));
    assert!(st.success(), "exit status {st}; log:\n{}", b.log());
    b.spawn().await;
    let mut sub = Subscriber::open(b.channel().await, "t", "", 0).await;
    let again = sub.drain(Duration::from_millis(600)).await;
    let payloads: Vec<_> = again.iter().map(|m| m.payload.clone()).collect();
    assert_eq!(
        payloads,
        vec![got[1].payload.clone()],
        "only the unacked message comes back"
    );
}

/// Acks are deletes made durable by the journal (standalone): a kill -9 right after they are
/// (within the journal's durable-apply interval: the deletes are durable in the journal
/// only) must not bring the acked messages back. The journal runs on core 1: the dispatcher
/// on core 0 reads the store only once the journal replayed the deletes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_deletes_survive_kill9() {
    let mut b = Broker::start(
        "runtime:\n  cores: 2\n  raftCore: 1\ndelivery:\n  deleteBatchInterval: 5ms\n",
    )
    .await;
    let mut p = Publisher::open(b.channel().await).await;
    let topics: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
    assert!(
        p.publish(batch(
            1,
            QUORUM,
            topics.iter().map(|t| msg("k9", t, 0, 0)).collect()
        ))
        .await
        .success
    );
    let mut sub = Subscriber::open(b.channel().await, "k9", "", 0).await;
    let got = sub.drain(Duration::from_millis(400)).await;
    assert_eq!(got.len(), 20);
    // The stored messages are durable in the store (the journal's idle durable apply, one
    // interval after its start) and another interval passed since...
    tokio::time::sleep(2 * JOURNAL_DURABLE_APPLY_INTERVAL + Duration::from_millis(200)).await;
    let before = b.metric("futureq_deletes_committed_total").await;
    // ... so this write's apply is a durable one, and the acks' deletes right after are
    // applied volatile: durable in the journal only until the next durable apply, one interval
    // on.
    let t = std::time::Instant::now();
    assert!(
        p.publish(batch(2, QUORUM, vec![msg("other", "x", 60_000, 0)]))
            .await
            .success
    );
    for m in &got[..15] {
        sub.ack(&m.delivery_tag, true);
    }
    while b.metric("futureq_deletes_committed_total").await < before + 15.0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the deletes were not committed"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    b.kill9();
    assert!(
        t.elapsed() < JOURNAL_DURABLE_APPLY_INTERVAL,
        "too slow to kill before the deletes' durable apply ({:?}): the test would prove nothing",
        t.elapsed()
    );
    b.spawn().await;
    let mut sub = Subscriber::open(b.channel().await, "k9", "", 0).await;
    let mut again: Vec<_> = sub
        .drain(Duration::from_millis(600))
        .await
        .into_iter()
        .map(|m| m.payload)
        .collect();
    let mut want: Vec<_> = got[15..].iter().map(|m| m.payload.clone()).collect();
    again.sort();
    want.sort();
    assert_eq!(again, want, "only the 5 unacked messages come back");
    let log = b.log();
    let (replayed, started) = (
        log.rfind("replayed the journal"),
        log.rfind("dispatcher started"),
    );
    assert!(
        replayed.is_some() && replayed < started,
        "the journal replays the deletes, before the dispatcher reads the store:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_open_streams_exits_zero_promptly() {
    let mut b = Broker::start("").await;
    let mut sub = Subscriber::open(b.channel().await, "t", "g", 0).await;
    let mut p = Publisher::open(b.channel().await).await;
    assert!(
        p.publish(batch(1, QUORUM, vec![msg("t", "x", 0, 0)]))
            .await
            .success
    );
    assert!(sub.next(Duration::from_secs(5)).await.is_some());
    let t = std::time::Instant::now();
    let st = b.sigterm(Duration::from_secs(10));
    assert!(st.success(), "exit status {st}; log:\n{}", b.log());
    assert!(t.elapsed() < Duration::from_secs(10));
    let s = sub.end_status().await;
    assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}");
    assert!(b.log().contains("stopped"), "{}", b.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_without_config_file_uses_defaults_and_environment() {
    let dir = tempfile::tempdir().unwrap();
    let (grpc, metrics) = (free_port(), free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_futureq"))
        .arg("start")
        .current_dir(dir.path())
        .env("FUTUREQ_API_GRPC_LISTEN", format!("127.0.0.1:{grpc}"))
        .env(
            "FUTUREQ_OBSERVABILITY_METRICS_LISTEN",
            format!("127.0.0.1:{metrics}"),
        )
        .env("FUTUREQ_RUNTIME_CORES", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{grpc}");
    let mut ok = false;
    for _ in 0..200 {
        if let Ok(ch) = tonic::transport::Channel::from_shared(url.clone())
            .unwrap()
            .connect()
            .await
        {
            let mut p = Publisher::open(ch).await;
            ok = p
                .publish(batch(1, QUORUM, vec![msg("t", "x", 0, 0)]))
                .await
                .success;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(ok, "broker on defaults accepted a publish");
    assert!(
        dir.path().join("data/futureq.redb").exists(),
        "default storage.dataDir is ./data"
    );
}

/// Runs `futureq start` with the configuration `yaml`, which must fail: its exit code and
/// stderr.
fn start_refused(yaml: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(&cfg, yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_futureq"))
        .args(["start", "-c"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_config_and_busy_port_fail_with_clear_messages() {
    let (_, err) = start_refused("configVersion: 1\ndelivery:\n  consumerQueueSize: 0\n");
    assert!(err.contains("delivery.consumerQueueSize"), "{err}");

    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    let (_, err) = start_refused(&format!("configVersion: 1\napi:\n  grpc:\n    listen: 127.0.0.1:{port}\nobservability:\n  metrics:\n    listen: \"\"\nstorage:\n  mode: memory\n"));
    assert!(err.contains("api.grpc.listen"), "{err}");
}

/// Issue 10.12: a second broker on a gRPC port a broker already serves (SO_REUSEPORT would
/// let it share the port and split the clients between two stores) refuses to start; so does
/// one on a taken metrics port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_broker_on_a_served_port_refuses_to_start() {
    let first = Broker::start("").await;
    for (var, port) in [
        ("FUTUREQ_API_GRPC_LISTEN", first.grpc_port),
        ("FUTUREQ_OBSERVABILITY_METRICS_LISTEN", first.metrics_port),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_futureq"))
            .arg("start")
            .current_dir(dir.path())
            .env(
                "FUTUREQ_API_GRPC_LISTEN",
                format!("127.0.0.1:{}", free_port()),
            )
            .env(
                "FUTUREQ_OBSERVABILITY_METRICS_LISTEN",
                format!("127.0.0.1:{}", free_port()),
            )
            .env(var, format!("127.0.0.1:{port}"))
            .env("FUTUREQ_RUNTIME_CORES", "1")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{var}: second broker started; {err}");
        assert!(err.contains("already in use"), "{var}: {err}");
    }
    // The first one still serves.
    let mut p = Publisher::open(first.channel().await).await;
    assert!(
        p.publish(batch(1, QUORUM, vec![msg("t", "x", 0, 0)]))
            .await
            .success
    );
}

/// Issue 11: standalone writes go through the journal (`<dataDir>/journal`, the shared log);
/// a data directory holding the old write-ahead log is refused with what to do, never
/// silently started without replaying it.
#[tokio::test]
async fn standalone_writes_go_through_the_journal_and_an_old_wal_is_refused() {
    let mut b = Broker::start("").await;
    let mut p = Publisher::open(b.channel().await).await;
    let ack = p.publish(batch(1, 0, vec![msg("j", "x", 60_000, 0)])).await;
    assert!(ack.success, "{}", ack.error_message);
    // The apply counters move in standalone too: the write went through the log's apply.
    let mut applies = 0.0;
    for _ in 0..50 {
        applies = b.metric("futureq_store_commit_ops_total").await;
        if applies >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(applies >= 1.0, "no log entry applied");
    drop(p);
    let st = b.sigterm(Duration::from_secs(15));
    assert!(st.success(), "exit status {st}; log:\n{}", b.log());

    std::fs::write(b.dir.path().join("data").join("futureq.wal"), [0u8; 64]).unwrap();
    b.launch();
    let st = b
        .wait_exit(Duration::from_secs(20))
        .expect("the broker started over an old write-ahead log");
    assert!(!st.success());
    let log = b.log();
    assert!(
        log.contains("futureq.wal") && log.contains("stop it cleanly"),
        "{log}"
    );
}

/// `runtime.raftCore` names the write core in both modes: a standalone broker whose raftCore
/// is not one of its executors would never open its journal (publishes hung while health said
/// SERVING); it is refused at start, naming the key.
#[tokio::test]
async fn a_raft_core_outside_the_executors_is_refused_standalone() {
    let mut b = Broker::prepare("runtime:\n  cores: 1\n  raftCore: 1\n");
    b.launch();
    let st = b
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("started without a write core:\n{}", b.log()));
    assert!(!st.success());
    assert!(b.log().contains("runtime.raftCore 1"), "{}", b.log());
}

/// A standalone broker whose journal fails an fsync or a write (ENOSPC), or whose store (redb)
/// meets a full disk at a commit, stops with exit status 74, as a cluster node with a failed
/// Raft log does (the library reports the failure; the binary exits; redb refuses everything
/// after a failed write until it is opened again), and every acked message is there after the
/// restart. The faults are injected through the log's I/O seam and under redb
/// (`fault-injection` feature, on in tests) by the trigger file in `storage.dataDir`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_journal_stops_the_broker_and_loses_no_acked_message() {
    let mut b = Broker::start("").await;
    let mut acked = Vec::new();
    for fault in ["fsync", "enospc", "store-enospc"] {
        let mut p = Publisher::open(b.channel().await).await;
        let before = format!("{fault}-before");
        let ack = p
            .publish(batch(1, QUORUM, vec![msg("disk", &before, 0, 0)]))
            .await;
        assert!(ack.success, "{ack:?}");
        acked.push(before);
        let log_before = b.log().len();
        std::fs::write(b.dir.path().join("data").join("inject-disk-fault"), fault).unwrap();
        // The write that meets the fault is not acked as stored (its failure may not reach
        // the client before the process exits).
        p.send(batch(2, QUORUM, vec![msg("disk", "during", 0, 0)]));
        let ack = tokio::time::timeout(Duration::from_secs(15), p.ack_raw())
            .await
            .expect("an answer or the end of the stream");
        if fault == "store-enospc" {
            // Durable in the journal before the store meets the full disk: acked or not, it
            // is kept if acked.
            if ack.as_ref().is_some_and(|a| a.success) {
                acked.push("during".to_owned());
            }
        } else {
            assert!(
                ack.as_ref().is_none_or(|a| !a.success),
                "{fault}: a write past a failed log was acked: {ack:?}"
            );
        }
        let status = b
            .wait_exit(Duration::from_secs(15))
            .unwrap_or_else(|| panic!("{fault}: the broker kept running; log:\n{}", b.log()));
        assert_eq!(status.code(), Some(74), "{fault}: {status}\n{}", b.log());
        let log = b.log();
        assert!(
            log[log_before..].contains("the journal failed"),
            "{fault}: {}",
            &log[log_before..]
        );
        b.spawn().await;
    }
    let mut s = Subscriber::open(b.channel().await, "disk", "", 100).await;
    let got: Vec<String> = s
        .drain(Duration::from_secs(2))
        .await
        .into_iter()
        .map(|m| String::from_utf8(m.payload).unwrap())
        .collect();
    for a in &acked {
        assert!(got.contains(a), "acked {a} lost; got {got:?}");
    }
}

/// Issue 26 (a full disk degrades): a journal that finds no space on the device for its next
/// segment (the segment's preallocation fails with ENOSPC, injected) does not stop the broker:
/// the writes wait and go on once there is space (here at the next try, a second later), every
/// publish is acked, and every message is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_space_for_the_next_journal_segment_delays_writes_and_stops_nothing() {
    let b = Broker::start("").await;
    let mut p = Publisher::open(b.channel().await).await;
    let trigger = b.dir.path().join("data").join("inject-disk-fault");
    std::fs::write(&trigger, "prealloc").unwrap();
    // The journal creates its first segment at the first write: that meets the fault. Then
    // 80 × 900 KiB roll past the first 64 MiB segment.
    let payload = "x".repeat(900 << 10);
    for i in 0..80 {
        let ack = p
            .publish(batch(i, QUORUM, vec![msg("big", &payload, 3_600_000, 0)]))
            .await;
        assert!(ack.success, "{i}: {ack:?}\n{}", b.log_tail(30));
    }
    assert!(!trigger.exists(), "the roll met the fault");
    assert!(b.running());
    let log = b.log();
    assert!(
        log.contains("no space left on the device for the next log segment"),
        "{log}"
    );
    assert!(log.contains("writes go on"), "{log}");
    // Acked once durable in the journal; applied right after.
    eventually("every message applied", || async {
        topic_stats(&b, "big").await[0].stored == 80
    })
    .await;
}

/// Review of issue 26: a broker whose journal waits for disk space still stops at SIGTERM,
/// cleanly and in time (it waited for the entries forever, until the binary's 9 s deadline);
/// the write that waited is never acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_waiting_for_disk_space_stops_cleanly_and_in_time() {
    let mut b = Broker::start("").await;
    let trigger = b.dir.path().join("data").join("inject-disk-fault");
    let arming = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let rearm = {
        let (arming, trigger) = (std::sync::Arc::clone(&arming), trigger.clone());
        tokio::spawn(async move {
            // Written aside and renamed in place, as in the cluster test: a segment opened
            // while a plain write had truncated the file read it empty and took no fault.
            let aside = trigger.with_extension("new");
            while arming.load(std::sync::atomic::Ordering::Relaxed) {
                if std::fs::write(&aside, "prealloc").is_ok() {
                    let _ = std::fs::rename(&aside, &trigger);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let mut p = Publisher::open(b.channel().await).await;
    p.send(batch(1, QUORUM, vec![msg("wait", "x", 0, 0)]));
    eventually("the journal waits for space", || async {
        b.log().contains("no space left on the device")
    })
    .await;
    let started = std::time::Instant::now();
    let status = tokio::task::block_in_place(|| b.sigterm(Duration::from_secs(15)));
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(status.code(), Some(0), "{status}\n{}", b.log());
    let ack = tokio::time::timeout(Duration::from_secs(5), p.ack_raw())
        .await
        .expect("an answer or the end of the stream");
    assert!(ack.as_ref().is_none_or(|a| !a.success), "{ack:?}");
    arming.store(false, std::sync::atomic::Ordering::Relaxed);
    rearm.await.unwrap();
}

/// Logs a user can read or parse: the version at start, no colour codes when written to a file,
/// one JSON object per line with `observability.logging.format: json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_name_the_version_and_follow_the_configured_format() {
    let version = env!("CARGO_PKG_VERSION");
    let mut text = Broker::start("").await;
    assert!(text.sigterm(Duration::from_secs(10)).success());
    let log = text.log();
    assert!(
        log.lines()
            .any(|l| l.contains("futureq starting") && l.contains(version)),
        "{log}"
    );
    assert!(!log.contains('\u{1b}'), "no ANSI escapes in a file: {log}");

    let mut json = Broker::start("observability:\n  logging:\n    format: json\n").await;
    assert!(json.sigterm(Duration::from_secs(10)).success());
    let log = json.log();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    let start = lines
        .iter()
        .find(|v| v["fields"]["message"] == "futureq starting")
        .unwrap_or_else(|| panic!("a start line: {log}"));
    assert_eq!(start["fields"]["version"], version);
    assert_eq!(start["level"], "INFO");
    assert!(lines.iter().any(|v| v["fields"]["message"] == "stopped"));

    let (code, err) =
        start_refused("configVersion: 1\nobservability:\n  logging:\n    format: xml\n");
    assert_eq!(code, Some(2));
    assert!(
        err.contains("observability.logging.format") && err.contains("text or json"),
        "{err}"
    );
}
