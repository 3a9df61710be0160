//! The accept path of one shard: admit a client connection against the shard's connection budget,
//! or refuse it with a `ResourceExhausted` error frame that says why before the close, also when
//! the process is out of file descriptors (a reserve descriptor is closed to make room for the
//! refusal). Keeps the live connections so that the drain at shutdown can reach them.
//!
//! It never leaves a client waiting in the listen backlog because of a limit, and never logs a
//! failing accept more than once per `ACCEPT_WARNING_INTERVAL`.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bus::{Command, ErrorCode, Header, Operation};
use compio::io::AsyncWriteExt;
use compio::net::{TcpListener, TcpStream};
use compio::runtime::JoinHandle;

use crate::connection::serve_connection;
use crate::limits::{ACCEPT_RETRY_SLEEP, ACCEPT_WARNING_INTERVAL, REFUSAL_WRITE_TIMEOUT};
use crate::resources::ResourceBudget;
use crate::shard::Shard;

/// The connection tasks of one shard, each with its socket's descriptor (valid while its task has
/// not finished: the task owns the socket).
#[derive(Debug, Default)]
pub struct Connections {
    tasks: RefCell<Vec<(JoinHandle<()>, RawFd)>>,
}

impl Connections {
    fn push(&self, task: JoinHandle<()>, fd: RawFd) {
        let mut tasks = self.tasks.borrow_mut();
        tasks.retain(|(task, _)| !task.is_finished());
        tasks.push((task, fd));
    }

    /// Shuts the read side of every live connection (`shutdown(2)`, `SHUT_RD`): a read waiting
    /// for the next request returns what the client already sent, then end of stream, so each
    /// connection finishes the request it holds, answers what was already sent with
    /// `ShuttingDown`, and ends. Returns how many connections were live.
    pub fn shut_reads(&self) -> usize {
        let mut tasks = self.tasks.borrow_mut();
        tasks.retain(|(task, _)| !task.is_finished());
        for (_, fd) in tasks.iter() {
            // SAFETY: the task has not finished, so it still owns the socket and `fd` is its
            // descriptor; shutdown(2) changes the socket's state, not memory. ENOTCONN (the peer
            // is gone) is harmless.
            unsafe {
                libc::shutdown(*fd, libc::SHUT_RD);
            }
        }
        tasks.len()
    }

    /// Whether every connection task has finished.
    pub fn all_finished(&self) -> bool {
        self.tasks
            .borrow()
            .iter()
            .all(|(task, _)| task.is_finished())
    }

    /// Cancels every connection task that is still running (after the drain deadline).
    pub fn cancel_all(&self) {
        self.tasks.borrow_mut().clear();
    }
}

/// At most one log line per `interval` for a repeating failure, counting the ones in between.
#[derive(Debug)]
pub struct RateLimitedWarning {
    interval: Duration,
    last_line: Option<Instant>,
    suppressed_count: u64,
}

impl RateLimitedWarning {
    pub fn new(interval: Duration) -> RateLimitedWarning {
        RateLimitedWarning {
            interval,
            last_line: None,
            suppressed_count: 0,
        }
    }

    /// Records one failure at `now`: `Some(count)` when a line is due, `count` being the
    /// failures since the last line (this one included); `None` when it is held back.
    pub fn record(&mut self, now: Instant) -> Option<u64> {
        let due = self
            .last_line
            .is_none_or(|last| now.duration_since(last) >= self.interval);
        if !due {
            self.suppressed_count += 1;
            return None;
        }
        self.last_line = Some(now);
        let count = self.suppressed_count + 1;
        self.suppressed_count = 0;
        Some(count)
    }
}

/// A descriptor held so that, at the open-file limit, closing it makes room to accept one client
/// and tell it why it is refused (the nginx/libuv "reserve fd" idiom).
fn open_reserve() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

/// The error frame a refused client reads before the close. It answers no request (the client
/// has sent none yet): request 0, operation Ping, command Reply, `error_code` ResourceExhausted,
/// the body naming the limit.
pub fn refusal_frame(message: &str) -> Vec<u8> {
    let mut request = Header::new(Command::Request, Operation::Ping);
    request.request = 0;
    bus::reply::error_reply(&request, ErrorCode::ResourceExhausted, message)
}

/// Writes the refusal (bounded by `REFUSAL_WRITE_TIMEOUT`; it fits any socket buffer) and closes.
async fn refuse(mut stream: TcpStream, message: String) {
    let write = stream.write_all(refusal_frame(&message));
    // Err or timeout: the client is gone or does not read; the close below is all it gets.
    let _ = compio::time::timeout(REFUSAL_WRITE_TIMEOUT, write).await;
    drop(stream);
}

/// Accepts connections until the task is cancelled: admitted ones get a `serve_connection` task
/// each, refused ones (connection budget, or no descriptor left) a `ResourceExhausted` frame.
///
/// # Cancel safety
/// Meant to be cancelled (dropped) at shutdown: an accepted stream not yet handed to its task is
/// closed, which the client sees as a refused connection.
pub async fn accept_loop(
    shard: Rc<Shard>,
    budget: ResourceBudget,
    listener: TcpListener,
    connections: Rc<Connections>,
) {
    let mut reserve = open_reserve();
    let mut warning = RateLimitedWarning::new(ACCEPT_WARNING_INTERVAL);
    let mut refusal_warning = RateLimitedWarning::new(ACCEPT_WARNING_INTERVAL);
    loop {
        if reserve.is_none() {
            reserve = open_reserve();
        }
        match listener.accept().await {
            Ok((stream, peer)) => {
                admit(
                    &shard,
                    &budget,
                    stream,
                    peer,
                    &connections,
                    &mut refusal_warning,
                )
                .await;
            }
            Err(error) if storage::space::is_descriptors_exhausted(&error) && reserve.is_some() => {
                // Free one descriptor, take the waiting client, tell it why, close, take the
                // descriptor back.
                drop(reserve.take());
                if let Some(count) = warning.record(Instant::now()) {
                    tracing::warn!(
                        shard = shard.id.0, failed_count = count, %error,
                        "{count} accepts failed in the last {} s: the process is at its open-file limit ({}); refusing clients with ResourceExhausted",
                        ACCEPT_WARNING_INTERVAL.as_secs(), budget.open_file_limit
                    );
                }
                if let Ok((stream, _)) = listener.accept().await {
                    shard.metrics().connection_refused();
                    refuse(stream, budget.fd_limit_refusal()).await;
                }
                reserve = open_reserve();
            }
            Err(error) => {
                if let Some(count) = warning.record(Instant::now()) {
                    tracing::warn!(
                        shard = shard.id.0, failed_count = count, %error,
                        "{count} accepts failed in the last {} s; retrying every {} ms",
                        ACCEPT_WARNING_INTERVAL.as_secs(), ACCEPT_RETRY_SLEEP.as_millis()
                    );
                }
                compio::time::sleep(ACCEPT_RETRY_SLEEP).await;
            }
        }
    }
}

/// Admits one accepted connection against the shard's budget, or refuses it.
async fn admit(
    shard: &Rc<Shard>,
    budget: &ResourceBudget,
    stream: TcpStream,
    peer: SocketAddr,
    connections: &Connections,
    refusal_warning: &mut RateLimitedWarning,
) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
    }
    if !shard.try_admit_connection() {
        if let Some(count) = refusal_warning.record(Instant::now()) {
            tracing::warn!(
                shard = shard.id.0, %peer, refused_count = count,
                "refusing connection: the shard is at its connection limit of {} (open-file budget); {count} refused since the last such line",
                budget.connections_per_shard_max
            );
        }
        shard.metrics().connection_refused();
        refuse(stream, budget.connection_limit_refusal(shard.id.0)).await;
        return;
    }
    tracing::debug!(shard = shard.id.0, %peer, "connection accepted");
    let fd = stream.as_raw_fd();
    let task = compio::runtime::spawn(serve_connection(Rc::clone(shard), stream, peer));
    connections.push(task, fd);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue7_2_accept_warnings_are_one_line_per_interval_with_a_count() {
        let start = Instant::now();
        let mut warning = RateLimitedWarning::new(Duration::from_secs(1));
        assert_eq!(warning.record(start), Some(1));
        // A failure every 10 ms for the next second: held back.
        for step in 1..100 {
            assert_eq!(
                warning.record(start + Duration::from_millis(step * 10)),
                None
            );
        }
        // The first one a second after the last line reports itself and the 99 held back.
        assert_eq!(warning.record(start + Duration::from_secs(1)), Some(100));
        assert_eq!(warning.record(start + Duration::from_millis(1500)), None);
        assert_eq!(warning.record(start + Duration::from_secs(5)), Some(2));
    }

    #[test]
    fn issue7_2_refusal_frame_is_a_resource_exhausted_reply() {
        let frame = refusal_frame("limit 600");
        let header: Header = *bytemuck::from_bytes(&frame[..bus::HEADER_SIZE]);
        assert_eq!(header.command, Command::Reply as u8);
        assert_eq!(header.error_code, ErrorCode::ResourceExhausted as u32);
        assert_eq!(header.error_code, 18);
        assert_eq!(header.request, 0);
        assert_eq!(&frame[bus::HEADER_SIZE..], b"limit 600");
        assert_eq!(header.size as usize, frame.len());
    }
}
