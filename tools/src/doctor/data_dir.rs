//! The data-directory checks: where `serve` would write (the directory, or its nearest existing
//! parent when it does not exist yet), whether it can, the filesystem type (tmpfs makes fsync
//! free), free space, `O_DIRECT` support, and the latency of a 4 KiB write + `fdatasync` there.
//!
//! Must never create the data directory or touch anything in it but one temporary file
//! (`.shardline-doctor-*`), which is removed when the checks end, also on error.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use procfs::process::Process;

use super::Check;
use super::limits::{
    DIRECT_IO_ALIGN_BYTES, FREE_SPACE_WARN_BYTES, FSYNC_P50_WARN, FSYNC_SAMPLE_COUNT,
    FSYNC_WRITE_BYTES,
};

/// Every data-directory check, in report order: `data_dir`, `filesystem`, `free_space`,
/// `o_direct`, `fsync_latency`.
pub(super) fn checks(data_dir: &Path) -> Vec<Check> {
    let target = match CheckedDir::locate(data_dir) {
        Ok(target) => target,
        Err(check) => {
            // Nothing to measure: every line says why, so the report keeps its shape.
            let reason = format!("not measured: {}", check.found);
            return vec![
                check,
                Check::warn("filesystem", reason.clone(), "fix data_dir first"),
                Check::warn("free_space", reason.clone(), "fix data_dir first"),
                Check::warn("o_direct", reason.clone(), "fix data_dir first"),
                Check::warn("fsync_latency", reason, "fix data_dir first"),
            ];
        }
    };
    let mut checks = vec![filesystem_check(&target.dir), free_space_check(&target.dir)];
    let scratch = tempfile::Builder::new()
        .prefix(".shardline-doctor-")
        .tempfile_in(&target.dir);
    match scratch {
        Ok(scratch) => {
            checks.insert(0, target.writable_check());
            checks.push(direct_io_check(scratch.path()));
            checks.push(fsync_latency_check(scratch.as_file()));
        }
        Err(error) => {
            let found = format!("cannot create a file in {}: {error}", target.dir.display());
            checks.insert(
                0,
                Check::fail(
                    "data_dir",
                    found.clone(),
                    "give the server's user write access to it (chown/chmod), or choose another \
                     --data-dir",
                ),
            );
            let reason = format!("not measured: {found}");
            checks.push(Check::warn(
                "o_direct",
                reason.clone(),
                "fix data_dir first",
            ));
            checks.push(Check::warn("fsync_latency", reason, "fix data_dir first"));
        }
    }
    checks
}

/// The directory the checks run in.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CheckedDir {
    /// The data directory as given, made absolute.
    data_dir: PathBuf,
    /// The data directory if it exists, else its nearest existing ancestor.
    dir: PathBuf,
}

impl CheckedDir {
    /// Finds the directory to check for `data_dir`.
    ///
    /// # Errors
    /// A `fail` check when the path exists but is not a directory, or cannot be made absolute.
    fn locate(data_dir: &Path) -> Result<CheckedDir, Check> {
        let absolute = std::path::absolute(data_dir).map_err(|error| {
            Check::fail(
                "data_dir",
                format!("cannot resolve {}: {error}", data_dir.display()),
                "pass an existing path, or one whose parent exists",
            )
        })?;
        let dir = nearest_existing(&absolute);
        if !dir.is_dir() {
            return Err(Check::fail(
                "data_dir",
                format!("{} exists and is not a directory", dir.display()),
                "point --data-dir at a directory (or a path that does not exist yet)",
            ));
        }
        Ok(CheckedDir {
            data_dir: absolute,
            dir,
        })
    }

    /// `ok`: the directory is writable (a file was just created in it).
    fn writable_check(&self) -> Check {
        let found = if self.dir == self.data_dir {
            format!("{} exists and is writable", self.dir.display())
        } else {
            format!(
                "{} does not exist yet; serve creates it in {}, which is writable (checked there)",
                self.data_dir.display(),
                self.dir.display()
            )
        };
        Check::ok("data_dir", found)
    }
}

/// `path` if it exists, else its nearest existing ancestor (`/` at worst).
fn nearest_existing(path: &Path) -> PathBuf {
    path.ancestors()
        .find(|ancestor| ancestor.exists())
        .unwrap_or_else(|| Path::new("/"))
        .to_path_buf()
}

/// One mounted filesystem: where, what type, from where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Mount {
    pub point: PathBuf,
    pub fs_type: String,
    pub source: String,
}

/// The mount `path` (canonical) lives on: the longest mount point that is an ancestor of it; of
/// mounts stacked on one point, the last (the visible one).
pub(super) fn mount_of<'a>(path: &Path, mounts: &'a [Mount]) -> Option<&'a Mount> {
    mounts
        .iter()
        .enumerate()
        .filter(|(_, mount)| path.starts_with(&mount.point))
        .max_by_key(|(index, mount)| (mount.point.components().count(), *index))
        .map(|(_, mount)| mount)
}

/// The filesystem type in words: `warn` for RAM-backed (fsync is free and data is lost on reboot)
/// and for network or user-space filesystems (fsync and lock semantics vary), else `ok`.
pub(super) fn filesystem_verdict(dir: &Path, mount: &Mount) -> Check {
    const NAME: &str = "filesystem";
    let found = format!(
        "{} is on {} ({}, mounted at {})",
        dir.display(),
        mount.fs_type,
        mount.source,
        mount.point.display()
    );
    let fs_type = mount.fs_type.as_str();
    if matches!(fs_type, "tmpfs" | "ramfs") {
        return Check::warn(
            NAME,
            format!(
                "{found}: RAM-backed, so fsync is free (benchmarks lie about durable throughput) \
                 and the data is gone after a reboot"
            ),
            "put --data-dir on a disk-backed filesystem (ext4, xfs)",
        );
    }
    if matches!(
        fs_type,
        "nfs" | "nfs4" | "cifs" | "smb3" | "9p" | "virtiofs"
    ) || fs_type.starts_with("fuse")
    {
        return Check::warn(
            NAME,
            format!(
                "{found}: a network or user-space filesystem, whose fsync and file-lock semantics \
                 vary by server"
            ),
            "put --data-dir on a local disk-backed filesystem (ext4, xfs)",
        );
    }
    Check::ok(NAME, found)
}

/// Reads the mount table and judges the filesystem `dir` is on.
fn filesystem_check(dir: &Path) -> Check {
    let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mounts: Vec<Mount> = Process::myself()
        .and_then(|process| process.mountinfo())
        .map(|mounts| {
            mounts
                .0
                .into_iter()
                .map(|mount| Mount {
                    point: mount.mount_point,
                    fs_type: mount.fs_type,
                    source: mount.mount_source.unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default();
    match mount_of(&canonical, &mounts) {
        Some(mount) => filesystem_verdict(&canonical, mount),
        None => Check::warn(
            "filesystem",
            format!(
                "cannot tell the filesystem of {}: not found in /proc/self/mountinfo",
                canonical.display()
            ),
            "check the mount (`findmnt -T DIR`)",
        ),
    }
}

/// `warn` when fewer than `FREE_SPACE_WARN_BYTES` are available to unprivileged writers.
pub(super) fn free_space_verdict(dir: &Path, available_bytes: u64, total_bytes: u64) -> Check {
    const NAME: &str = "free_space";
    let found = format!(
        "{} available of {} on the filesystem of {}",
        bytes_text(available_bytes),
        bytes_text(total_bytes),
        dir.display()
    );
    if available_bytes < FREE_SPACE_WARN_BYTES {
        return Check::warn(
            NAME,
            format!(
                "{found}: below {} (one default log segment); appends fail with StorageFull when \
                 it runs out",
                bytes_text(FREE_SPACE_WARN_BYTES)
            ),
            "free space or choose a larger filesystem for --data-dir",
        );
    }
    Check::ok(NAME, found)
}

/// `statvfs(3)` of `dir` judged by `free_space_verdict`.
fn free_space_check(dir: &Path) -> Check {
    match statvfs_bytes(dir) {
        Ok((available, total)) => free_space_verdict(dir, available, total),
        Err(error) => Check::warn(
            "free_space",
            format!("cannot read the free space of {}: {error}", dir.display()),
            "check the filesystem (`df -h DIR`)",
        ),
    }
}

/// (available to unprivileged users, total) bytes of the filesystem holding `dir`.
fn statvfs_bytes(dir: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt as _;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("the path holds a NUL byte"))?;
    // SAFETY: an all-zero statvfs is a valid value of that plain C struct.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and both pointers live across the call; statvfs only
    // writes the struct.
    if unsafe { libc::statvfs(path.as_ptr(), &raw mut stats) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fragment = stats.f_frsize;
    Ok((stats.f_bavail * fragment, stats.f_blocks * fragment))
}

/// `1.5 GiB`-style text, binary units.
fn bytes_text(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// A zeroed buffer of `DIRECT_IO_ALIGN_BYTES` bytes aligned to as many: what `O_DIRECT` asks of
/// a user buffer.
#[repr(C, align(4096))]
struct AlignedBlock([u8; DIRECT_IO_ALIGN_BYTES]);

const _: () = assert!(std::mem::align_of::<AlignedBlock>() == DIRECT_IO_ALIGN_BYTES);

/// Opens `path` with `O_DIRECT` and writes one aligned block at offset 0: `ok` when both work,
/// `warn` when either is refused (only `serve --write-mode direct` uses `O_DIRECT`, and falls
/// back to buffered writes without it, but a filesystem without it is rarely a disk).
fn direct_io_check(path: &Path) -> Check {
    const NAME: &str = "o_direct";
    let fix = "only --write-mode direct uses O_DIRECT (it falls back to buffered writes without \
               it), but a filesystem without it is usually \
               RAM- or network-backed: put --data-dir on a local disk filesystem (ext4, xfs) for \
               predictable durability";
    let file = match OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(file) => file,
        Err(error) => {
            return Check::warn(
                NAME,
                format!("opening a file with O_DIRECT is refused: {error}"),
                fix,
            );
        }
    };
    let block = Box::new(AlignedBlock([0; DIRECT_IO_ALIGN_BYTES]));
    match file.write_all_at(&block.0, 0) {
        Ok(()) => Check::ok(
            NAME,
            format!("supported (a {DIRECT_IO_ALIGN_BYTES}-byte aligned O_DIRECT write succeeded)"),
        ),
        Err(error) => Check::warn(
            NAME,
            format!(
                "O_DIRECT open accepted but an aligned {DIRECT_IO_ALIGN_BYTES}-byte write failed: {error}"
            ),
            fix,
        ),
    }
}

/// Median and largest of `samples` (`None` for none). The median of an even count is the upper
/// middle sample.
pub(super) fn latency_summary(samples: &[Duration]) -> Option<(Duration, Duration)> {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let p50 = *sorted.get(sorted.len() / 2)?;
    let max = *sorted.last()?;
    Some((p50, max))
}

/// The latency line: `warn` when the median is above `FSYNC_P50_WARN`.
pub(super) fn latency_verdict(samples: &[Duration]) -> Check {
    const NAME: &str = "fsync_latency";
    let Some((p50, max)) = latency_summary(samples) else {
        return Check::warn(NAME, "no samples taken", "rerun doctor");
    };
    let found = format!(
        "{FSYNC_WRITE_BYTES}-byte write + fdatasync: p50 {:.2} ms, max {:.2} ms over {} samples",
        p50.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3,
        samples.len()
    );
    if p50 > FSYNC_P50_WARN {
        return Check::warn(
            NAME,
            format!(
                "{found}: above {} ms, so each `--fsync always` append waits at least that long",
                FSYNC_P50_WARN.as_millis()
            ),
            "use a local SSD/NVMe for --data-dir, or trade durability for latency with --fsync \
             interval=MS",
        );
    }
    Check::ok(NAME, found)
}

/// Appends `FSYNC_SAMPLE_COUNT` blocks of `FSYNC_WRITE_BYTES` to `file`, each followed by
/// `fdatasync`, and judges the latencies. A failed write or sync is `fail`: `serve`'s appends
/// would fail the same way.
fn fsync_latency_check(file: &File) -> Check {
    let block = [0x5a_u8; FSYNC_WRITE_BYTES];
    let mut samples = Vec::with_capacity(FSYNC_SAMPLE_COUNT);
    for index in 0..FSYNC_SAMPLE_COUNT {
        let offset = (index * FSYNC_WRITE_BYTES) as u64;
        let started = Instant::now();
        if let Err(error) = file
            .write_all_at(&block, offset)
            .and_then(|()| file.sync_data())
        {
            return Check::fail(
                "fsync_latency",
                format!("a {FSYNC_WRITE_BYTES}-byte write + fdatasync failed: {error}"),
                "check the disk and filesystem (dmesg); serve's appends would fail the same way",
            );
        }
        samples.push(started.elapsed());
    }
    latency_verdict(&samples)
}

#[cfg(test)]
mod tests {
    use super::super::Status;
    use super::*;

    fn mount(point: &str, fs_type: &str) -> Mount {
        Mount {
            point: PathBuf::from(point),
            fs_type: fs_type.to_owned(),
            source: "src".to_owned(),
        }
    }

    #[test]
    fn the_deepest_visible_mount_wins() {
        let mounts = [
            mount("/", "ext4"),
            mount("/var", "xfs"),
            mount("/var/lib/shardline", "ext4"),
            mount("/var/lib/shardline", "tmpfs"),
            mount("/var/lib/shard", "btrfs"),
        ];
        let of = |path: &str| mount_of(Path::new(path), &mounts).map(|m| m.fs_type.as_str());
        assert_eq!(of("/var/lib/shardline/data"), Some("tmpfs"));
        assert_eq!(
            of("/var/lib/shardlinex"),
            Some("xfs"),
            "components, not string prefixes"
        );
        assert_eq!(of("/home"), Some("ext4"));
        assert_eq!(mount_of(Path::new("/x"), &[]), None);
    }

    #[test]
    fn tmpfs_and_network_filesystems_warn() {
        let dir = Path::new("/d");
        assert_eq!(
            filesystem_verdict(dir, &mount("/", "ext4")).status,
            Status::Ok
        );
        let tmpfs = filesystem_verdict(dir, &mount("/", "tmpfs"));
        assert_eq!(tmpfs.status, Status::Warn);
        assert_eq!(
            tmpfs.found,
            "/d is on tmpfs (src, mounted at /): RAM-backed, so fsync is free (benchmarks lie \
             about durable throughput) and the data is gone after a reboot"
        );
        for fs_type in ["nfs4", "fuse.sshfs", "9p"] {
            assert_eq!(
                filesystem_verdict(dir, &mount("/", fs_type)).status,
                Status::Warn
            );
        }
    }

    #[test]
    fn low_free_space_warns() {
        let dir = Path::new("/d");
        let check = free_space_verdict(dir, 512 << 20, 8 << 30);
        assert_eq!(check.status, Status::Warn);
        assert_eq!(
            check.found,
            "512.0 MiB available of 8.0 GiB on the filesystem of /d: below 1.0 GiB (one default \
             log segment); appends fail with StorageFull when it runs out"
        );
        assert_eq!(free_space_verdict(dir, 2 << 30, 8 << 30).status, Status::Ok);
        assert_eq!(bytes_text(1023), "1023 B");
    }

    #[test]
    fn latency_summary_and_verdict() {
        let ms = Duration::from_millis;
        assert_eq!(latency_summary(&[]), None);
        assert_eq!(
            latency_summary(&[ms(3), ms(1), ms(2)]),
            Some((ms(2), ms(3)))
        );
        assert_eq!(
            latency_summary(&[ms(4), ms(1), ms(3), ms(2)]),
            Some((ms(3), ms(4)))
        );
        let fast = latency_verdict(&[ms(1), ms(2), ms(30)]);
        assert_eq!(fast.status, Status::Ok);
        assert_eq!(
            fast.found,
            "4096-byte write + fdatasync: p50 2.00 ms, max 30.00 ms over 3 samples"
        );
        let slow = latency_verdict(&[ms(11), ms(12), ms(1)]);
        assert_eq!(slow.status, Status::Warn);
        assert!(
            slow.found
                .ends_with("above 10 ms, so each `--fsync always` append waits at least that long")
        );
    }

    #[test]
    fn a_missing_data_dir_is_checked_in_its_parent_and_left_uncreated() {
        let root = tempfile::tempdir().unwrap();
        let data_dir = root.path().join("a/b/data");
        let checks = checks(&data_dir);
        let names: Vec<&str> = checks.iter().map(|check| check.name).collect();
        assert_eq!(
            names,
            [
                "data_dir",
                "filesystem",
                "free_space",
                "o_direct",
                "fsync_latency"
            ]
        );
        assert_eq!(checks[0].status, Status::Ok);
        assert!(
            checks[0].found.contains("does not exist yet"),
            "{}",
            checks[0].found
        );
        assert!(!root.path().join("a").exists());
        // The scratch file is gone.
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
    }

    #[test]
    fn an_unwritable_parent_fails_and_the_disk_checks_say_why_they_were_skipped() {
        // procfs refuses file creation whoever runs the test, root included.
        let checks = checks(Path::new("/proc/shardline-doctor-test/data"));
        let names: Vec<&str> = checks.iter().map(|check| check.name).collect();
        assert_eq!(
            names,
            [
                "data_dir",
                "filesystem",
                "free_space",
                "o_direct",
                "fsync_latency"
            ]
        );
        assert_eq!(checks[0].status, Status::Fail);
        assert!(
            checks[0]
                .found
                .starts_with("cannot create a file in /proc: "),
            "{}",
            checks[0].found
        );
        for skipped in &checks[3..] {
            assert_eq!(skipped.status, Status::Warn);
            assert!(
                skipped
                    .found
                    .starts_with("not measured: cannot create a file in /proc")
            );
        }
    }

    #[test]
    fn a_file_in_place_of_the_directory_fails() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("data");
        std::fs::write(&file, b"x").unwrap();
        let checks = checks(&file);
        assert_eq!(checks[0].status, Status::Fail);
        assert_eq!(
            checks[0].found,
            format!("{} exists and is not a directory", file.display())
        );
        assert_eq!(checks.len(), 5);
    }
}
