//! Process set-up for the thread-per-core runtime: locked-memory limit, CPU list, executors.

use anyhow::{bail, Context};

/// io_uring buffer memory registered per executor. This broker does no DMA file I/O on its
/// executors (redb has its own threads), so a small pool suffices; it must fit in
/// RLIMIT_MEMLOCK together with the other executors (and, in tests, other brokers).
pub const IO_MEMORY_PER_EXECUTOR: usize = 512 << 10;
/// Threads per executor for blocking work (not pinned: they may run on any CPU).
pub const BLOCKING_THREADS: usize = 2;

/// Raises RLIMIT_MEMLOCK as far as allowed (unlimited when privileged, else the hard limit)
/// and checks that `executors` io_uring pools fit.
///
/// # Errors
/// The limit stays below what the executors need; the message says how to fix it.
pub fn raise_memlock(executors: usize) -> anyhow::Result<u64> {
    use rlimit::Resource;
    let (_, hard) = Resource::MEMLOCK.get().context("reading RLIMIT_MEMLOCK")?;
    if Resource::MEMLOCK
        .set(rlimit::INFINITY, rlimit::INFINITY)
        .is_err()
    {
        Resource::MEMLOCK
            .set(hard, hard)
            .context("raising RLIMIT_MEMLOCK to its hard limit")?;
    }
    let (soft, _) = Resource::MEMLOCK.get().context("reading RLIMIT_MEMLOCK")?;
    // glommio refuses to start below 512 KiB, and each executor registers its pool.
    let need = (executors as u64 * IO_MEMORY_PER_EXECUTOR as u64).max(512 << 10);
    if soft < need {
        bail!(
            "RLIMIT_MEMLOCK is {soft} bytes but {executors} executors need at least {need}: \
             raise it (ulimit -l, or LimitMEMLOCK=infinity in the systemd unit) or lower runtime.cores"
        );
    }
    Ok(soft)
}

/// The CPUs this process may run on (from /proc/self/status `Cpus_allowed_list`), falling
/// back to `0..available_parallelism`.
#[must_use]
pub fn allowed_cpus() -> Vec<usize> {
    let fallback =
        || (0..std::thread::available_parallelism().map_or(1, std::num::NonZero::get)).collect();
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return fallback();
    };
    let Some(line) = status.lines().find(|l| l.starts_with("Cpus_allowed_list:")) else {
        return fallback();
    };
    let list = parse_cpu_list(line.trim_start_matches("Cpus_allowed_list:").trim());
    if list.is_empty() {
        fallback()
    } else {
        list
    }
}

/// Parses a kernel CPU list such as `0-3,6,8-9`.
#[must_use]
pub fn parse_cpu_list(s: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
                    out.extend(a..=b.min(a + 4096));
                }
            }
            None => {
                if let Ok(c) = part.parse() {
                    out.push(c);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,6,8-9"), vec![0, 1, 2, 3, 6, 8, 9]);
        assert_eq!(parse_cpu_list("1"), vec![1]);
        assert!(parse_cpu_list("").is_empty());
        assert!(!allowed_cpus().is_empty());
    }
}
