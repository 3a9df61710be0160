//! Helpers for this crate's unit tests.

/// An address on 127.0.0.1 whose port is free now and below the kernel's ephemeral range (32768
/// and up by default), so that no `bind(":0")` or outgoing connection of a test running in
/// parallel takes it before the server binds it: pseudo-random in 20000..32000, checked with a
/// bind.
pub fn unused_addr() -> std::net::SocketAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let seed = std::process::id().wrapping_mul(7919) ^ nanos;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 20_000 + (seed.wrapping_add(n.wrapping_mul(2_654_435_761)) % 12_000) as u16;
        if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return listener
                .local_addr()
                .expect("bound listener has an address");
        }
    }
}
