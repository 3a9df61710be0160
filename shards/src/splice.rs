//! Poll replies sent from the page cache to the socket without a user-space copy (issue 12 item
//! 2): the verified spans of a read (`storage::VerifiedSpans`, ranges of read-only mappings of
//! segment files) go into a pipe with `vmsplice(2)` and from the pipe to the socket with
//! `splice(2)`, so the socket's buffers reference the page-cache pages and no byte is copied by
//! the server.
//!
//! Why vmsplice of the mapping rather than splice or sendfile from the file: the verified bytes
//! are already mapped (reads verify in place), and a mapping holds no file descriptor, so a reply
//! neither keeps one of its log's closed-file slots (one per partition,
//! `storage::limits::CLOSED_SEGMENT_FILES_OPEN_MAX`) for as long as a slow client takes to read
//! (`REPLY_WRITE_TIMEOUT`) nor carries a descriptor across the mesh when the connection's shard
//! is not the owner: the same path serves both. Both calls are made non-blocking on the shard
//! thread (`SPLICE_F_NONBLOCK`); a full socket is waited for with a readiness poll on the
//! shard's own ring (or poller, under `--io-driver poll`), so no io_uring worker thread is
//! involved and both io drivers take the same path. `sendfile(2)` would need the descriptor,
//! and io_uring's `IORING_OP_SPLICE` always runs in an io-wq worker.
//!
//! Pipes are descriptors too: each shard opens its pipes when it starts (so a shard's
//! descriptors do not grow with its concurrent polls), at most `SPLICE_PIPES_PER_SHARD_MAX`,
//! and all shards together at most `SPLICE_PIPE_FDS_MAX` descriptors, taken from `FD_RESERVE`
//! (`splice_pipe_count_per_shard`); a reply that finds none free (or whose pipe cannot be made)
//! is sent with a copy, never refused.
//!
//! It must never send fewer bytes than the reply header announced without the caller closing
//! the connection: every error here ends the reply, and the caller closes.

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

use compio::net::TcpStream;

use crate::limits::{SPLICE_PIPE_BYTES, SPLICE_PIPE_FDS_MAX, SPLICE_PIPES_PER_SHARD_MAX};

/// Why a spliced reply ended before its last byte; the connection closes.
#[derive(Debug, thiserror::Error)]
pub enum SpliceError {
    /// `vmsplice(2)` could not take the pages of `size` bytes at `position` of `path`: `EFAULT`
    /// means a mapped page lies past the file's end, i.e. the segment shrank under a reply,
    /// which the log's invariant (acknowledged bytes are never cut) says cannot happen.
    #[error(
        "{path}: the {size} bytes at byte {position} could not be taken from the page cache: {source}"
    )]
    Pages {
        path: PathBuf,
        position: u64,
        size: usize,
        source: io::Error,
    },
    /// The socket refused the bytes (peer gone, reset) or its readiness wait failed.
    #[error("socket: {0}")]
    Socket(io::Error),
}

/// One pipe: its read and write ends (both `O_NONBLOCK`, `O_CLOEXEC`) and its capacity.
#[derive(Debug)]
pub struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// Bytes the pipe holds (`F_GETPIPE_SZ`): at most this much goes in per round.
    capacity_bytes: usize,
}

impl Pipe {
    /// A new pipe of `SPLICE_PIPE_BYTES` (or the system's default when `F_SETPIPE_SZ` is
    /// refused, e.g. above `/proc/sys/fs/pipe-max-size`); `None` (logged) when pipe2(2) fails.
    fn open() -> Option<Pipe> {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2(2) writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            tracing::debug!(error = %io::Error::last_os_error(), "no splice pipe: replies are copied");
            return None;
        }
        // SAFETY: pipe2 succeeded, so both are open descriptors owned by nobody else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let requested = i32::try_from(SPLICE_PIPE_BYTES).unwrap_or(i32::MAX);
        // SAFETY: fcntl on a descriptor we own; F_SETPIPE_SZ and F_GETPIPE_SZ take an int.
        let capacity = unsafe {
            libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, requested);
            libc::fcntl(write.as_raw_fd(), libc::F_GETPIPE_SZ)
        };
        let Ok(capacity_bytes) = usize::try_from(capacity) else {
            return None;
        };
        Some(Pipe {
            read,
            write,
            capacity_bytes: capacity_bytes.max(1),
        })
    }
}

/// Splice pipes each of `shard_count` shards keeps: `SPLICE_PIPES_PER_SHARD_MAX`, fewer when
/// that many shards would hold more than `SPLICE_PIPE_FDS_MAX` descriptors (none from 33
/// shards on: their replies are copied).
pub fn splice_pipe_count_per_shard(shard_count: u16) -> usize {
    SPLICE_PIPES_PER_SHARD_MAX.min(SPLICE_PIPE_FDS_MAX / 2 / usize::from(shard_count.max(1)))
}

/// A shard's splice pipes: `pipe_count_max` of them, opened up front; a pipe closed after a
/// failed reply is reopened by the next reply that finds none idle.
#[derive(Debug, Default)]
pub struct SplicePipes {
    idle: RefCell<Vec<Pipe>>,
    /// Pipes open, idle or lent.
    open_count: Cell<usize>,
    pipe_count_max: usize,
}

impl SplicePipes {
    /// Opens `pipe_count_max` pipes (fewer if pipe2(2) fails: those replies are copied).
    pub fn new(pipe_count_max: usize) -> SplicePipes {
        let idle: Vec<Pipe> = (0..pipe_count_max).map_while(|_| Pipe::open()).collect();
        SplicePipes {
            open_count: Cell::new(idle.len()),
            idle: RefCell::new(idle),
            pipe_count_max,
        }
    }

    /// An empty pipe for one reply: an idle one, or a new one within the bounds; `None` when
    /// every pipe is lent or no descriptor is left (the reply is copied instead).
    pub fn take(&self) -> Option<PipeLease<'_>> {
        if let Some(pipe) = self.idle.borrow_mut().pop() {
            return Some(PipeLease {
                pipes: self,
                pipe: Some(pipe),
            });
        }
        if self.open_count.get() >= self.pipe_count_max {
            return None;
        }
        let pipe = Pipe::open()?;
        self.open_count.set(self.open_count.get() + 1);
        Some(PipeLease {
            pipes: self,
            pipe: Some(pipe),
        })
    }
}

/// A pipe lent to one reply. Dropped without [`PipeLease::release`] (a reply that failed or
/// was cancelled midway: the pipe may still hold bytes) it closes the pipe.
#[derive(Debug)]
pub struct PipeLease<'a> {
    pipes: &'a SplicePipes,
    pipe: Option<Pipe>,
}

impl PipeLease<'_> {
    /// Gives the pipe back for the next reply; call only once everything put into it was
    /// spliced out (it is empty).
    pub fn release(mut self) {
        if let Some(pipe) = self.pipe.take() {
            self.pipes.idle.borrow_mut().push(pipe);
        }
    }

    fn pipe(&self) -> &Pipe {
        self.pipe.as_ref().expect("set until released")
    }
}

impl Drop for PipeLease<'_> {
    fn drop(&mut self) {
        if self.pipe.take().is_some() {
            self.pipes.open_count.set(self.pipes.open_count.get() - 1);
        }
    }
}

/// Sets `O_NONBLOCK` on a descriptor and puts its previous status flags back when dropped
/// (also when the send is cancelled by its timeout).
struct NonBlockingGuard {
    fd: std::os::fd::RawFd,
    flags: libc::c_int,
}

impl NonBlockingGuard {
    fn set(fd: std::os::fd::RawFd) -> io::Result<NonBlockingGuard> {
        // SAFETY: fcntl(F_GETFL) on a descriptor borrowed from a live stream; no memory is passed.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above; F_SETFL takes the flags by value.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(NonBlockingGuard { fd, flags })
    }
}

impl Drop for NonBlockingGuard {
    fn drop(&mut self) {
        // SAFETY: as in `set`; the stream outlives the guard (both live in `send_mapped`). A
        // failure leaves the socket non-blocking, which the ring tolerates (it waits for
        // readiness on EAGAIN), so it is ignored.
        unsafe { libc::fcntl(self.fd, libc::F_SETFL, self.flags) };
    }
}

/// Sends `bytes` (page-cache pages of a mapped segment: `storage::VerifiedSpan::bytes` of a
/// mapped span, which `path` and `position` name for the error) to `stream` through `lease`'s
/// pipe: vmsplice(2) at most the pipe's capacity in, splice(2) all of it out, until done.
///
/// # Errors
/// `Pages` when vmsplice fails (`EFAULT`: the segment shrank under the reply), `Socket` when
/// the socket fails or closes. The pipe may hold bytes then: drop the lease, close the
/// connection.
///
/// # Cancel safety
/// Not cancel safe: dropped midway, part of the bytes was sent; the caller closes the
/// connection (and the pipe is closed with the lease).
pub async fn send_mapped(
    stream: &TcpStream,
    lease: &PipeLease<'_>,
    bytes: &[u8],
    path: &std::path::Path,
    position: u64,
) -> Result<(), SpliceError> {
    let pipe = lease.pipe();
    let socket = stream.as_fd().as_raw_fd();
    // SPLICE_F_NONBLOCK makes only the pipe side non-blocking (splice(2)); a socket without
    // O_NONBLOCK (compio's io_uring driver accepts blocking sockets) would block the shard
    // thread once its send buffer is full, stalling every connection of the shard behind one
    // consumer that stopped reading. Non-blocking for these calls only: the other I/O on this
    // connection goes through the ring, which does not expect the flag.
    let _non_blocking = NonBlockingGuard::set(socket).map_err(SpliceError::Socket)?;
    let mut poll_fd = None;
    let mut at = 0usize;
    while at < bytes.len() {
        let chunk = &bytes[at..bytes.len().min(at + pipe.capacity_bytes)];
        let iov = libc::iovec {
            iov_base: chunk.as_ptr().cast_mut().cast(),
            iov_len: chunk.len(),
        };
        // SAFETY: `iov` describes `chunk`, live for the call. Without SPLICE_F_GIFT vmsplice only
        // reads the pages: the pipe takes references to them (page-cache pages of an
        // acknowledged, never rewritten range), so they stay valid after the mapping is gone.
        let moved = unsafe {
            libc::vmsplice(
                pipe.write.as_raw_fd(),
                &raw const iov,
                1,
                libc::SPLICE_F_NONBLOCK,
            )
        };
        let moved = match usize::try_from(moved) {
            Ok(0) | Err(_) => {
                let source = if moved == 0 {
                    io::Error::new(
                        io::ErrorKind::WriteZero,
                        "vmsplice moved nothing into an empty pipe",
                    )
                } else {
                    io::Error::last_os_error()
                };
                return Err(SpliceError::Pages {
                    path: path.to_path_buf(),
                    position: position + at as u64,
                    size: chunk.len(),
                    source,
                });
            }
            Ok(moved) => moved,
        };
        let mut left = moved;
        while left > 0 {
            // SAFETY: both descriptors are open for the call (the pipe's read end we own, the
            // connection's socket borrowed from `stream`); null offsets: neither is seekable.
            let spliced = unsafe {
                libc::splice(
                    pipe.read.as_raw_fd(),
                    std::ptr::null_mut(),
                    socket,
                    std::ptr::null_mut(),
                    left,
                    libc::SPLICE_F_NONBLOCK | libc::SPLICE_F_MOVE,
                )
            };
            match usize::try_from(spliced) {
                Ok(0) => {
                    return Err(SpliceError::Socket(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "splice to the socket moved nothing",
                    )));
                }
                Ok(spliced) => left -= spliced,
                Err(_) => {
                    let error = io::Error::last_os_error();
                    match error.kind() {
                        io::ErrorKind::Interrupted => {}
                        io::ErrorKind::WouldBlock => {
                            if poll_fd.is_none() {
                                poll_fd = Some(stream.to_poll_fd().map_err(SpliceError::Socket)?);
                            }
                            let ready = poll_fd.as_ref().expect("set above").write_ready();
                            ready.await.map_err(SpliceError::Socket)?;
                        }
                        _ => return Err(SpliceError::Socket(error)),
                    }
                }
            }
        }
        at += moved;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use compio::io::AsyncReadExt;
    use compio::net::TcpListener;

    /// A read-only shared mapping of the first `len` bytes of `file`, unmapped on drop.
    struct TestMapping {
        address: *mut libc::c_void,
        len: usize,
    }

    impl TestMapping {
        fn new(file: &std::fs::File, len: usize) -> TestMapping {
            // SAFETY: a fresh read-only mapping chosen by the kernel; checked below.
            let address = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    file.as_raw_fd(),
                    0,
                )
            };
            assert_ne!(address, libc::MAP_FAILED);
            TestMapping { address, len }
        }

        /// The mapped bytes (the test reads them only through vmsplice where the file is
        /// shorter than the mapping).
        fn bytes(&self) -> &[u8] {
            // SAFETY: the mapping lives as long as `self`; the test touches no page past the
            // file's end from user space.
            unsafe { std::slice::from_raw_parts(self.address.cast::<u8>(), self.len) }
        }
    }

    impl Drop for TestMapping {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`, unmapped once.
            unsafe { libc::munmap(self.address, self.len) };
        }
    }

    async fn connected_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = compio::runtime::spawn(async move { TcpStream::connect(addr).await.unwrap() });
        let (server, _) = listener.accept().await.unwrap();
        (server, client.await.unwrap())
    }

    fn pattern_file(size: usize) -> (tempfile::NamedTempFile, Vec<u8>) {
        let bytes: Vec<u8> = (0..size)
            .map(|index| (index * 7 + index / 4096) as u8)
            .collect();
        let mut file = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut file, &bytes).unwrap();
        (file, bytes)
    }

    #[test]
    fn issue12_2_send_mapped_sends_the_mapped_bytes_through_the_pipe() {
        // 3 MiB from an unaligned position: many vmsplice rounds, and a full socket waited for.
        let (file, expected) = pattern_file(3 * 1024 * 1024 + 100);
        compio::runtime::Runtime::new().unwrap().block_on(async {
            let mapping = TestMapping::new(file.as_file(), expected.len());
            let (server, mut client) = connected_pair().await;
            let reader = compio::runtime::spawn(async move {
                let buffer = Vec::with_capacity(expected.len() - 10);
                let compio::BufResult(result, buffer) = client.read_exact(buffer).await;
                result.unwrap();
                (buffer, expected)
            });
            let pipes = SplicePipes::new(1);
            let lease = pipes.take().unwrap();
            assert!(pipes.take().is_none(), "one pipe, lent");
            send_mapped(&server, &lease, &mapping.bytes()[10..], file.path(), 10)
                .await
                .unwrap();
            lease.release();
            let (received, expected) = reader.await.unwrap();
            assert!(
                received == expected[10..],
                "the peer reads the mapped bytes"
            );
            assert!(pipes.take().is_some(), "released: lent again");
        });
    }

    #[test]
    fn issue12_2_a_client_that_stops_reading_never_blocks_the_shard_thread() {
        // The accepted socket is blocking (compio's io_uring driver); a client that never reads
        // fills its buffers. The send must wait on the ring, so the timeout future runs and the
        // send ends with it (the connection is then closed), while the client is still there.
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (outcome_tx, outcome_rx) = std::sync::mpsc::channel();
        let server = std::thread::spawn(move || {
            compio::runtime::Runtime::new()
                .unwrap()
                .block_on(async move {
                    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
                    addr_tx.send(listener.local_addr().unwrap()).unwrap();
                    let (stream, _) = listener.accept().await.unwrap();
                    let fd = stream.as_fd().as_raw_fd();
                    // SAFETY: F_GETFL on a descriptor the stream keeps open.
                    let flags_before = unsafe { libc::fcntl(fd, libc::F_GETFL) };
                    let pipes = SplicePipes::new(1);
                    let lease = pipes.take().unwrap();
                    let bytes = vec![0x5a_u8; 64 << 20];
                    let send = send_mapped(&stream, &lease, &bytes, std::path::Path::new("s"), 0);
                    let timed_out = compio::time::timeout(std::time::Duration::from_secs(1), send)
                        .await
                        .is_err();
                    // SAFETY: as above.
                    let flags_after = unsafe { libc::fcntl(fd, libc::F_GETFL) };
                    outcome_tx
                        .send((timed_out, flags_before, flags_after))
                        .unwrap();
                });
        });
        let client = std::net::TcpStream::connect(addr_rx.recv().unwrap()).unwrap();
        // A blocked thread would only return once the client closes: wait long before closing.
        let outcome = outcome_rx.recv_timeout(std::time::Duration::from_mins(1));
        drop(client);
        server.join().unwrap();
        let (timed_out, flags_before, flags_after) =
            outcome.expect("send_mapped blocked the thread until the client closed");
        assert!(
            timed_out,
            "the send to a client that never reads ends by its timeout"
        );
        assert_eq!(flags_before & libc::O_NONBLOCK, 0, "accepted blocking");
        assert_eq!(flags_after, flags_before, "the socket's flags are put back");
    }

    #[test]
    fn issue12_2_a_mapped_range_past_its_files_end_fails_the_send_instead_of_sending_garbage() {
        let (file, _) = pattern_file(3 * 4096);
        compio::runtime::Runtime::new().unwrap().block_on(async {
            let mapping = TestMapping::new(file.as_file(), 3 * 4096);
            // The file shrinks under the mapping (what the log's invariant rules out).
            file.as_file().set_len(4096).unwrap();
            let (server, _client) = connected_pair().await;
            let pipes = SplicePipes::new(1);
            let lease = pipes.take().unwrap();
            let result = send_mapped(&server, &lease, mapping.bytes(), file.path(), 0).await;
            match result {
                Err(SpliceError::Pages {
                    path,
                    position,
                    source,
                    ..
                }) => {
                    assert_eq!(path, file.path());
                    assert_eq!(position, 4096, "the first page past the end");
                    assert_eq!(source.raw_os_error(), Some(libc::EFAULT));
                }
                other => panic!("expected Pages, got {other:?}"),
            }
            // Not released: the pipe may hold bytes, so it is closed and reopened later.
            drop(lease);
            assert!(pipes.take().is_some());
        });
    }
}
