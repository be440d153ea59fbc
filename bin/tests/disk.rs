//! A full data disk degrades the broker, it does not stop it (issue 26): below
//! `storage.minFreeBytes` publishes are refused RESOURCE_EXHAUSTED naming the disk, while
//! deliveries, ACKs, Cancel, stats and health go on, and publishes are taken again by
//! themselves once space returns. On a small ext4 file system loop-mounted for the test (root
//! and `mkfs.ext4` needed: CI runs as root; elsewhere the test says it is skipped).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use futureq_bench::pb::future_q_producer_client::FutureQProducerClient;
use futureq_bench::pb::CancelRequest;

/// A loop-mounted ext4 file system, unmounted when dropped.
struct SmallDisk {
    _dir: tempfile::TempDir,
    mnt: PathBuf,
}

impl SmallDisk {
    /// `size_mib` MiB, or `None` (with the reason printed) where it cannot be made.
    fn mount(size_mib: u64) -> Option<SmallDisk> {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        let run = |cmd: &str, args: &[&str]| -> bool {
            Command::new(cmd)
                .args(args)
                .output()
                .is_ok_and(|o| o.status.success())
        };
        let size = format!("{size_mib}M");
        let (img_s, mnt_s) = (img.to_str().unwrap(), mnt.to_str().unwrap());
        let ok = run("truncate", &["-s", &size, img_s])
            && run("mkfs.ext4", &["-q", "-F", img_s])
            && run("mount", &["-o", "loop", img_s, mnt_s]);
        if !ok {
            eprintln!("skipped: cannot loop-mount a small ext4 file system here (root, mkfs.ext4 and a loop device are needed)");
            return None;
        }
        Some(SmallDisk { _dir: dir, mnt })
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

fn fill(file: &Path, bytes: u64) {
    let ok = Command::new("fallocate")
        .args(["-l", &bytes.to_string()])
        .arg(file)
        .status()
        .unwrap()
        .success();
    assert!(ok, "fallocate {bytes} bytes");
}

/// Waits until `f` holds, polling, for at most 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_publishes_and_serves_the_rest() {
    let Some(disk) = SmallDisk::mount(512) else {
        return;
    };
    const MIN_FREE: u64 = 128 << 20;
    let data = disk.mnt.join("data");
    let b = Broker::start(&format!(
        "storage:\n  dataDir: {}\n  minFreeBytes: 128MiB\n",
        data.display()
    ))
    .await;
    let mut p = Publisher::open(b.channel().await).await;
    // Owed before the disk fills: one to deliver and ACK, one to cancel.
    let ack = p
        .publish(batch(
            1,
            0,
            vec![
                msg("disk", "deliver", 1500, 0),
                msg("disk", "cancel", 3_600_000, 0),
            ],
        ))
        .await;
    assert!(ack.success, "{ack:?}");
    let mut sub = Subscriber::open(b.channel().await, "disk", "", 10).await;
    eventually("the free space is read", || async {
        b.metric("futureq_disk_free_bytes").await > 0.0
    })
    .await;
    assert_eq!(b.metric("futureq_disk_low").await, 0.0);
    let free = b.metric("futureq_disk_free_bytes").await as u64;
    assert!(
        free > MIN_FREE + (16 << 20),
        "the file system is too small: {free}"
    );
    // Leave 8 MiB less than the floor.
    let filler = disk.mnt.join("filler");
    fill(&filler, free - MIN_FREE + (8 << 20));
    eventually("the floor is seen", || async {
        b.metric("futureq_disk_low").await == 1.0
    })
    .await;
    let refused = p
        .publish(batch(2, 0, vec![msg("disk", "refused", 0, 0)]))
        .await;
    assert!(!refused.success);
    assert_eq!(
        refused.error_code,
        tonic::Code::ResourceExhausted as u32,
        "{refused:?}"
    );
    assert!(
        refused.error_message.contains("storage.minFreeBytes")
            && refused
                .error_message
                .contains("nothing of this batch was stored"),
        "{refused:?}"
    );
    // Everything else goes on: the delivery, its ACK (a delete), a cancel, stats, health.
    let m = sub
        .next(Duration::from_secs(5))
        .await
        .expect("delivered while the disk is low");
    assert_eq!(&m.payload[..], b"deliver");
    sub.ack(&m.delivery_tag, true);
    let cancelled = FutureQProducerClient::new(b.channel().await)
        .cancel(CancelRequest {
            delivery_tags: vec![ack.delivery_tags[1].to_vec()],
        })
        .await
        .unwrap()
        .into_inner()
        .cancelled;
    assert_eq!(cancelled, vec![true]);
    eventually("the ACK's delete is applied", || async {
        topic_stats(&b, "disk").await[0].stored == 0
    })
    .await;
    assert!(
        b.log()
            .contains("below storage.minFreeBytes: refusing publishes"),
        "{}",
        b.log_tail(20)
    );
    // Space returns: publishes are taken again by themselves.
    std::fs::remove_file(&filler).unwrap();
    eventually("the room is seen", || async {
        b.metric("futureq_disk_low").await == 0.0
    })
    .await;
    let ack = p
        .publish(batch(3, 0, vec![msg("disk", "again", 0, 0)]))
        .await;
    assert!(ack.success, "{ack:?}");
    assert!(b.log().contains("has room again"), "{}", b.log_tail(20));
}
