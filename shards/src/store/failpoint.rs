//! Failpoints for crash tests: `SHARDLINE_FAILPOINT=NAME` makes the process kill itself with
//! SIGKILL the first time execution reaches the point called `NAME`, exactly as `kill -9` would at
//! that instant (no destructor, no flush, no fsync). Names are listed in [`FAILPOINTS`],
//! [`INSTALL_FAILPOINTS`] and [`BOOT_FAILPOINTS`].
//!
//! Read once per process; when the variable is unset every check is one load of a `OnceLock`.
//! It must never do anything but kill the process, and never be reached in normal operation
//! unless the variable is set.

use std::sync::OnceLock;

use crate::limits::FAILPOINT_ENV;

/// Every checkpoint failpoint, in the order a checkpoint reaches them (`storage/FORMAT.md`
/// sections 7-9).
pub const FAILPOINTS: [&str; 9] = [
    "checkpoint.after_tmp_write",
    "checkpoint.after_tmp_fsync",
    "checkpoint.after_rename",
    "checkpoint.after_dir_fsync",
    "checkpoint.after_superblock_copy_0",
    "checkpoint.after_superblock_copy_1",
    "checkpoint.after_superblock_copy_2",
    "checkpoint.after_superblock_copy_3",
    "checkpoint.after_wal_release",
];

/// Every state-transfer install failpoint, in the order an install reaches them (issue 9
/// section 4): the snapshot durable, the superblock pairing durable, the journal restarted.
pub const INSTALL_FAILPOINTS: [&str; 3] = [
    "install.after_snapshot",
    "install.after_superblock",
    "install.after_journal_restart",
];

/// Every boot failpoint: right after a superblock of an older version was upgraded (issue 12's
/// downgrade guard), before shard 0 hands out the metadata and any partition log opens. Reached
/// only on a boot that upgrades.
pub const BOOT_FAILPOINTS: [&str; 1] = ["boot.after_superblock_upgrade"];

/// Whether `name` is a failpoint of any list.
fn is_known(name: &str) -> bool {
    FAILPOINTS.contains(&name)
        || INSTALL_FAILPOINTS.contains(&name)
        || BOOT_FAILPOINTS.contains(&name)
}

/// The armed failpoint: `Ok(None)` when the variable is unset or empty, `Err` naming the value
/// and the known names when it names no failpoint.
fn armed() -> Result<Option<&'static str>, &'static str> {
    static ARMED: OnceLock<Result<Option<String>, String>> = OnceLock::new();
    let armed = ARMED.get_or_init(|| {
        let name = std::env::var(FAILPOINT_ENV).unwrap_or_default();
        if name.is_empty() {
            Ok(None)
        } else if is_known(&name) {
            Ok(Some(name))
        } else {
            Err(format!(
                "invalid {FAILPOINT_ENV} value {name:?}: names no failpoint; known: {}, {}, {}",
                FAILPOINTS.join(", "),
                INSTALL_FAILPOINTS.join(", "),
                BOOT_FAILPOINTS.join(", ")
            ))
        }
    });
    match armed {
        Ok(name) => Ok(name.as_deref()),
        Err(message) => Err(message.as_str()),
    }
}

/// Checks the environment at startup, so a misspelled failpoint fails the start instead of a
/// crash test passing without ever crashing.
///
/// # Errors
/// `SHARDLINE_FAILPOINT` is set to a name in no list: the message names the value and the
/// known names.
pub fn check_env() -> Result<(), String> {
    armed().map(|_| ()).map_err(str::to_owned)
}

/// Kills the process with SIGKILL if `name` is the armed failpoint; otherwise does nothing.
///
/// # Panics
/// If `name` is in none of [`FAILPOINTS`], [`INSTALL_FAILPOINTS`], [`BOOT_FAILPOINTS`] (a bug in
/// the caller).
pub fn hit(name: &str) {
    assert!(is_known(name), "unknown failpoint {name}");
    if armed() == Ok(Some(name)) {
        eprintln!("failpoint {name}: killing the process with SIGKILL");
        // SAFETY: getpid and kill have no memory-safety preconditions.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
        // SIGKILL cannot be caught; delivery to ourselves is synchronous enough, but never return.
        loop {
            std::thread::park();
        }
    }
}
