//! Tests of the replica links (`super`): Hello checks, refusals, the inbound caps, and the
//! outbound rules (a down link drops its frames; a peer's Hello ends the reconnect backoff).

use super::*;
use compio::io::AsyncWriteExt;

const CLUSTER: u128 = 7;

/// A Hello from `replica` of `cluster` whose sender was configured with `addresses`.
fn hello_with(cluster: u128, replica: u8, addresses: &[SocketAddr]) -> Hello {
    Hello {
        cluster,
        replica,
        client_address: "127.0.0.1:9000".to_owned(),
        addresses_checksum: addresses_checksum(addresses),
    }
}

/// Three replica addresses (never listened on).
fn three() -> Vec<SocketAddr> {
    ["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect()
}

fn hello(cluster: u128, replica: u8) -> Hello {
    hello_with(cluster, replica, &three())
}

#[test]
fn hello_round_trips_and_is_checked() {
    let frame = hello(CLUSTER, 2).encode();
    let header: Header = bytemuck::pod_read_unaligned(&frame[..bus::HEADER_SIZE]);
    assert!(header.validate_prefix(1 << 20).is_ok());
    let decoded = Hello::decode(&header, &frame[bus::HEADER_SIZE..]).unwrap();
    assert_eq!(decoded, hello(CLUSTER, 2));
    assert_eq!(check_hello(&decoded, CLUSTER, 0, &three()), Ok(()));
    assert_eq!(
        check_hello(&hello(8, 1), CLUSTER, 0, &three()),
        Err(LinkRefusal::WrongCluster {
            ours: CLUSTER,
            theirs: 8
        })
    );
    assert_eq!(
        check_hello(&hello(CLUSTER, 3), CLUSTER, 0, &three()),
        Err(LinkRefusal::UnknownReplica {
            index: 3,
            replica_count: 3
        })
    );
    assert_eq!(
        check_hello(&hello(CLUSTER, 0), CLUSTER, 0, &three()),
        Err(LinkRefusal::OwnIndex { index: 0 })
    );
    // A typo in the sender's list: its 127.0.0.1:7102 is 127.0.0.1:7103.
    let mut typo = three();
    typo[1] = "127.0.0.1:7103".parse().unwrap();
    let refusal = check_hello(&hello_with(CLUSTER, 2, &typo), CLUSTER, 0, &three());
    assert_eq!(
        refusal,
        Err(LinkRefusal::AddressesDiffer {
            index: 2,
            ours: "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103".to_owned()
        })
    );
    assert_eq!(
        refusal.unwrap_err().to_string(),
        "replica 2's --addresses differ from this replica's: every replica must be started \
         with the same --addresses list in the same order (this replica's list: \
         127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103)"
    );
}

#[test]
fn log_throttle_logs_the_first_then_once_per_interval_with_a_count() {
    let mut throttle = LogThrottle::default();
    let now = std::time::Instant::now();
    assert_eq!(throttle.due(now), Some(0));
    assert_eq!(throttle.due(now), None);
    assert_eq!(throttle.due(now + REPLICA_LINK_LOG_INTERVAL / 2), None);
    assert_eq!(throttle.due(now + REPLICA_LINK_LOG_INTERVAL), Some(2));
    assert_eq!(throttle.due(now + REPLICA_LINK_LOG_INTERVAL), None);
}

/// A test message: the frame's `view` field, decoded only for command Commit.
fn test_decoder() -> Decoder<u32> {
    Rc::new(|header: &Header, _body: &[u8]| {
        if header.command == Command::Commit as u8 {
            Ok(header.view)
        } else {
            Err(format!("command {} does not decode", header.command))
        }
    })
}

fn message_frame(cluster: u128, replica: u8, command: Command, view: u32) -> Vec<u8> {
    let mut header = Header::new(command, bus::Operation::Ping);
    header.operation = 0;
    header.cluster = cluster;
    header.replica = replica;
    header.view = view;
    bus::encode_frame(&mut header, b"")
}

fn config(replica: u8, addresses: Vec<SocketAddr>) -> BusConfig {
    BusConfig {
        cluster: CLUSTER,
        replica,
        addresses,
        client_address: format!("client-of-{replica}"),
        frame_size_max: 1 << 20,
        frame_rest_timeout: crate::limits::REPLICA_FRAME_REST_TIMEOUT,
        inbound_links_max: crate::limits::replica_inbound_links_max(3),
        reconnect_backoff_min: RECONNECT_BACKOFF_MIN,
        reconnect_backoff_max: RECONNECT_BACKOFF_MAX,
    }
}

/// A bus of replica 0 of three whose peers are never listened on (their connectors retry
/// in the background, which must not disturb anything), with `edit` applied to its config.
/// Returns the bus, its inbound channel, and the address list its peers must announce.
async fn lone_bus(
    edit: impl FnOnce(&mut BusConfig),
) -> (
    ReplicaBus<u32>,
    AsyncRx<Array<Inbound<u32>>>,
    Vec<SocketAddr>,
) {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let closed_port: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let addresses = vec![any, closed_port, closed_port];
    let (inbound_tx, inbound_rx) = crossfire::mpsc::bounded_async::<Inbound<u32>>(16);
    let mut config = config(0, addresses.clone());
    edit(&mut config);
    let bus = ReplicaBus::start(config, test_decoder(), inbound_tx)
        .await
        .unwrap();
    (bus, inbound_rx, addresses)
}

/// Yields to the bus's tasks until `done` holds (no deadline: a hang is the failure).
async fn until(mut done: impl FnMut() -> bool) {
    while !done() {
        compio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Connects to `address`, writes `frames` and waits until the server closes the link (a
/// refused link) or, with `expect_open`, returns the still-open stream.
async fn write_raw(address: SocketAddr, frames: &[Vec<u8>]) -> TcpStream {
    let mut stream = TcpStream::connect(address).await.unwrap();
    for frame in frames {
        stream.write_all(frame.clone()).await.0.unwrap();
    }
    stream
}

/// Reads until the peer closes the connection.
async fn wait_closed(stream: &mut TcpStream) {
    use compio::io::AsyncRead;
    loop {
        let compio::BufResult(result, _) = stream.read(Vec::with_capacity(64)).await;
        match result {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

#[test]
fn refused_hellos_and_a_malformed_frame_close_only_their_link() {
    compio::runtime::Runtime::new().unwrap().block_on(async {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let (inbound_tx, inbound_rx) = crossfire::mpsc::bounded_async::<Inbound<u32>>(16);
        // Replica 0 of 3; the peers' addresses are never listened on (their connectors
        // retry in the background, which must not disturb anything).
        let closed_port: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let bus = ReplicaBus::start(
            config(0, vec![any, closed_port, closed_port]),
            test_decoder(),
            inbound_tx,
        )
        .await
        .unwrap();
        let address = bus.local_addr();

        let addresses = vec![any, closed_port, closed_port];
        let hello = |cluster, replica| hello_with(cluster, replica, &addresses);
        // Wrong cluster, unknown index, own index: each closed.
        for bad in [hello(8, 1), hello(CLUSTER, 3), hello(CLUSTER, 0)] {
            let mut stream = write_raw(address, &[bad.encode()]).await;
            wait_closed(&mut stream).await;
        }
        assert_eq!(bus.counters().links_refused.get(), 3);
        assert_eq!(bus.client_address(1), None);

        // A good link from replica 1 stays up across another link's malformed frame.
        let mut good = write_raw(
            address,
            &[
                hello(CLUSTER, 1).encode(),
                message_frame(CLUSTER, 1, Command::Commit, 11),
            ],
        )
        .await;
        let first = inbound_rx.recv().await.unwrap();
        assert_eq!((first.from, first.message), (1, 11));
        assert_eq!(bus.client_address(1).as_deref(), Some("127.0.0.1:9000"));

        let mut corrupt = message_frame(CLUSTER, 2, Command::Commit, 12);
        corrupt[bus::HEADER_SIZE - 1] ^= 1; // header checksum no longer matches
        let malformed_frames = [
            corrupt,
            message_frame(CLUSTER, 2, Command::Prepare, 13), // does not decode
            message_frame(9, 2, Command::Commit, 14),        // wrong cluster
            message_frame(CLUSTER, 2, Command::Request, 15), // not a replica command
        ];
        for (index, frame) in malformed_frames.into_iter().enumerate() {
            let mut bad = write_raw(address, &[hello(CLUSTER, 2).encode(), frame]).await;
            wait_closed(&mut bad).await;
            assert_eq!(bus.counters().links_refused.get(), 4 + index as u64);
        }

        good.write_all(message_frame(CLUSTER, 1, Command::Commit, 21))
            .await
            .0
            .unwrap();
        let next = inbound_rx.recv().await.unwrap();
        assert_eq!((next.from, next.message), (1, 21));
        assert!(inbound_rx.try_recv().is_err(), "nothing from refused links");
    });
}

#[test]
fn two_buses_exchange_frames_and_learn_client_addresses() {
    compio::runtime::Runtime::new().unwrap().block_on(async {
        // Reserve two ports, then free them for the buses.
        let ports: Vec<SocketAddr> = (0..2).map(|_| crate::test_support::unused_addr()).collect();
        let (tx0, rx0) = crossfire::mpsc::bounded_async::<Inbound<u32>>(16);
        let (tx1, rx1) = crossfire::mpsc::bounded_async::<Inbound<u32>>(16);
        let bus0 = ReplicaBus::start(config(0, ports.clone()), test_decoder(), tx0)
            .await
            .unwrap();
        let bus1 = ReplicaBus::start(config(1, ports.clone()), test_decoder(), tx1)
            .await
            .unwrap();
        until(|| bus0.connected(1) && bus1.connected(0)).await;
        assert!(bus0.send(1, message_frame(CLUSTER, 0, Command::Commit, 5)));
        assert!(bus1.send(0, message_frame(CLUSTER, 1, Command::Commit, 6)));
        assert!(!bus0.send(0, Vec::new()), "no link to itself");
        let at1 = rx1.recv().await.unwrap();
        let at0 = rx0.recv().await.unwrap();
        assert_eq!((at1.from, at1.message), (0, 5));
        assert_eq!((at0.from, at0.message), (1, 6));
        assert_eq!(bus1.client_address(0).as_deref(), Some("client-of-0"));
        assert_eq!(bus0.client_address(1).as_deref(), Some("client-of-1"));
    });
}

#[test]
fn a_stalled_body_closes_the_link_after_the_deadline() {
    compio::runtime::Runtime::new().unwrap().block_on(async {
        let (bus, inbound_rx, addresses) = lone_bus(|config| {
            config.frame_rest_timeout = Duration::from_millis(50);
        })
        .await;
        // A valid header announcing a 100 KiB body, then 10 bytes of it, then nothing.
        let mut header = Header::new(Command::Commit, bus::Operation::Ping);
        header.operation = 0;
        header.cluster = CLUSTER;
        header.replica = 1;
        let frame = bus::encode_frame(&mut header, &vec![0u8; 100 * 1024]);
        let mut stream = write_raw(
            bus.local_addr(),
            &[
                hello_with(CLUSTER, 1, &addresses).encode(),
                frame[..bus::HEADER_SIZE + 10].to_vec(),
            ],
        )
        .await;
        wait_closed(&mut stream).await;
        assert_eq!(bus.counters().links_refused.get(), 1);
        let logged = bus.counters().last_logged_refusal.borrow().clone().unwrap();
        assert!(
            logged.starts_with("frame stalled: ") && logged.contains("of its 102400 body bytes"),
            "{logged}"
        );
        assert!(inbound_rx.try_recv().is_err());
        until(|| bus.inbound_links() == 0).await;
    });
}

#[test]
fn links_beyond_the_cap_are_refused_on_accept() {
    compio::runtime::Runtime::new().unwrap().block_on(async {
        let (bus, inbound_rx, addresses) = lone_bus(|config| {
            config.inbound_links_max = 2;
        })
        .await;
        let address = bus.local_addr();
        let mut from_1 = write_raw(address, &[hello_with(CLUSTER, 1, &addresses).encode()]).await;
        let _from_2 = write_raw(address, &[hello_with(CLUSTER, 2, &addresses).encode()]).await;
        until(|| bus.inbound_links() == 2).await;

        let mut third = write_raw(address, &[]).await;
        wait_closed(&mut third).await;
        assert_eq!(bus.counters().links_refused.get(), 1);
        let logged = bus.counters().last_logged_refusal.borrow().clone().unwrap();
        assert!(
            logged.contains("2 inbound replica links are open"),
            "{logged}"
        );
        assert_eq!(bus.inbound_links(), 2);

        // The links held stay up.
        from_1
            .write_all(message_frame(CLUSTER, 1, Command::Commit, 3))
            .await
            .0
            .unwrap();
        let got = inbound_rx.recv().await.unwrap();
        assert_eq!((got.from, got.message), (1, 3));

        // One closes; its slot is free again for a new link.
        drop(from_1);
        until(|| bus.inbound_links() == 1).await;
        let _again = write_raw(
            address,
            &[
                hello_with(CLUSTER, 1, &addresses).encode(),
                message_frame(CLUSTER, 1, Command::Commit, 4),
            ],
        )
        .await;
        let got = inbound_rx.recv().await.unwrap();
        assert_eq!((got.from, got.message), (1, 4));
    });
}

#[test]
fn a_second_hello_from_the_same_index_replaces_the_first_link() {
    compio::runtime::Runtime::new().unwrap().block_on(async {
        let (bus, inbound_rx, addresses) = lone_bus(|_| {}).await;
        let address = bus.local_addr();
        let mut first = write_raw(
            address,
            &[
                hello_with(CLUSTER, 1, &addresses).encode(),
                message_frame(CLUSTER, 1, Command::Commit, 1),
            ],
        )
        .await;
        let got = inbound_rx.recv().await.unwrap();
        assert_eq!((got.from, got.message), (1, 1));

        let mut second = write_raw(
            address,
            &[
                hello_with(CLUSTER, 1, &addresses).encode(),
                message_frame(CLUSTER, 1, Command::Commit, 2),
            ],
        )
        .await;
        let got = inbound_rx.recv().await.unwrap();
        assert_eq!((got.from, got.message), (1, 2));
        wait_closed(&mut first).await;
        assert_eq!(bus.counters().links_replaced.get(), 1);
        assert_eq!(bus.counters().links_refused.get(), 0);
        until(|| bus.inbound_links() == 1).await;

        second
            .write_all(message_frame(CLUSTER, 1, Command::Commit, 3))
            .await
            .0
            .unwrap();
        let got = inbound_rx.recv().await.unwrap();
        assert_eq!((got.from, got.message), (1, 3));

        // A link from another index does not replace it.
        let _other = write_raw(address, &[hello_with(CLUSTER, 2, &addresses).encode()]).await;
        until(|| bus.inbound_links() == 2).await;
        assert_eq!(bus.counters().links_replaced.get(), 1);
    });
}

#[test]
fn a_hello_with_another_address_list_is_refused_and_logged_once() {
    compio::runtime::Runtime::new().unwrap().block_on(async {
        let (bus, inbound_rx, addresses) = lone_bus(|_| {}).await;
        let address = bus.local_addr();
        // Replica 2 started with a typo in its list.
        let mut typo = addresses.clone();
        typo[2] = "127.0.0.1:10".parse().unwrap();
        for attempt in 1..=2u64 {
            let mut stream = write_raw(
                address,
                &[
                    hello_with(CLUSTER, 2, &typo).encode(),
                    message_frame(CLUSTER, 2, Command::Commit, 9),
                ],
            )
            .await;
            wait_closed(&mut stream).await;
            assert_eq!(bus.counters().links_refused.get(), attempt);
        }
        assert_eq!(bus.counters().refusals_logged.get(), 1, "rate-limited");
        let logged = bus.counters().last_logged_refusal.borrow().clone().unwrap();
        assert_eq!(
            logged,
            format!(
                "replica 2's --addresses differ from this replica's: every replica must be \
                 started with the same --addresses list in the same order (this replica's \
                 list: {})",
                addresses_text(&addresses)
            )
        );
        assert!(
            inbound_rx.try_recv().is_err(),
            "nothing from the refused links"
        );
        assert_eq!(bus.client_address(2), None);
    });
}

/// Accepts the bus's next outbound connection on `listener` and reads its Hello, which must
/// come from replica 0.
async fn accept_link_from_0(listener: &TcpListener) -> TcpStream {
    let (mut stream, _) = listener.accept().await.unwrap();
    let frame = read_frame_within(
        &mut stream,
        HELLO_FRAME_SIZE_MAX,
        crate::limits::REPLICA_FRAME_REST_TIMEOUT,
    )
    .await
    .unwrap()
    .unwrap();
    let hello = Hello::decode(&frame.header, &frame.body).unwrap();
    assert_eq!(hello.replica, 0);
    stream
}

/// The `view` of the next frame the bus wrote on `stream`.
async fn next_view(stream: &mut TcpStream) -> u32 {
    let frame = read_frame_within(stream, 1 << 20, crate::limits::REPLICA_FRAME_REST_TIMEOUT)
        .await
        .unwrap()
        .unwrap();
    frame.header.view
}

#[test]
fn frames_sent_while_the_peer_is_down_are_dropped_not_replayed() {
    compio::runtime::Runtime::new().unwrap().block_on(async {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let peer = crate::test_support::unused_addr();
        let (inbound_tx, _inbound_rx) = crossfire::mpsc::bounded_async::<Inbound<u32>>(16);
        let bus = ReplicaBus::start(config(0, vec![any, peer]), test_decoder(), inbound_tx)
            .await
            .unwrap();
        let frame = |view| message_frame(CLUSTER, 0, Command::Commit, view);

        // Replica 1 is not up yet: its frames are dropped, not queued for later.
        until(|| bus.counters().connects_failed.get() >= 1).await;
        for view in 1..=3 {
            assert!(!bus.send(1, frame(view)), "dropped while the link is down");
        }
        assert_eq!(bus.counters().link_down_dropped.get(), 3);
        assert_eq!(bus.counters().send_dropped.get(), 0);

        let listener = bind_listener(peer).unwrap();
        let mut stream = accept_link_from_0(&listener).await;
        assert!(
            bus.connected(1),
            "connected is set before the Hello is written"
        );
        assert!(bus.send(1, frame(10)));
        assert_eq!(
            next_view(&mut stream).await,
            10,
            "nothing from before it was up"
        );

        // Replica 1 restarts: what is sent once the link is seen down is not replayed
        // either (frames written into the dead connection are lost with it).
        drop(stream);
        drop(listener);
        let dropped_before = bus.counters().link_down_dropped.get();
        until(|| {
            bus.send(1, frame(20));
            bus.counters().link_down_dropped.get() > dropped_before
        })
        .await;
        assert!(!bus.connected(1));
        assert!(!bus.send(1, frame(30)));
        let listener = bind_listener(peer).unwrap();
        let mut stream = accept_link_from_0(&listener).await;
        assert!(bus.send(1, frame(40)));
        assert_eq!(
            next_view(&mut stream).await,
            40,
            "nothing from before the restart"
        );
    });
}

#[test]
fn a_peer_hello_ends_the_reconnect_backoff_at_once() {
    compio::runtime::Runtime::new().unwrap().block_on(async {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let peer = crate::test_support::unused_addr();
        let addresses = vec![any, peer];
        let (inbound_tx, _inbound_rx) = crossfire::mpsc::bounded_async::<Inbound<u32>>(16);
        let mut config = config(0, addresses.clone());
        // A backoff no test outlives: any reconnect below comes from the peer's Hello.
        config.reconnect_backoff_min = Duration::from_hours(24);
        config.reconnect_backoff_max = config.reconnect_backoff_min;
        let bus = ReplicaBus::start(config, test_decoder(), inbound_tx)
            .await
            .unwrap();
        // The first attempt failed; the connect loop now waits out its backoff.
        until(|| bus.counters().connects_failed.get() == 1).await;
        let listener = bind_listener(peer).unwrap();

        // Replica 1 (restarted) connects to us and says Hello: our link to it comes up now
        // (a hang in the accept below is the failure).
        let _from_1 = write_raw(
            bus.local_addr(),
            &[hello_with(CLUSTER, 1, &addresses).encode()],
        )
        .await;
        let mut stream = accept_link_from_0(&listener).await;
        assert_eq!(bus.counters().backoffs_ended_by_hello.get(), 1);
        assert_eq!(bus.counters().connects_failed.get(), 1);
        assert!(bus.send(1, message_frame(CLUSTER, 0, Command::Commit, 5)));
        assert_eq!(next_view(&mut stream).await, 5);
    });
}
