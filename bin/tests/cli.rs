//! The client commands of the real `futureq` binary against a real broker: publish, stats,
//! peek, reschedule, cancel, consume, cluster info, text and `--json`, and their errors.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// Runs `futureq --server 127.0.0.1:<port> args…` with `stdin` on a blocking thread (the
/// test's runtime keeps serving); (exit code, stdout, stderr).
async fn run_on(port: u16, args: &[&str], stdin: &[u8]) -> (i32, String, String) {
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    let stdin = stdin.to_vec();
    tokio::task::spawn_blocking(move || {
        let mut child = Command::new(env!("CARGO_BIN_EXE_futureq"))
            .arg("--server")
            .arg(format!("127.0.0.1:{port}"))
            .args(&args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&stdin).unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

async fn run(b: &Broker, args: &[&str], stdin: &[u8]) -> (i32, String, String) {
    run_on(b.grpc_port, args, stdin).await
}

fn ok(r: (i32, String, String)) -> String {
    assert_eq!(r.0, 0, "exit {}; stdout {:?}; stderr {:?}", r.0, r.1, r.2);
    r.1
}

/// A shell session: publish (argument and stdin), stats, peek, reschedule, consume, cancel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shell_session_publishes_inspects_moves_cancels_and_consumes() {
    let b = Broker::start("").await;
    let tag = ok(run(
        &b,
        &["publish", "-t", "orders", "--delay", "1h", "first"],
        b"",
    )
    .await);
    let tag = tag.trim().to_owned();
    assert_eq!(tag.len(), 48, "{tag:?}");
    let with_dedup_id = [
        "publish",
        "-t",
        "orders",
        "--delay",
        "2h",
        "--dedup-id",
        "o-2",
    ];
    let second = ok(run(&b, &with_dedup_id, b"from stdin").await);
    let again = ok(run(&b, &with_dedup_id, b"retried").await);
    assert_eq!(second, again, "the dedup id answers the first tag");
    let second = second.trim().to_owned();

    let stats = ok(run(&b, &["stats"], b"").await);
    let mut lines = stats.lines();
    assert!(lines.next().unwrap().starts_with("TOPIC"), "{stats}");
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(&row[..5], ["orders", "2", "0", "0", "0"], "{stats}");
    assert!(stats.contains("in 1h"), "{stats}");
    let json = ok(run(&b, &["stats", "orders", "--json"], b"").await);
    let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(
        (v["topic"].as_str(), v["stored"].as_u64()),
        (Some("orders"), Some(2))
    );

    let peek = ok(run(&b, &["peek", "orders", "-n", "1"], b"").await);
    assert!(peek.starts_with(&tag) && peek.contains("first"), "{peek}");
    let rest = ok(run(&b, &["peek", "orders", "--after", &tag, "--json"], b"").await);
    let v: serde_json::Value = serde_json::from_str(rest.trim()).unwrap();
    assert_eq!(
        (v["tag"].as_str(), v["payload"].as_str()),
        (Some(second.as_str()), Some("from stdin"))
    );

    let moved = ok(run(&b, &["reschedule", &tag, "--delay", "0s"], b"").await);
    let moved = moved.trim().to_owned();
    assert_ne!(moved, tag);
    let got = ok(run(
        &b,
        &[
            "consume", "-t", "orders", "-n", "1", "--wait", "10s", "--json",
        ],
        b"",
    )
    .await);
    let v: serde_json::Value = serde_json::from_str(got.trim()).unwrap();
    assert_eq!(
        (
            v["tag"].as_str(),
            v["payload"].as_str(),
            v["attempt"].as_u64()
        ),
        (Some(moved.as_str()), Some("first"), Some(1))
    );
    // The ACK's delete is flushed within delivery.deleteBatchInterval.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let json = ok(run(&b, &["stats", "orders", "--json"], b"").await);
        let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
        if v["stored"].as_u64() == Some(1) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{json}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let cancelled = ok(run(&b, &["cancel", &second, &moved], b"").await);
    assert_eq!(
        cancelled,
        format!("{second} cancelled\n{moved} not found\n")
    );
    let stats = ok(run(&b, &["stats", "--json"], b"").await);
    assert!(
        stats.is_empty(),
        "nothing stored, nobody subscribed: {stats:?}"
    );

    let info = ok(run(&b, &["cluster", "info"], b"").await);
    assert!(info.starts_with("NODE") && info.contains("yes"), "{info}");
    assert!(info.ends_with("standalone (no Raft term)\n"), "{info}");
    let info = ok(run(&b, &["cluster", "info", "--json"], b"").await);
    assert!(info.contains("\"term\":0"), "{info}");
}

/// Bad input is refused before anything is sent (exit 2, naming the argument); a server
/// refusal or an unknown tag is an error with the server's reason (exit 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_refusals_are_errors_that_say_why() {
    let b = Broker::start("").await;
    let (code, _, err) = run(&b, &["cancel", "zz"], b"").await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("a delivery tag is 48 hex digits"), "{err}");
    let (code, _, err) = run(
        &b,
        &["publish", "-t", "t", "--delay", "5 parsecs", "x"],
        b"",
    )
    .await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--delay"), "{err}");
    let (code, _, err) = run(&b, &["reschedule", &"ab".repeat(24), "--delay", "1s"], b"").await;
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.matches("not stored").count(), 1, "said once: {err}");
    let (code, _, err) = run(&b, &["peek", "t", "-n", "0"], b"").await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("limit: 0; give 1 to 1000"), "{err}");
    let (code, _, err) = run(&b, &["publish", "-t", "t", "--max-size", "4B"], b"too long").await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--max-size"), "{err}");
    // Nobody listens here.
    let (code, _, err) = run_on(free_port(), &["stats"], b"").await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no futureq leader found"), "{err}");
}

/// Issue 26 (group lifecycle), from the shell: `groups list` shows each group's pending
/// messages, deliveries in flight and members; `groups delete` ends the group's members
/// (NOT_FOUND), deletes what only it still needed, and is replicated state: the group is gone
/// from the list, and a second delete says it is not found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_are_listed_and_deleted_from_the_shell() {
    let b = Broker::start("").await;
    for i in 0..3 {
        ok(run(&b, &["publish", "-t", "jobs", &format!("job {i}")], b"").await);
    }
    let mut stale = Subscriber::open(b.channel().await, "jobs", "stale", 1).await;
    stale
        .next(Duration::from_secs(10))
        .await
        .expect("stale gets one");
    let mut fast = Subscriber::open(b.channel().await, "jobs", "fast", 10).await;
    for _ in 0..3 {
        let m = fast
            .next(Duration::from_secs(10))
            .await
            .expect("fast gets each job");
        fast.ack(&m.delivery_tag, true);
    }
    let want_before = [
        r#"{"consumers":1,"group":"fast","in_flight":0,"pending":0}"#,
        r#"{"consumers":1,"group":"stale","in_flight":1,"pending":3}"#,
    ];
    let mut listed = String::new();
    for _ in 0..100 {
        listed = ok(run(&b, &["groups", "list", "jobs", "--json"], b"").await);
        if listed.lines().eq(want_before) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(listed.lines().eq(want_before), "{listed}");
    let table = ok(run(&b, &["groups", "list", "jobs"], b"").await);
    assert!(table.starts_with("GROUP"), "{table}");
    assert!(table.contains("stale"), "{table}");
    let deleted = ok(run(&b, &["groups", "delete", "jobs", "stale"], b"").await);
    assert!(deleted.contains("1 consumer streams ended"), "{deleted}");
    let end = stale.end_status().await;
    assert_eq!(end.code(), tonic::Code::NotFound, "{end:?}");
    assert!(end.message().contains("was deleted"), "{end:?}");
    // Only stale still needed them: they go.
    eventually("what only the deleted group needed is deleted", || async {
        topic_stats(&b, "jobs").await[0].stored == 0
    })
    .await;
    let listed = ok(run(&b, &["groups", "list", "jobs", "--json"], b"").await);
    assert_eq!(
        listed.trim(),
        r#"{"consumers":1,"group":"fast","in_flight":0,"pending":0}"#
    );
    let (code, _, err) = run(&b, &["groups", "delete", "jobs", "stale"], b"").await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not found"), "{err}");
    let (code, _, err) = run(&b, &["groups", "delete", "jobs", ""], b"").await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("group: 0 bytes"), "{err}");
    // A group deleted and created again is a new group: it gets the backlog still stored.
    ok(run(&b, &["publish", "-t", "jobs", "later"], b"").await);
    let m = fast
        .next(Duration::from_secs(10))
        .await
        .expect("fast gets it");
    let mut again = Subscriber::open(b.channel().await, "jobs", "stale", 10).await;
    let got = again
        .next(Duration::from_secs(10))
        .await
        .expect("the new group gets it");
    assert_eq!(got.delivery_tag, m.delivery_tag);
}
