//! Command output on stdout. A reader that goes away early (`shardline metadata | head -1`) is
//! not a failure of the command: a write that meets a closed stdout (EPIPE) becomes
//! `StdoutClosed`, which `main` turns into a quiet exit 0. Never used for sockets: a closed
//! connection to the server is an error, and must not be mistaken for this.

use std::io::Write as _;

/// Stdout's reader closed it (EPIPE): the command stops writing and exits 0 without a message.
#[derive(Debug, thiserror::Error)]
#[error("stdout was closed by its reader")]
pub struct StdoutClosed;

/// `error`, from a write to stdout, as the command's error: `StdoutClosed` for a closed pipe,
/// otherwise the I/O error with the context that it was stdout.
pub fn stdout_error(error: std::io::Error) -> anyhow::Error {
    if error.kind() == std::io::ErrorKind::BrokenPipe {
        anyhow::Error::new(StdoutClosed)
    } else {
        anyhow::Error::new(error).context("cannot write to stdout")
    }
}

/// Whether `error` (anywhere in its chain) is `StdoutClosed`.
pub fn is_stdout_closed(error: &anyhow::Error) -> bool {
    error
        .chain()
        .any(<dyn std::error::Error>::is::<StdoutClosed>)
}

/// Writes `line` and a newline to stdout and flushes, so a closed pipe is noticed here.
///
/// # Errors
/// `StdoutClosed` when the reader closed stdout; any other write error with context.
pub fn print_line(line: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")
        .and_then(|()| stdout.flush())
        .map_err(stdout_error)
}

/// Writes `text` as it is (a caller-built block that ends in its own newline) and flushes.
///
/// # Errors
/// As `print_line`.
pub fn print_text(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(stdout_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_pipe_is_stdout_closed_and_other_errors_are_not() {
        let closed = stdout_error(std::io::ErrorKind::BrokenPipe.into());
        assert!(is_stdout_closed(&closed));
        assert!(is_stdout_closed(&closed.context("while polling")));
        let full = stdout_error(std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert!(!is_stdout_closed(&full));
        assert_eq!(
            format!("{full:#}"),
            "cannot write to stdout: No space left on device (os error 28)"
        );
        // A socket's EPIPE reaches commands as a plain io::Error, never as StdoutClosed.
        let socket = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(!is_stdout_closed(&socket));
    }
}
