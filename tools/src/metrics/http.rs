//! The `/metrics` HTTP listener: a plain `std` TCP listener on its own thread, and one short-lived
//! thread per connection (at most [`ListenerLimits::connections_max`] at once). It answers
//! `GET /metrics` (and `HEAD`) with one scrape, other paths with 404, other methods with 405, a
//! malformed request with 400, and closes every connection after one answer.
//!
//! Why not an HTTP server crate: `tiny_http` 0.12 (the small synchronous one) sets no socket
//! timeouts and spawns a thread for every connection without a bound, so a client that connects
//! and stays silent (or never reads its answer) pins a thread and a descriptor forever, and the
//! descriptors come out of the same open-file limit the shards budget. Serving one GET needs only
//! the request line, so this listener reads at most [`ListenerLimits::head_bytes_max`] bytes of
//! request head and gives every connection [`ListenerLimits::connection_deadline`] in all to
//! send its head and read its answer.
//!
//! It must never run on a shard's thread, and never block one: a scrape asks the shards over
//! their bounded metrics lanes and waits on this side only.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::encode::CONTENT_TYPE;

/// How often the accept thread checks whether it was asked to stop.
const ACCEPT_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Time to write the 408 answer of a connection whose head missed its deadline.
const TIMEOUT_ANSWER_GRACE: Duration = Duration::from_secs(1);

/// Bounds on what one client can cost the listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerLimits {
    /// Largest request head (request line and headers), bytes; a longer one gets 431.
    pub head_bytes_max: usize,
    /// Time a connection has, from accept, to send its request head and read the answer; past
    /// it the connection is closed. Bounds how long a slow or silent client holds a thread.
    pub connection_deadline: Duration,
    /// Connections served at once; one more is closed at accept (with a best-effort 503).
    pub connections_max: usize,
}

impl Default for ListenerLimits {
    /// 8 KiB of head (a scraper sends a few hundred bytes), 10 s per connection (Prometheus's
    /// default scrape timeout), 8 connections (a scraper or two, plus a person with curl).
    fn default() -> ListenerLimits {
        ListenerLimits {
            head_bytes_max: 8 * 1024,
            connection_deadline: Duration::from_secs(10),
            connections_max: 8,
        }
    }
}

/// Produces the body of one `GET /metrics` answer (OpenMetrics text).
pub type Scraper = Arc<dyn Fn() -> String + Send + Sync>;

/// Why the metrics listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// The address is taken, not local, or not permitted: pick another with `setting`.
    #[error("cannot serve metrics on {addr} ({setting}): {source}")]
    Bind {
        addr: SocketAddr,
        /// Where the address came from (`--metrics-listen`, or the config file key).
        setting: String,
        source: std::io::Error,
    },
    /// The listener thread could not be spawned.
    #[error("cannot start the metrics listener thread: {0}")]
    Spawn(std::io::Error),
}

/// A bound, not yet serving, metrics socket: bind before the server starts so that a taken port
/// refuses startup before anything else happens.
#[derive(Debug)]
pub struct BoundListener {
    listener: TcpListener,
    local_addr: SocketAddr,
}

impl BoundListener {
    /// Binds `addr` (port 0 picks a free port).
    ///
    /// # Errors
    /// `ListenError::Bind` naming `addr` and `setting` (how the operator set it).
    pub fn bind(addr: SocketAddr, setting: &str) -> Result<BoundListener, ListenError> {
        let bind_error = |source| ListenError::Bind {
            addr,
            setting: setting.to_owned(),
            source,
        };
        let listener = TcpListener::bind(addr).map_err(bind_error)?;
        listener.set_nonblocking(true).map_err(bind_error)?;
        let local_addr = listener.local_addr().map_err(bind_error)?;
        Ok(BoundListener {
            listener,
            local_addr,
        })
    }

    /// The bound address (the chosen port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves on a thread of its own until [`MetricsListener::stop`] (or drop).
    ///
    /// # Errors
    /// `ListenError::Spawn` when the thread cannot be created.
    pub fn serve(
        self,
        scraper: Scraper,
        limits: ListenerLimits,
    ) -> Result<MetricsListener, ListenError> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let local_addr = self.local_addr;
        let thread = std::thread::Builder::new()
            .name("metrics-accept".to_owned())
            .spawn(move || accept_loop(&self.listener, &scraper, limits, &thread_stop))
            .map_err(ListenError::Spawn)?;
        Ok(MetricsListener {
            local_addr,
            stop,
            thread: Some(thread),
        })
    }
}

/// The running listener; stops its accept thread when stopped or dropped (connections already
/// accepted finish within their deadline).
#[derive(Debug)]
pub struct MetricsListener {
    local_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsListener {
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting and waits for the accept thread (at most about 100 ms).
    pub fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the metrics accept thread panicked");
        }
    }
}

impl Drop for MetricsListener {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

fn accept_loop(
    listener: &TcpListener,
    scraper: &Scraper,
    limits: ListenerLimits,
    stop: &AtomicBool,
) {
    let active = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Acquire) {
        if !wait_readable(listener, ACCEPT_POLL_INTERVAL) {
            continue;
        }
        match listener.accept() {
            Ok((stream, peer)) => admit(stream, peer, scraper, limits, &active),
            Err(error) if error.kind() == ErrorKind::WouldBlock => {}
            Err(error) => {
                // EMFILE and friends: back off instead of spinning; the listener stays up.
                tracing::warn!(%error, "metrics listener: accept failed");
                std::thread::sleep(ACCEPT_POLL_INTERVAL);
            }
        }
    }
}

/// Whether `listener` has a connection waiting, waiting up to `timeout`.
fn wait_readable(listener: &TcpListener, timeout: Duration) -> bool {
    let mut poll_fd = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd for a descriptor `listener` keeps open for the call.
    let ready = unsafe { libc::poll(&raw mut poll_fd, 1, timeout_ms) };
    ready > 0
}

/// Serves `stream` on a thread of its own, or refuses it when `connections_max` are active.
fn admit(
    stream: TcpStream,
    peer: SocketAddr,
    scraper: &Scraper,
    limits: ListenerLimits,
    active: &Arc<AtomicUsize>,
) {
    if active.fetch_add(1, Ordering::AcqRel) >= limits.connections_max {
        active.fetch_sub(1, Ordering::AcqRel);
        refuse_busy(&stream);
        return;
    }
    let scraper = Arc::clone(scraper);
    let thread_active = Arc::clone(active);
    let spawned = std::thread::Builder::new()
        .name("metrics-conn".to_owned())
        .spawn(move || {
            serve_connection(stream, &scraper, limits);
            thread_active.fetch_sub(1, Ordering::AcqRel);
        });
    if let Err(error) = spawned {
        active.fetch_sub(1, Ordering::AcqRel);
        tracing::warn!(%error, %peer, "metrics listener: cannot spawn a connection thread");
    }
}

/// A 503 written without waiting (the socket buffer takes it or it is lost), then close.
fn refuse_busy(stream: &TcpStream) {
    let answer = response(
        503,
        "Service Unavailable",
        "too many metrics connections\n",
        &[],
    );
    if stream.set_nonblocking(true).is_ok() {
        let _ = (&*stream).write(&answer);
        // Unread request bytes at close would reset the connection before the client reads the
        // 503: take what already arrived.
        let _ = (&*stream).read(&mut [0u8; 4096]);
    }
    let _ = stream.shutdown(Shutdown::Both);
}

/// What one request asks for, as far as this listener cares.
#[derive(Debug, PartialEq, Eq)]
enum Request {
    /// `GET` or `HEAD` of `/metrics` (`head_only` for HEAD).
    Metrics {
        head_only: bool,
    },
    NotFound {
        path: String,
    },
    MethodNotAllowed {
        method: String,
    },
    Malformed(&'static str),
}

/// Reads one request head, answers it, closes. Every read and write shares the deadline.
fn serve_connection(mut stream: TcpStream, scraper: &Scraper, limits: ListenerLimits) {
    let deadline = Instant::now() + limits.connection_deadline;
    // Accepted sockets do not inherit O_NONBLOCK on Linux; make sure anyway.
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    // The 408 for a head that missed the deadline gets a moment of its own to be written.
    let mut write_deadline = deadline;
    let answer = match read_head(&mut stream, limits.head_bytes_max, deadline) {
        Ok(head) => answer(&parse_request(&head), scraper),
        Err(HeadError::TooLarge) => response(
            431,
            "Request Header Fields Too Large",
            &format!("request head over {} bytes\n", limits.head_bytes_max),
            &[],
        ),
        Err(HeadError::TimedOut) => {
            write_deadline = Instant::now() + TIMEOUT_ANSWER_GRACE;
            response(408, "Request Timeout", "request head too slow\n", &[])
        }
        Err(HeadError::Closed) => return,
    };
    if write_before(&mut stream, &answer, write_deadline).is_ok() {
        let _ = stream.shutdown(Shutdown::Write);
        drain_briefly(&mut stream, write_deadline);
    }
}

#[derive(Debug, PartialEq, Eq)]
enum HeadError {
    TooLarge,
    TimedOut,
    /// The peer closed or reset before a whole head arrived: nothing to answer.
    Closed,
}

/// Reads until the blank line that ends a request head.
fn read_head(
    stream: &mut TcpStream,
    head_bytes_max: usize,
    deadline: Instant,
) -> Result<Vec<u8>, HeadError> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        match head_end(&head) {
            Some(end) if end <= head_bytes_max => {
                head.truncate(end);
                return Ok(head);
            }
            Some(_) => return Err(HeadError::TooLarge),
            None if head.len() > head_bytes_max => return Err(HeadError::TooLarge),
            None => {}
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return Err(HeadError::TimedOut);
        }
        match stream.read(&mut chunk) {
            Ok(0) => return Err(HeadError::Closed),
            Ok(count) => head.extend_from_slice(&chunk[..count]),
            Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(HeadError::TimedOut);
            }
            Err(error) if error.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Err(HeadError::Closed),
        }
    }
}

/// The length of the head in `bytes` up to its ending blank line (`\r\n\r\n`, or a bare `\n\n`
/// that lenient clients send), if it arrived.
fn head_end(bytes: &[u8]) -> Option<usize> {
    let crlf = bytes.windows(4).position(|window| window == b"\r\n\r\n");
    let lf = bytes.windows(2).position(|window| window == b"\n\n");
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (found, None) | (None, found) => found,
    }
}

/// The request line of `head` judged: only `GET`/`HEAD /metrics` (with any query) is served.
fn parse_request(head: &[u8]) -> Request {
    let Ok(text) = std::str::from_utf8(head) else {
        return Request::Malformed("the request head is not UTF-8");
    };
    let line = text.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Request::Malformed("the request line is not METHOD TARGET HTTP/1.x");
    };
    if !matches!(version.trim_end(), "HTTP/1.0" | "HTTP/1.1") {
        return Request::Malformed("only HTTP/1.0 and HTTP/1.1 are served");
    }
    if method.is_empty() || !method.bytes().all(|byte| byte.is_ascii_uppercase()) {
        return Request::Malformed("the method is not an HTTP method token");
    }
    let path = target.split_once('?').map_or(target, |(path, _)| path);
    if path != "/metrics" {
        return Request::NotFound {
            path: path.chars().take(200).collect(),
        };
    }
    match method {
        "GET" => Request::Metrics { head_only: false },
        "HEAD" => Request::Metrics { head_only: true },
        other => Request::MethodNotAllowed {
            method: other.chars().take(32).collect(),
        },
    }
}

fn answer(request: &Request, scraper: &Scraper) -> Vec<u8> {
    match request {
        Request::Metrics { head_only } => {
            let body = scraper();
            let mut answer = response(200, "OK", &body, &[("Content-Type", CONTENT_TYPE)]);
            if *head_only {
                answer.truncate(answer.len() - body.len());
            }
            answer
        }
        Request::NotFound { path } => response(
            404,
            "Not Found",
            &format!("{path:?} not found: metrics are served at /metrics\n"),
            &[],
        ),
        Request::MethodNotAllowed { method } => response(
            405,
            "Method Not Allowed",
            &format!("method {method} not allowed on /metrics: use GET\n"),
            &[("Allow", "GET, HEAD")],
        ),
        Request::Malformed(why) => response(400, "Bad Request", &format!("{why}\n"), &[]),
    }
}

/// A whole `HTTP/1.1` answer that closes the connection; text bodies default to `text/plain`.
fn response(code: u16, reason: &str, body: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    use std::fmt::Write as _;
    let mut head = format!("HTTP/1.1 {code} {reason}\r\n");
    if !headers.iter().any(|(name, _)| *name == "Content-Type") {
        head.push_str("Content-Type: text/plain; charset=utf-8\r\n");
    }
    // Writing to a String cannot fail.
    for (name, value) in headers {
        let _ = write!(head, "{name}: {value}\r\n");
    }
    let _ = write!(
        head,
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body.as_bytes());
    bytes
}

/// Writes all of `bytes`, giving up at `deadline` (a client that does not read).
fn write_before(
    stream: &mut TcpStream,
    mut bytes: &[u8],
    deadline: Instant,
) -> std::io::Result<()> {
    while !bytes.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        stream.set_write_timeout(Some(left))?;
        match stream.write(bytes) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(count) => bytes = &bytes[count..],
            Err(error) if error.kind() == ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// After answering: reads what the client still sends (a request body we ignored) until it
/// closes, for at most 1 s and the deadline, so that closing with unread bytes does not reset the
/// connection before the client read the answer.
fn drain_briefly(stream: &mut TcpStream, deadline: Instant) {
    let until = deadline.min(Instant::now() + Duration::from_secs(1));
    let mut sink = [0u8; 4096];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scraper() -> Scraper {
        Arc::new(|| "# EOF\n".to_owned())
    }

    fn start(limits: ListenerLimits) -> MetricsListener {
        BoundListener::bind("127.0.0.1:0".parse().unwrap(), "--metrics-listen")
            .unwrap()
            .serve(scraper(), limits)
            .unwrap()
    }

    /// Sends `request` raw and reads the whole answer (the listener closes after it).
    fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.write_all(request).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    }

    #[test]
    fn get_metrics_is_served_and_everything_else_is_refused() {
        let listener = start(ListenerLimits::default());
        let addr = listener.local_addr();
        let ok = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(
            ok.contains(&format!("Content-Type: {CONTENT_TYPE}\r\n")),
            "{ok}"
        );
        assert!(
            ok.contains("Content-Length: 6\r\n") && ok.ends_with("\r\n\r\n# EOF\n"),
            "{ok}"
        );
        let query = exchange(addr, b"GET /metrics?x=1 HTTP/1.0\r\n\r\n");
        assert!(query.starts_with("HTTP/1.1 200 OK\r\n"), "{query}");
        let head = exchange(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(
            head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"),
            "{head}"
        );
        let missing = exchange(addr, b"GET / HTTP/1.1\r\n\r\n");
        assert!(
            missing.starts_with("HTTP/1.1 404 Not Found\r\n"),
            "{missing}"
        );
        assert!(missing.ends_with("\"/\" not found: metrics are served at /metrics\n"));
        let post = exchange(
            addr,
            b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
        );
        assert!(
            post.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
            "{post}"
        );
        assert!(post.contains("Allow: GET, HEAD\r\n"), "{post}");
        for bad in [
            &b"GARBAGE\r\n\r\n"[..],
            b"GET /metrics HTTP/2.0\r\n\r\n",
            b"\xff\xfe\r\n\r\n",
        ] {
            let answer = exchange(addr, bad);
            assert!(
                answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
                "{answer}"
            );
        }
        listener.stop();
    }

    #[test]
    fn an_oversized_head_gets_431_and_the_listener_keeps_serving() {
        let listener = start(ListenerLimits {
            head_bytes_max: 64,
            ..ListenerLimits::default()
        });
        let mut request = b"GET /metrics HTTP/1.1\r\nX-Padding: ".to_vec();
        request.extend(std::iter::repeat_n(b'a', 200));
        request.extend_from_slice(b"\r\n\r\n");
        let answer = exchange(listener.local_addr(), &request);
        assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
        let ok = exchange(listener.local_addr(), b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
    }

    /// A client that connects and stays silent is answered 408 at its deadline, and does not
    /// hold up a scrape on another connection meanwhile.
    #[test]
    fn a_silent_client_times_out_without_stalling_others() {
        let listener = start(ListenerLimits {
            connection_deadline: Duration::from_millis(300),
            ..ListenerLimits::default()
        });
        let mut silent = TcpStream::connect(listener.local_addr()).unwrap();
        silent.write_all(b"GET /metr").unwrap();
        let ok = exchange(listener.local_addr(), b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        let mut answer = String::new();
        silent.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    }

    /// Past `connections_max` held connections, one more is refused with 503 at once; the held
    /// ones are unaffected and, once they end, connections are served again.
    #[test]
    fn connections_past_the_limit_are_refused() {
        let listener = start(ListenerLimits {
            connections_max: 2,
            ..ListenerLimits::default()
        });
        let addr = listener.local_addr();
        let mut held: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
        // The two are accepted once the accept thread saw them; until then a third might be
        // accepted first. Wait until a probe is refused, which proves both slots are taken.
        // The probe sends nothing: a refused connection then closes without unread bytes.
        let refused = loop {
            let answer = exchange(addr, b"");
            if answer.starts_with("HTTP/1.1 503 ") {
                break answer;
            }
        };
        assert!(
            refused.ends_with("too many metrics connections\n"),
            "{refused}"
        );
        for stream in &mut held {
            stream.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
            let mut answer = String::new();
            stream.read_to_string(&mut answer).unwrap();
            assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        }
        drop(held);
        let served = loop {
            let answer = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
            if answer.starts_with("HTTP/1.1 200 ") {
                break answer;
            }
        };
        assert!(served.ends_with("# EOF\n"));
    }

    #[test]
    fn a_taken_port_is_refused_naming_address_and_setting() {
        let listener = start(ListenerLimits::default());
        let error = BoundListener::bind(listener.local_addr(), "--metrics-listen").unwrap_err();
        let text = error.to_string();
        assert!(
            text.starts_with(&format!(
                "cannot serve metrics on {} (--metrics-listen): ",
                listener.local_addr()
            )),
            "{text}"
        );
    }

    #[test]
    fn stop_ends_the_accept_thread_and_frees_the_port() {
        let listener = start(ListenerLimits::default());
        let addr = listener.local_addr();
        listener.stop();
        BoundListener::bind(addr, "--metrics-listen").expect("the port is free again");
    }
}
