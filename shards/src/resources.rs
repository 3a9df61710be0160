//! What the server takes from the host at startup: the data-directory lock, the listen address
//! (checked free before SO_REUSEPORT binds), and the open-file budget that bounds partitions and
//! connections. Never touches partition data.

use std::net::SocketAddr;
use std::path::Path;

use socket2::{Domain, Protocol, Socket, Type};

use crate::limits::{
    FD_RESERVE, FDS_PER_PARTITION, LISTEN_BIND_RETRY_MAX, LISTEN_BIND_RETRY_SLEEP, LOCK_FILE_NAME,
    PARTITION_FD_SHARE_PERCENT,
};

/// Budgets derived from the open-file limit, so that creating topics or accepting connections can
/// never exhaust file descriptors and leave the server unable to open its own partitions, or to
/// restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceBudget {
    /// The soft RLIMIT_NOFILE after raising it to the hard limit.
    pub open_file_limit: u64,
    /// Partitions (over all topics) the server accepts.
    pub partitions_max: u64,
    /// Client connections each shard keeps open at once; more are closed at accept.
    pub connections_per_shard_max: u64,
}

impl ResourceBudget {
    /// The budget of `open_file_limit` descriptors for `shard_count` shards: `FD_RESERVE` kept
    /// for the server itself, then `PARTITION_FD_SHARE_PERCENT` of the rest for partitions
    /// (`FDS_PER_PARTITION` each: the active segment, a second file while rolling, and the
    /// closed segment files its log holds for reads, which the log bounds as a whole, reads that
    /// need another waiting for one) and the remainder for client connections, split evenly over
    /// the shards. No floor: a limit too small for one partition and one connection per shard
    /// gives zeros, which `startup_refusal` turns into a refusal to start.
    pub fn from_open_file_limit(open_file_limit: u64, shard_count: u16) -> ResourceBudget {
        let usable = open_file_limit.saturating_sub(FD_RESERVE);
        let partition_fds = usable * PARTITION_FD_SHARE_PERCENT / 100;
        let connection_fds = usable - partition_fds;
        ResourceBudget {
            open_file_limit,
            partitions_max: partition_fds / FDS_PER_PARTITION,
            connections_per_shard_max: connection_fds / u64::from(shard_count.max(1)),
        }
    }

    /// Descriptors the budget shares out: the open-file limit less `FD_RESERVE`.
    pub fn usable_fds(&self) -> u64 {
        self.open_file_limit.saturating_sub(FD_RESERVE)
    }
}

impl ResourceBudget {
    /// Why the server cannot start under this budget (`None` when it can): the open-file limit
    /// leaves no room for one partition or for one client connection per shard. Names the
    /// limit, the reserve, the smallest limit that would do and how to raise it.
    pub fn startup_refusal(&self, shard_count: u16) -> Option<String> {
        if self.partitions_max > 0 && self.connections_per_shard_max > 0 {
            return None;
        }
        let needed = open_file_limit_to_start(shard_count);
        Some(format!(
            "the open-file limit (RLIMIT_NOFILE) is {} but the server reserves {FD_RESERVE} \
             descriptors for itself (listeners, io_uring rings, journal, logs) and needs at least \
             {needed} in all to hold one partition and one client connection on each of its \
             {shard_count} shards; raise it (`ulimit -n {needed}` or more in the shell that starts \
             shardline, or `LimitNOFILE={needed}` in its systemd unit)",
            self.open_file_limit
        ))
    }

    /// Why `partition_count` partitions do not fit the budget (`None` when they do): the limit,
    /// how it is derived, the open-file limit that would fit them and how to raise it. The create
    /// path refuses a topic with the first sentence; boot refuses a data directory with all of it.
    pub fn partitions_refusal(&self, partition_count: u64) -> Option<String> {
        if partition_count <= self.partitions_max {
            return None;
        }
        let open_file_limit_needed = open_file_limit_for_partitions(partition_count);
        Some(format!(
            "the server would hold {partition_count} partitions, above its limit of {} (the \
             open-file limit {} leaves {} descriptors after a reserve of {FD_RESERVE}; half of \
             them, {FDS_PER_PARTITION} per partition, are for partitions); raise the open-file limit (ulimit -n) \
             or use fewer partitions: {partition_count} partitions need an open-file limit of at \
             least {open_file_limit_needed} (`ulimit -n {open_file_limit_needed}`, or \
             `LimitNOFILE={open_file_limit_needed}` in a systemd unit)",
            self.partitions_max,
            self.open_file_limit,
            self.usable_fds(),
        ))
    }

    /// The body of the `ResourceExhausted` frame a client refused by the connection budget reads.
    pub fn connection_limit_refusal(&self, shard: u16) -> String {
        format!(
            "shard {shard} is at its limit of {} client connections (its share of the open-file \
             limit {}); retry later, close idle connections, or raise the open-file limit \
             (ulimit -n / LimitNOFILE=)",
            self.connections_per_shard_max, self.open_file_limit
        )
    }

    /// The body of the `ResourceExhausted` frame a client reads when the process has no file
    /// descriptor left to serve it.
    pub fn fd_limit_refusal(&self) -> String {
        format!(
            "the server is out of file descriptors (open-file limit {}); retry later, or raise the \
             open-file limit (ulimit -n / LimitNOFILE=)",
            self.open_file_limit
        )
    }
}

/// The smallest open-file limit whose budget holds `partition_count` partitions (the inverse of
/// `ResourceBudget::from_open_file_limit`).
pub fn open_file_limit_for_partitions(partition_count: u64) -> u64 {
    let partition_fds = partition_count * FDS_PER_PARTITION;
    FD_RESERVE + (partition_fds * 100).div_ceil(PARTITION_FD_SHARE_PERCENT)
}

/// The smallest open-file limit whose budget holds one partition and one client connection per
/// shard (`ResourceBudget::startup_refusal`). The loop is bounded: a limit of
/// `FD_RESERVE + 2 * (FDS_PER_PARTITION + shard_count)` always fits.
pub fn open_file_limit_to_start(shard_count: u16) -> u64 {
    let bound = FD_RESERVE + 2 * (FDS_PER_PARTITION + u64::from(shard_count.max(1)));
    (FD_RESERVE..=bound)
        .find(|&limit| {
            let budget = ResourceBudget::from_open_file_limit(limit, shard_count);
            budget.partitions_max > 0 && budget.connections_per_shard_max > 0
        })
        .unwrap_or(bound)
}

/// Raises the soft open-file limit to the hard one (what Kafka and Redpanda ask operators to do by
/// hand) and returns the resulting soft limit.
pub fn raise_open_file_limit() -> u64 {
    runtime::probe::raise_soft_limit_to_hard(libc::RLIMIT_NOFILE).unwrap_or(1024)
}

/// Largest allocation glibc serves from its heaps after `tune_allocator` (bytes): the 32 MiB
/// ceiling glibc allows on 64-bit (`DEFAULT_MMAP_THRESHOLD_MAX`).
pub const MALLOC_MMAP_THRESHOLD_BYTES: i32 = 32 * 1024 * 1024;
/// Free heap top glibc keeps instead of returning it to the kernel after `tune_allocator`: the
/// per-shard receive budget, so buffers freed after a burst are reused rather than refaulted.
pub const MALLOC_TRIM_THRESHOLD_BYTES: i32 = 256 * 1024 * 1024;

/// Process-wide allocator policy for the server and the bench; call once, before threads start.
///
/// Batches and poll replies are megabyte buffers allocated and freed per request. By default
/// glibc serves such sizes with a fresh `mmap` each time (or trims its heaps back to the kernel
/// right after the free), so every request paid ~256 page faults per MiB plus kernel zeroing: in
/// `shardline bench` that was most of the shard threads' CPU (0.5-0.75 CPU-s per GB moved, against
/// ~0.2 with this policy). Keeping such buffers in the heaps trades resident memory for that CPU:
/// in-flight request bodies and poll replies are bounded by each shard's receive budget, and at
/// most `MALLOC_TRIM_THRESHOLD_BYTES` of free heap is kept per heap. No-op on non-glibc targets.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes allocator parameters; it is called before other threads
        // allocate concurrently (and glibc serializes it against allocations anyway).
        let (mmap_ok, trim_ok) = unsafe {
            (
                libc::mallopt(libc::M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES),
                libc::mallopt(libc::M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD_BYTES),
            )
        };
        if mmap_ok != 1 || trim_ok != 1 {
            tracing::warn!(
                mmap_ok,
                trim_ok,
                "glibc refused the allocator thresholds; large buffers stay mmap-backed"
            );
        }
    }
}

/// Ignores SIGXFSZ, so that a write past `RLIMIT_FSIZE` fails with EFBIG (which the partition
/// log and the journal roll back and answer `StorageFull`, issue 7 item 1) instead of the
/// signal's default action killing the process mid-write (a write from a thread of the process
/// raises it: `--io-driver poll`, blocking-pool writes; io_uring's kernel workers do not). Call
/// once at startup, before shard threads start.
///
/// # Errors
/// The OS error if the disposition cannot be set (it can always be for SIGXFSZ on Linux).
pub fn ignore_file_size_signal() -> std::io::Result<()> {
    // SAFETY: SIG_IGN installs no handler code; changing a disposition is async-signal-safe and
    // affects no Rust-visible state.
    let previous = unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    if previous == libc::SIG_ERR {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The largest file shardline writes under `config` (bytes): a metadata journal segment
/// (`JOURNAL_SEGMENT_SIZE_MAX`), a partition segment (`--segment-size`), or a segment holding
/// one entry larger than that (bounded by `--max-message-size`).
pub fn file_size_needed(config: &crate::config::ServerConfig) -> u64 {
    storage::limits::JOURNAL_SEGMENT_SIZE_MAX
        .max(config.segment_size_max)
        .max(u64::from(config.max_message_size))
}

/// The soft file-size limit (`RLIMIT_FSIZE`, bytes; `RLIM_INFINITY` when unlimited), or `None`
/// if `getrlimit` fails.
pub fn file_size_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the plain struct passed to it.
    let result = unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &raw mut limit) };
    (result == 0).then_some(limit.rlim_cur)
}

/// Raises the soft file-size limit to the hard one and refuses (`Err` with the message) when it
/// is still below `file_size_needed`: a write past it fails with `EFBIG`, which freeing disk
/// space never cures, so it is named at startup like the locked-memory and open-file limits.
///
/// # Errors
/// The refusal: names `RLIMIT_FSIZE`, its value, what is needed and why, `ulimit -f` and
/// `LimitFSIZE=`.
pub fn check_file_size_limit(config: &crate::config::ServerConfig) -> Result<(), String> {
    let Some(limit) = runtime::probe::raise_soft_limit_to_hard(libc::RLIMIT_FSIZE) else {
        return Ok(());
    };
    let needed = file_size_needed(config);
    if limit >= needed {
        return Ok(());
    }
    Err(file_size_refusal(limit, needed, config))
}

fn file_size_refusal(limit: u64, needed: u64, config: &crate::config::ServerConfig) -> String {
    format!(
        "the file-size limit (RLIMIT_FSIZE) is {limit} bytes but shardline writes files of up to \
         {needed} bytes (the larger of a {}-byte metadata journal segment, --segment-size {} and \
         --max-message-size {}); a write past the limit fails with EFBIG, which freeing disk \
         space does not cure: raise it (`ulimit -f unlimited`, or at least `ulimit -f {}` in \
         1024-byte blocks, in the shell that starts shardline, or `LimitFSIZE=infinity` in its \
         systemd unit)",
        storage::limits::JOURNAL_SEGMENT_SIZE_MAX,
        config.segment_size_max,
        config.max_message_size,
        needed.div_ceil(1024),
    )
}

/// Why the data directory cannot be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "data directory {data_dir} is in use by another shardline process (lock file {lock}); stop it or choose another --data-dir"
    )]
    InUse { data_dir: String, lock: String },
    #[error("cannot lock data directory through {lock}: {source}")]
    Io {
        lock: String,
        source: std::io::Error,
    },
}

/// Takes the exclusive lock (flock) that keeps a second server off this data directory. The lock
/// lives as long as the returned file; the kernel drops it when the process dies, even by kill -9.
pub fn lock_data_dir(data_dir: &Path) -> Result<std::fs::File, LockError> {
    let lock_path = data_dir.join(LOCK_FILE_NAME);
    let lock = lock_path.display().to_string();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&lock_path)
        .map_err(|source| LockError::Io {
            lock: lock.clone(),
            source,
        })?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(LockError::InUse {
            data_dir: data_dir.display().to_string(),
            lock,
        }),
        Err(std::fs::TryLockError::Error(source)) => Err(LockError::Io { lock, source }),
    }
}

/// Whether a directory exists and holds at least one entry.
pub fn has_entries(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some())
}

/// Binds a plain socket (no SO_REUSEPORT) to learn whether the address is free and which port
/// port 0 picks. Without it a second server would silently join the first one's SO_REUSEPORT
/// group, and the kernel would split connections between two processes.
pub fn probe_listen_addr(addr: SocketAddr) -> std::io::Result<SocketAddr> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket
        .local_addr()?
        .as_socket()
        .ok_or_else(|| std::io::Error::other("bound socket has no inet address"))
}

/// `probe_listen_addr`, retried while the address is in use for up to `LISTEN_BIND_RETRY_MAX`:
/// a server killed a moment ago keeps its listeners until the kernel has torn its rings down
/// (a few milliseconds), so an immediate restart on the same port would otherwise fail. Logs
/// once when it starts waiting. A port held by a live server still fails, after the wait.
pub fn probe_listen_addr_retrying(addr: SocketAddr) -> std::io::Result<SocketAddr> {
    let deadline = std::time::Instant::now() + LISTEN_BIND_RETRY_MAX;
    let mut logged = false;
    loop {
        match probe_listen_addr(addr) {
            Err(error)
                if error.kind() == std::io::ErrorKind::AddrInUse
                    && std::time::Instant::now() < deadline =>
            {
                if !logged {
                    tracing::info!(
                        %addr, retry_s = LISTEN_BIND_RETRY_MAX.as_secs(),
                        "listen address in use (a server stopped a moment ago may still hold it); retrying"
                    );
                    logged = true;
                }
                std::thread::sleep(LISTEN_BIND_RETRY_SLEEP);
            }
            result => return result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_splits_the_open_file_limit() {
        let budget = ResourceBudget::from_open_file_limit(20_256, 2);
        assert_eq!(budget.partitions_max, 3_333);
        assert_eq!(budget.connections_per_shard_max, 5_000);
        assert_eq!(budget.startup_refusal(2), None);
    }

    #[test]
    fn issue7_review_6_no_floor_the_budget_is_what_the_limit_leaves() {
        // `ulimit -n 300`: 44 descriptors after the reserve, 22 for partitions at three each.
        let budget = ResourceBudget::from_open_file_limit(300, 1);
        assert_eq!(
            (budget.partitions_max, budget.connections_per_shard_max),
            (7, 22)
        );
        assert_eq!(
            budget.partitions_refusal(8).unwrap(),
            "the server would hold 8 partitions, above its limit of 7 (the open-file limit 300 \
             leaves 44 descriptors after a reserve of 256; half of them, 3 per partition, are for \
             partitions); raise the open-file limit (ulimit -n) or use fewer partitions: 8 \
             partitions need an open-file limit of at least 304 (`ulimit -n 304`, or \
             `LimitNOFILE=304` in a systemd unit)"
        );
        // `ulimit -n 40`: nothing is left after the reserve, so the server refuses to start
        // instead of promising partitions and connections it cannot open.
        let tiny = ResourceBudget::from_open_file_limit(40, 1);
        assert_eq!(
            (tiny.partitions_max, tiny.connections_per_shard_max),
            (0, 0)
        );
        assert_eq!(
            tiny.startup_refusal(1).unwrap(),
            "the open-file limit (RLIMIT_NOFILE) is 40 but the server reserves 256 descriptors for \
             itself (listeners, io_uring rings, journal, logs) and needs at least 262 in all to \
             hold one partition and one client connection on each of its 1 shards; raise it \
             (`ulimit -n 262` or more in the shell that starts shardline, or `LimitNOFILE=262` in \
             its systemd unit)"
        );
        for shard_count in [1u16, 2, 7, 64] {
            let needed = open_file_limit_to_start(shard_count);
            assert_eq!(
                ResourceBudget::from_open_file_limit(needed, shard_count)
                    .startup_refusal(shard_count),
                None
            );
            assert!(
                ResourceBudget::from_open_file_limit(needed - 1, shard_count)
                    .startup_refusal(shard_count)
                    .is_some()
            );
        }
        // 127 usable: 63 for partitions (21 of them), 64 for connections (one per shard).
        assert_eq!(open_file_limit_to_start(64), 256 + 127);
    }

    #[test]
    fn issue7_2_partition_refusal_names_need_limit_and_fix() {
        // The issue's case: 4 topics x 1000 partitions under `ulimit -n 2048`.
        let budget = ResourceBudget::from_open_file_limit(2048, 2);
        assert_eq!(budget.partitions_max, 298);
        assert_eq!(budget.partitions_refusal(298), None);
        assert_eq!(
            budget.partitions_refusal(4000).unwrap(),
            "the server would hold 4000 partitions, above its limit of 298 (the open-file limit \
             2048 leaves 1792 descriptors after a reserve of 256; half of them, 3 per \
             partition, are for partitions); raise the open-file limit (ulimit -n) or use fewer \
             partitions: 4000 partitions need an open-file limit of at least 24256 (`ulimit -n \
             24256`, or `LimitNOFILE=24256` in a systemd unit)"
        );
        // The limit named is enough, and one less is not.
        assert_eq!(open_file_limit_for_partitions(1), 262);
        for count in [1, 7, 8, 298, 299, 4000, 12_345] {
            let needed = open_file_limit_for_partitions(count);
            assert!(ResourceBudget::from_open_file_limit(needed, 2).partitions_max >= count);
            assert!(ResourceBudget::from_open_file_limit(needed - 1, 2).partitions_max < count);
        }
    }

    #[test]
    fn issue7_2_refusal_bodies_name_the_limit() {
        let budget = ResourceBudget::from_open_file_limit(600, 1);
        assert_eq!(
            budget.connection_limit_refusal(0),
            "shard 0 is at its limit of 172 client connections (its share of the open-file limit \
             600); retry later, close idle connections, or raise the open-file limit (ulimit -n / \
             LimitNOFILE=)"
        );
        assert_eq!(
            budget.fd_limit_refusal(),
            "the server is out of file descriptors (open-file limit 600); retry later, or raise \
             the open-file limit (ulimit -n / LimitNOFILE=)"
        );
    }

    #[test]
    fn issue7_review_3_a_file_size_limit_below_the_segment_size_is_named() {
        let mut config = crate::config::ServerConfig::new(std::path::PathBuf::from("d"));
        config.segment_size_max = 1 << 30;
        assert_eq!(file_size_needed(&config), 1 << 30);
        config.segment_size_max = 1 << 20;
        assert_eq!(file_size_needed(&config), 64 << 20);
        assert_eq!(
            file_size_refusal(204_800, 64 << 20, &config),
            format!(
                "the file-size limit (RLIMIT_FSIZE) is 204800 bytes but shardline writes files of \
                 up to 67108864 bytes (the larger of a 67108864-byte metadata journal segment, \
                 --segment-size 1048576 and --max-message-size {}); a write past the limit fails \
                 with EFBIG, which freeing disk space does not cure: raise it (`ulimit -f \
                 unlimited`, or at least `ulimit -f 65536` in 1024-byte blocks, in the shell that \
                 starts shardline, or `LimitFSIZE=infinity` in its systemd unit)",
                config.max_message_size
            )
        );
    }

    #[test]
    fn second_lock_on_a_data_dir_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _held = lock_data_dir(dir.path()).unwrap();
        let message = lock_data_dir(dir.path()).unwrap_err().to_string();
        assert!(
            message.contains("is in use by another shardline process"),
            "{message}"
        );
    }

    #[test]
    fn a_listening_port_is_not_free() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken = listener.local_addr().unwrap();
        let error = probe_listen_addr(taken).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::AddrInUse);
        assert_ne!(
            probe_listen_addr("127.0.0.1:0".parse().unwrap())
                .unwrap()
                .port(),
            0
        );
    }
}
