//! Issue 7, defects found in review: exact replies for a bad data directory, per-message
//! checksums at send, the partition ends on send error replies, and the open-file budget.

mod common;

use std::process::Command;

use common::BIN;

/// Runs `shardline serve --data-dir DATA_DIR` on port 0 and returns its exit code and last
/// stderr line.
fn serve_refused(data_dir: &std::path::Path) -> (Option<i32>, String) {
    let output = Command::new(BIN)
        .args(["serve", "--no-pin", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let last = stderr.lines().last().unwrap_or_default().to_owned();
    (output.status.code(), last)
}

#[test]
fn issue7_review_7_a_data_dir_that_is_a_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"not a directory").unwrap();
    assert_eq!(
        serve_refused(&file),
        (
            Some(1),
            format!(
                "error: --data-dir {} is not a directory; choose a directory (it is created if \
                 missing)",
                file.display()
            )
        )
    );
}

#[test]
fn issue7_review_7_a_data_dir_that_cannot_be_created_is_named() {
    let (code, last) = serve_refused(std::path::Path::new("/proc/nope"));
    assert_eq!(code, Some(1));
    assert_eq!(
        last,
        "error: cannot create data directory /proc/nope: No such file or directory (os error 2)"
    );
}
