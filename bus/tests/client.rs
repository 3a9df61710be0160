//! `Client` against a tiny fake server written here: it accepts a given number of connections one
//! after another, records every request frame, and answers with what each test scripts (a reply,
//! an error, an Eviction, garbage, or a close). Asserts what the client sends on the wire, how it
//! maps each answer, and when it registers, reconnects and resends.

use std::net::SocketAddr;
use std::time::Duration;

use bus::client::messages_from;
use bus::{
    BatchBuilder, Client, ClientError, Command, ErrorCode, Frame, FrameError, Header, Metadata,
    Namespace, Operation, PartitionInfo, StreamInfo, TopicInfo, encode_frame, error_reply,
    eviction, read_frame, reply_header, write_frame,
};
use compio::net::TcpListener;
use compio::runtime::JoinHandle;

fn run<F: Future>(future: F) -> F::Output {
    compio::runtime::Runtime::new()
        .expect("compio runtime")
        .block_on(future)
}

/// What the fake server does with one request: `Some(bytes)` to write back, `None` to close.
type Script = Box<dyn FnMut(&Frame) -> Option<Vec<u8>>>;

/// Serves one connection with `script`; the task returns the request frames it received.
async fn fake_server(script: Script) -> (SocketAddr, JoinHandle<Vec<Frame>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = compio::runtime::spawn(async move {
        serve(listener, 1, script)
            .await
            .into_iter()
            .map(|(_, frame)| frame)
            .collect()
    });
    (addr, task)
}

/// Serves `connection_count` connections one after another with one `script`; the task returns
/// each request frame with the index of the connection it came on (0 = first accepted).
async fn fake_server_connections(
    connection_count: usize,
    script: Script,
) -> (SocketAddr, JoinHandle<Vec<(usize, Frame)>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = compio::runtime::spawn(serve(listener, connection_count, script));
    (addr, task)
}

async fn serve(
    listener: TcpListener,
    connection_count: usize,
    mut script: Script,
) -> Vec<(usize, Frame)> {
    let mut received = Vec::new();
    for connection_index in 0..connection_count {
        let (mut stream, _) = listener.accept().await.unwrap();
        loop {
            let frame = match read_frame(&mut stream, bus::limits::MESSAGE_SIZE_MAX_DEFAULT).await {
                Ok(frame) => frame,
                // A client that closes with reply bytes unread resets the connection.
                Err(FrameError::Closed | FrameError::Io(_)) => break,
                Err(error) => panic!("fake server read: {error}"),
            };
            let answer = script(&frame);
            received.push((connection_index, frame));
            match answer {
                Some(bytes) => write_frame(&mut stream, bytes).await.0.unwrap(),
                None => break,
            }
        }
    }
    received
}

/// (connection index, operation, client, request) of each received frame.
fn identities(received: &[(usize, Frame)]) -> Vec<(usize, u8, u128, u64)> {
    received
        .iter()
        .map(|(connection, f)| {
            (
                *connection,
                f.header.operation,
                f.header.client,
                f.header.request,
            )
        })
        .collect()
}

/// A success reply to a Register carrying session `session` in `offset`.
fn registered(request: &Frame, session: u64) -> Vec<u8> {
    let mut header = reply_header(&request.header);
    header.offset = session;
    encode_frame(&mut header, b"")
}

fn is_register(request: &Frame) -> bool {
    request.header.operation == Operation::Register as u8
}

/// An empty success reply.
fn ok(request: &Frame) -> Vec<u8> {
    encode_frame(&mut reply_header(&request.header), b"")
}

/// A script that answers every request with `ok`.
fn always_ok() -> Script {
    Box::new(|request| Some(ok(request)))
}

#[test]
fn ping_sends_numbered_requests_and_accepts_pong() {
    run(async {
        let (addr, server) = fake_server(always_ok()).await;
        let mut client = Client::connect(addr).await.unwrap();
        client.ping().await.unwrap();
        client.ping().await.unwrap();
        let client_id = client.client_id();
        assert_ne!(client_id, 0);
        drop(client);
        let received = server.await.unwrap();
        assert_eq!(received.len(), 2);
        for (index, frame) in received.iter().enumerate() {
            assert_eq!(frame.header.command, Command::Request as u8);
            assert_eq!(frame.header.operation, Operation::Ping as u8);
            assert_eq!(frame.header.request, index as u64 + 1);
            assert_eq!(frame.header.client, client_id);
            assert_eq!(frame.header.size, 256);
            assert!(frame.body.is_empty());
        }
    });
}

#[test]
fn issue7_6_server_max_message_size_reads_the_ping_reply_count() {
    run(async {
        let mut counts = [1024u32, 0, 255].into_iter();
        let (addr, _server) = fake_server(Box::new(move |request| {
            let mut header = reply_header(&request.header);
            header.count = counts.next().unwrap();
            Some(encode_frame(&mut header, b""))
        }))
        .await;
        let mut client = Client::connect(addr).await.unwrap();
        assert_eq!(client.server_max_message_size().await.unwrap(), Some(1024));
        // A server that predates the field answers 0; below a header is no limit either.
        assert_eq!(client.server_max_message_size().await.unwrap(), None);
        assert_eq!(client.server_max_message_size().await.unwrap(), None);
    });
}

#[test]
fn client_ids_differ_between_connections() {
    run(async {
        let (addr_a, server_a) = fake_server(always_ok()).await;
        let (addr_b, server_b) = fake_server(always_ok()).await;
        let client_a = Client::connect(addr_a).await.unwrap();
        let client_b = Client::connect(addr_b).await.unwrap();
        assert_ne!(client_a.client_id(), client_b.client_id());
        drop((client_a, client_b));
        assert!(server_a.await.unwrap().is_empty());
        assert!(server_b.await.unwrap().is_empty());
    });
}

#[test]
fn issue7_2_refusal_at_accept_is_resource_exhausted_not_a_protocol_error() {
    run(async {
        // What a server at its connection or descriptor limit writes before the close: a Reply
        // to no request (request 0, operation Ping), whatever the client's first request was.
        let script: Script = Box::new(move |_request| {
            let mut refused = Header::new(Command::Request, Operation::Ping);
            refused.request = 0;
            Some(error_reply(
                &refused,
                ErrorCode::ResourceExhausted,
                "connection limit of 4 reached",
            ))
        });
        let (addr, _server) = fake_server(script).await;
        let mut client = Client::connect(addr)
            .await
            .unwrap()
            .with_retry_budget(Duration::ZERO);
        let error = client.create_stream(1, "orders").await.unwrap_err();
        assert_eq!(
            error.to_string(),
            "server error ResourceExhausted (18): connection limit of 4 reached"
        );
    });
}

#[test]
fn error_reply_maps_to_server_error_and_connection_stays_usable() {
    run(async {
        let mut first = true;
        let script: Script = Box::new(move |request| {
            if std::mem::take(&mut first) {
                Some(error_reply(
                    &request.header,
                    ErrorCode::Busy,
                    "shard 3 inbox full",
                ))
            } else {
                Some(ok(request))
            }
        });
        let (addr, server) = fake_server(script).await;
        // No retry budget: the Busy reaches the caller after one attempt.
        let mut client = Client::connect(addr)
            .await
            .unwrap()
            .with_retry_budget(Duration::ZERO);
        assert_eq!(client.retry_budget(), Duration::ZERO);
        let error = client.ping().await.unwrap_err();
        assert!(
            matches!(&error, ClientError::Server { code: ErrorCode::Busy, message } if message == "shard 3 inbox full"),
            "{error:?}"
        );
        assert!(error.is_retryable());
        assert_eq!(
            error.to_string(),
            "server error Busy (1): shard 3 inbox full"
        );
        client.ping().await.unwrap();
        drop(client);
        assert_eq!(server.await.unwrap().len(), 2);
    });
}

#[test]
fn control_operations_put_ids_in_namespace_and_names_in_body() {
    run(async {
        let metadata = Metadata {
            shard_count: 2,
            streams: vec![StreamInfo {
                stream_id: 7,
                name: "orders".into(),
                topics: vec![TopicInfo {
                    topic_id: 1,
                    name: "eu".into(),
                    partitions: vec![PartitionInfo {
                        partition_id: 0,
                        owner_shard: 1,
                        next_offset: 9,
                        first_offset: 0,
                    }],
                    retention_bytes: 0,
                    retention_ms: 0,
                    groups: Vec::new(),
                }],
            }],
            ..Metadata::default()
        };
        let metadata_json = serde_json::to_vec(&metadata).unwrap();
        let script: Script = Box::new(move |request| {
            if request.header.operation == Operation::GetMetadata as u8 {
                Some(encode_frame(
                    &mut reply_header(&request.header),
                    &metadata_json,
                ))
            } else {
                Some(ok(request))
            }
        });
        let (addr, server) = fake_server(script).await;
        let mut client = Client::connect(addr).await.unwrap();
        client.create_stream(7, "orders").await.unwrap();
        client.create_topic(7, 1, "eu", 16).await.unwrap();
        client.delete_topic(7, 1).await.unwrap();
        client.delete_stream(7).await.unwrap();
        assert_eq!(client.get_metadata().await.unwrap(), metadata);
        drop(client);

        let received = server.await.unwrap();
        let summary: Vec<(u8, Namespace, u32, &[u8])> = received
            .iter()
            .map(|f| {
                (
                    f.header.operation,
                    Namespace(f.header.namespace),
                    f.header.count,
                    &f.body[..],
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (Operation::Register as u8, Namespace(0), 0, &b""[..]),
                (
                    Operation::CreateStream as u8,
                    Namespace::new(7, 0, 0),
                    0,
                    &b"orders"[..]
                ),
                (
                    Operation::CreateTopic as u8,
                    Namespace::new(7, 1, 0),
                    16,
                    &b"eu"[..]
                ),
                (
                    Operation::DeleteTopic as u8,
                    Namespace::new(7, 1, 0),
                    0,
                    &b""[..]
                ),
                (
                    Operation::DeleteStream as u8,
                    Namespace::new(7, 0, 0),
                    0,
                    &b""[..]
                ),
                (Operation::GetMetadata as u8, Namespace(0), 0, &b""[..]),
            ]
        );
    });
}

#[test]
fn send_and_poll_messages() {
    run(async {
        let mut builder = BatchBuilder::default();
        builder.push(1, 1_000, b"alpha");
        builder.push(2, 1_001, b"beta");
        builder.push(3, 1_002, b"gamma");
        let batch = builder.finish();
        let mut stored = batch.clone();
        bus::batch::set_base_offset(&mut stored, 100);

        let script: Script = Box::new(move |request| {
            let mut header = reply_header(&request.header);
            if request.header.operation == Operation::SendMessages as u8 {
                header.offset = 100;
                header.count = 3;
                header.next_offset = 105;
                header.first_offset = 20;
                Some(encode_frame(&mut header, b""))
            } else {
                Some(encode_frame(&mut header, &stored))
            }
        });
        let (addr, server) = fake_server(script).await;
        let mut client = Client::connect(addr).await.unwrap();
        let namespace = Namespace::new(7, 1, 3);
        let ack = client
            .send_messages(namespace, batch.clone())
            .await
            .unwrap();
        assert_eq!(
            ack,
            bus::SendAck {
                base_offset: 100,
                message_count: 3,
                next_offset: 105,
                first_offset: 20,
            }
        );
        let body = client.poll_messages(namespace, 101, 50).await.unwrap();
        let messages = messages_from(&body, 101).unwrap();
        let got: Vec<(u64, u64, &[u8])> = messages
            .iter()
            .map(|m| (m.offset, m.id, m.payload))
            .collect();
        assert_eq!(got, vec![(101, 2, &b"beta"[..]), (102, 3, &b"gamma"[..])]);
        drop(client);

        let received = server.await.unwrap();
        assert_eq!(received[0].header.namespace, namespace.0);
        assert_eq!(received[0].body, batch);
        assert_eq!(received[1].header.operation, Operation::PollMessages as u8);
        assert_eq!(received[1].header.namespace, namespace.0);
        assert_eq!(
            (received[1].header.offset, received[1].header.count),
            (101, 50)
        );
    });
}

#[test]
fn reply_to_another_request_is_a_protocol_error_and_the_next_call_reconnects() {
    run(async {
        let mut first = true;
        let script: Script = Box::new(move |request| {
            let mut header = reply_header(&request.header);
            if std::mem::take(&mut first) {
                header.request += 1;
            }
            Some(encode_frame(&mut header, b""))
        });
        let (addr, server) = fake_server_connections(2, script).await;
        let mut client = Client::connect(addr).await.unwrap();
        let error = client.ping().await.unwrap_err();
        assert!(
            matches!(&error, ClientError::Protocol(text) if text.contains("request 2")),
            "{error:?}"
        );
        // The first connection may hold bytes of the bad exchange: the next call uses a new one.
        client.ping().await.unwrap();
        let id = client.client_id();
        drop(client);
        assert_eq!(
            identities(&server.await.unwrap()),
            vec![
                (0, Operation::Ping as u8, id, 1),
                (1, Operation::Ping as u8, id, 2)
            ]
        );
    });
}

#[test]
fn reply_with_wrong_operation_or_command_or_unknown_code_is_protocol() {
    run(async {
        let mut count = 0;
        let script: Script = Box::new(move |request| {
            count += 1;
            let mut header = reply_header(&request.header);
            match count {
                1 => header.error_code = 999,
                2 => header.operation = Operation::GetMetadata as u8,
                _ => unreachable!("the connection is broken after the second request"),
            }
            Some(encode_frame(&mut header, b""))
        });
        let (addr, server) = fake_server(script).await;
        let mut client = Client::connect(addr).await.unwrap();
        let error = client.ping().await.unwrap_err();
        assert!(
            matches!(&error, ClientError::Protocol(t) if t == "unknown error code 999"),
            "{error:?}"
        );
        let error = client.ping().await.unwrap_err();
        assert!(
            matches!(&error, ClientError::Protocol(t) if t.contains("operation 6")),
            "{error:?}"
        );
        drop(client);
        assert_eq!(server.await.unwrap().len(), 2);
    });

    run(async {
        let script: Script = Box::new(|request| {
            let mut header = request.header;
            header.command = Command::Request as u8;
            Some(encode_frame(&mut header, b""))
        });
        let (addr, server) = fake_server(script).await;
        let mut client = Client::connect(addr).await.unwrap();
        let error = client.ping().await.unwrap_err();
        assert!(
            matches!(&error, ClientError::Protocol(t) if t.contains("got command 1")),
            "{error:?}"
        );
        drop(client);
        server.await.unwrap();
    });
}

#[test]
fn reads_are_resent_on_a_new_connection_after_the_server_closes() {
    run(async {
        let mut request_count = 0;
        let script: Script = Box::new(move |request| {
            request_count += 1;
            (request_count != 1).then(|| ok(request))
        });
        let (addr, server) = fake_server_connections(2, script).await;
        let mut client = Client::connect(addr).await.unwrap();
        client.ping().await.unwrap();
        let id = client.client_id();
        drop(client);
        assert_eq!(
            identities(&server.await.unwrap()),
            vec![
                (0, Operation::Ping as u8, id, 1),
                (1, Operation::Ping as u8, id, 1)
            ]
        );
    });
}

#[test]
fn oversized_request_is_refused_before_sending_and_oversized_reply_rejected() {
    run(async {
        let script: Script =
            Box::new(|request| Some(encode_frame(&mut reply_header(&request.header), &[0; 1000])));
        let (addr, server) = fake_server(script).await;
        let mut client = Client::connect(addr)
            .await
            .unwrap()
            .with_max_message_size(300);
        assert_eq!(client.max_message_size(), 300);
        let error = client
            .send_messages(Namespace::new(1, 1, 0), vec![0; 100])
            .await
            .unwrap_err();
        assert!(
            matches!(
                error,
                ClientError::Frame(FrameError::SizeTooLarge {
                    size: 356,
                    max: 300
                })
            ),
            "{error:?}"
        );
        let error = client.ping().await.unwrap_err();
        assert!(
            matches!(
                error,
                ClientError::Frame(FrameError::SizeTooLarge {
                    size: 1256,
                    max: 300
                })
            ),
            "{error:?}"
        );
        drop(client);
        let received = server.await.unwrap();
        assert_eq!(received.len(), 1, "the oversized request must not be sent");
        assert_eq!(received[0].header.operation, Operation::Ping as u8);
    });
}

#[test]
fn raw_request_fills_identity_and_keeps_other_fields() {
    run(async {
        let (addr, server) = fake_server(always_ok()).await;
        let mut client = Client::connect(addr).await.unwrap();
        let mut header = Header::new(Command::Request, Operation::PollMessages);
        header.offset = 5;
        header.view = 77;
        let reply = client.request(header, b"raw").await.unwrap();
        assert_eq!(reply.header.command, Command::Reply as u8);
        assert_eq!(reply.header.request, 1);
        drop(client);
        let received = server.await.unwrap();
        assert_eq!(
            (received[0].header.offset, received[0].header.view),
            (5, 77)
        );
        assert_eq!(received[0].body, b"raw");
        assert_eq!(received[0].header.size, 259);
    });
}

#[test]
fn connect_refused_names_the_address() {
    run(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let error = Client::connect(addr).await.unwrap_err();
        assert!(
            matches!(&error, ClientError::Connect { addr: a, .. } if *a == addr),
            "{error:?}"
        );
        assert!(
            error
                .to_string()
                .starts_with(&format!("cannot connect to {addr}: "))
        );
    });
}

#[test]
fn register_sets_the_session_from_offset_with_request_zero_and_uses_no_number() {
    run(async {
        let script: Script = Box::new(|request| {
            if is_register(request) {
                Some(registered(request, 77))
            } else {
                Some(ok(request))
            }
        });
        let (addr, server) = fake_server(script).await;
        let mut client = Client::connect(addr).await.unwrap();
        assert_eq!(client.session(), None);
        client.ping().await.unwrap();
        assert_eq!(client.register().await.unwrap(), 77);
        assert_eq!(client.session(), Some(77));
        client.ping().await.unwrap();
        let id = client.client_id();
        drop(client);
        let received = server.await.unwrap();
        let summary: Vec<(u8, u128, u64, usize)> = received
            .iter()
            .map(|f| {
                (
                    f.header.operation,
                    f.header.client,
                    f.header.request,
                    f.body.len(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (Operation::Ping as u8, id, 1, 0),
                (Operation::Register as u8, id, 0, 0),
                (Operation::Ping as u8, id, 2, 0),
            ]
        );
        assert_eq!(received[1].header.command, Command::Request as u8);
        assert_eq!(received[1].header.namespace, 0);
    });
}

#[test]
fn first_session_tracked_request_registers_once() {
    run(async {
        let script: Script = Box::new(|request| {
            if is_register(request) {
                Some(registered(request, 5))
            } else {
                Some(ok(request))
            }
        });
        let (addr, server) = fake_server(script).await;
        let mut client = Client::connect(addr).await.unwrap();
        client.ping().await.unwrap();
        assert_eq!(client.session(), None, "a ping needs no session");
        client.create_stream(1, "s").await.unwrap();
        assert_eq!(client.session(), Some(5));
        client.create_topic(1, 2, "t", 3).await.unwrap();
        client.delete_topic(1, 2).await.unwrap();
        client.delete_stream(1).await.unwrap();
        let id = client.client_id();
        drop(client);
        let received: Vec<(usize, Frame)> =
            server.await.unwrap().into_iter().map(|f| (0, f)).collect();
        assert_eq!(
            identities(&received),
            vec![
                (0, Operation::Ping as u8, id, 1),
                (0, Operation::Register as u8, id, 0),
                (0, Operation::CreateStream as u8, id, 2),
                (0, Operation::CreateTopic as u8, id, 3),
                (0, Operation::DeleteTopic as u8, id, 4),
                (0, Operation::DeleteStream as u8, id, 5),
            ]
        );
    });
}

#[test]
fn raw_request_of_a_session_tracked_operation_registers_first() {
    run(async {
        let script: Script = Box::new(|request| {
            if is_register(request) {
                Some(registered(request, 8))
            } else {
                Some(ok(request))
            }
        });
        let (addr, server) = fake_server(script).await;
        let mut client = Client::connect(addr).await.unwrap();
        let mut header = Header::new(Command::Request, Operation::DeleteStream);
        header.namespace = Namespace::new(4, 0, 0).0;
        let reply = client.request(header, b"").await.unwrap();
        assert_eq!(reply.header.request, 1);
        assert_eq!(client.session(), Some(8));
        drop(client);
        let operations: Vec<(u8, u64)> = server
            .await
            .unwrap()
            .iter()
            .map(|f| (f.header.operation, f.header.request))
            .collect();
        assert_eq!(
            operations,
            vec![
                (Operation::Register as u8, 0),
                (Operation::DeleteStream as u8, 1)
            ]
        );
    });
}

#[test]
fn busy_and_shutting_down_replies_are_resent_with_the_same_request_number() {
    run(async {
        let mut attempt_count = 0;
        let script: Script = Box::new(move |request| {
            if is_register(request) {
                return Some(registered(request, 1));
            }
            attempt_count += 1;
            Some(match attempt_count {
                1 => error_reply(&request.header, ErrorCode::Busy, ""),
                2 => error_reply(&request.header, ErrorCode::ShuttingDown, ""),
                _ => ok(request),
            })
        });
        let (addr, server) = fake_server(script).await;
        let mut client = Client::connect(addr).await.unwrap();
        client.create_stream(3, "orders").await.unwrap();
        client.ping().await.unwrap();
        let id = client.client_id();
        drop(client);
        let received: Vec<(usize, Frame)> =
            server.await.unwrap().into_iter().map(|f| (0, f)).collect();
        assert_eq!(
            identities(&received),
            vec![
                (0, Operation::Register as u8, id, 0),
                (0, Operation::CreateStream as u8, id, 1),
                (0, Operation::CreateStream as u8, id, 1),
                (0, Operation::CreateStream as u8, id, 1),
                (0, Operation::Ping as u8, id, 2),
            ]
        );
        for (_, frame) in &received[1..4] {
            assert_eq!(frame.body, b"orders");
        }
    });
}

#[test]
fn dropped_connection_reconnects_and_resends_the_same_client_and_request() {
    run(async {
        let mut create_count = 0;
        let script: Script = Box::new(move |request| {
            if is_register(request) {
                return Some(registered(request, 1));
            }
            if request.header.operation == Operation::CreateStream as u8 {
                create_count += 1;
                if create_count == 1 {
                    return None;
                }
            }
            Some(ok(request))
        });
        let (addr, server) = fake_server_connections(2, script).await;
        let mut client = Client::connect(addr).await.unwrap();
        client.create_stream(3, "orders").await.unwrap();
        client.delete_stream(3).await.unwrap();
        assert_eq!(client.session(), Some(1), "a reconnect keeps the session");
        let id = client.client_id();
        drop(client);
        let received = server.await.unwrap();
        assert_eq!(
            identities(&received),
            vec![
                (0, Operation::Register as u8, id, 0),
                (0, Operation::CreateStream as u8, id, 1),
                (1, Operation::CreateStream as u8, id, 1),
                (1, Operation::DeleteStream as u8, id, 2),
            ]
        );
        assert_eq!(received[1].1.body, received[2].1.body);
    });
}

#[test]
fn eviction_returns_evicted_clears_the_session_and_the_next_call_registers_again() {
    run(async {
        let mut register_count = 0;
        let mut create_count = 0;
        let script: Script = Box::new(move |request| {
            if is_register(request) {
                register_count += 1;
                return Some(registered(request, [5, 9][register_count - 1]));
            }
            create_count += 1;
            if create_count == 1 {
                Some(eviction(&request.header, "client table full"))
            } else {
                Some(ok(request))
            }
        });
        let (addr, server) = fake_server(script).await;
        let mut client = Client::connect(addr).await.unwrap();
        let error = client.create_stream(3, "orders").await.unwrap_err();
        assert!(
            matches!(&error, ClientError::Evicted { reason } if reason == "client table full"),
            "{error:?}"
        );
        assert!(!error.is_retryable());
        assert_eq!(
            error.to_string(),
            "client session evicted: client table full"
        );
        assert_eq!(client.session(), None);
        client.create_stream(3, "orders").await.unwrap();
        assert_eq!(client.session(), Some(9));
        let id = client.client_id();
        drop(client);
        let received: Vec<(usize, Frame)> =
            server.await.unwrap().into_iter().map(|f| (0, f)).collect();
        assert_eq!(
            identities(&received),
            vec![
                (0, Operation::Register as u8, id, 0),
                (0, Operation::CreateStream as u8, id, 1),
                (0, Operation::Register as u8, id, 0),
                (0, Operation::CreateStream as u8, id, 2),
            ]
        );
    });
}

#[test]
fn retry_budget_spent_on_busy_returns_busy() {
    run(async {
        let script: Script = Box::new(|request| {
            if is_register(request) {
                Some(registered(request, 1))
            } else {
                Some(error_reply(&request.header, ErrorCode::Busy, "still full"))
            }
        });
        let (addr, server) = fake_server(script).await;
        let mut client = Client::connect(addr)
            .await
            .unwrap()
            .with_retry_budget(Duration::from_millis(200));
        let error = client.create_topic(1, 1, "t", 1).await.unwrap_err();
        assert!(
            matches!(&error, ClientError::Server { code: ErrorCode::Busy, message } if message == "still full"),
            "{error:?}"
        );
        drop(client);
        let received = server.await.unwrap();
        assert!(received.len() >= 3, "register, then at least two attempts");
        for frame in &received[1..] {
            assert_eq!(frame.header.operation, Operation::CreateTopic as u8);
            assert_eq!(frame.header.request, 1);
        }
    });
}

#[test]
fn retry_budget_spent_on_a_gone_server_returns_the_connection_error() {
    run(async {
        // One connection only: after closing it the server is gone, so reconnects fail.
        let script: Script =
            Box::new(|request| is_register(request).then(|| registered(request, 1)));
        let (addr, server) = fake_server(script).await;
        let mut client = Client::connect(addr)
            .await
            .unwrap()
            .with_retry_budget(Duration::from_millis(200));
        let error = client.create_stream(1, "s").await.unwrap_err();
        assert!(
            matches!(
                &error,
                ClientError::Connect { .. }
                    | ClientError::Frame(FrameError::Closed | FrameError::Io(_))
            ),
            "{error:?}"
        );
        drop(client);
        let operations: Vec<u8> = server
            .await
            .unwrap()
            .iter()
            .map(|f| f.header.operation)
            .collect();
        assert_eq!(
            operations,
            vec![Operation::Register as u8, Operation::CreateStream as u8]
        );
    });
}

#[test]
fn send_messages_is_resent_after_busy_with_the_same_bytes() {
    run(async {
        let mut first = true;
        let script: Script = Box::new(move |request| {
            if std::mem::take(&mut first) {
                return Some(error_reply(&request.header, ErrorCode::Busy, ""));
            }
            let mut header = reply_header(&request.header);
            header.offset = 40;
            header.count = 1;
            Some(encode_frame(&mut header, b""))
        });
        let (addr, server) = fake_server(script).await;
        let mut client = Client::connect(addr).await.unwrap();
        let mut builder = BatchBuilder::default();
        builder.push(1, 1_000, b"alpha");
        let batch = builder.finish();
        let ack = client
            .send_messages(Namespace::new(1, 1, 0), batch.clone())
            .await
            .unwrap();
        assert_eq!(
            ack,
            bus::SendAck {
                base_offset: 40,
                message_count: 1,
                next_offset: 0,
                first_offset: 0,
            }
        );
        assert_eq!(client.session(), None, "sends are not session-tracked");
        drop(client);
        let received = server.await.unwrap();
        assert_eq!(received.len(), 2);
        for frame in &received {
            assert_eq!(frame.header.operation, Operation::SendMessages as u8);
            assert_eq!(frame.header.request, 1);
            assert_eq!(frame.body, batch);
        }
        assert_eq!(received[0].header, received[1].header);
    });
}

#[test]
fn send_messages_is_not_resent_after_a_connection_failure() {
    run(async {
        let script: Script = Box::new(|request| {
            if request.header.operation == Operation::SendMessages as u8 {
                None
            } else {
                Some(ok(request))
            }
        });
        let (addr, server) = fake_server_connections(2, script).await;
        let mut client = Client::connect(addr).await.unwrap();
        let error = client
            .send_messages(Namespace::new(1, 1, 0), vec![1, 2, 3])
            .await
            .unwrap_err();
        assert!(
            matches!(error, ClientError::Frame(FrameError::Closed)),
            "{error:?}"
        );
        // The next call reconnects instead of failing on the broken connection.
        client.ping().await.unwrap();
        let id = client.client_id();
        drop(client);
        assert_eq!(
            identities(&server.await.unwrap()),
            vec![
                (0, Operation::SendMessages as u8, id, 1),
                (1, Operation::Ping as u8, id, 2),
            ]
        );
    });
}

/// A success reply to a SendMessages: base offset `offset`, the batch's message count.
fn sent(request: &Frame, offset: u64) -> Vec<u8> {
    let mut header = reply_header(&request.header);
    header.offset = offset;
    header.count =
        bus::BatchView::parse(&request.body).map_or(0, |batch| batch.header.message_count);
    encode_frame(&mut header, b"")
}

#[test]
fn issue7_5_stamped_send_is_resent_after_a_lost_reply_with_the_same_bytes() {
    run(async {
        let mut first = true;
        let script: Script = Box::new(move |request| {
            if std::mem::take(&mut first) {
                return None; // the reply is lost: the connection closes
            }
            Some(sent(request, 40))
        });
        let (addr, server) = fake_server_connections(2, script).await;
        let mut client = Client::connect(addr).await.unwrap();
        let stamp = bus::ProducerStamp {
            producer: 77,
            sequence: 5,
        };
        let mut builder = BatchBuilder::default();
        builder.push(1, 1_000, b"alpha");
        let batch = builder.finish_stamped(stamp);
        let ack = client
            .send_stamped(Namespace::new(1, 1, 0), batch.clone(), stamp)
            .await
            .unwrap();
        assert_eq!(
            ack,
            bus::SendAck {
                base_offset: 40,
                message_count: 1,
                next_offset: 0,
                first_offset: 0,
            }
        );
        drop(client);
        let received = server.await.unwrap();
        assert_eq!(received.len(), 2);
        assert_eq!(received[0].1.header, received[1].1.header);
        for (connection, frame) in &received {
            assert_eq!(
                (
                    frame.header.operation,
                    frame.header.request,
                    frame.header.producer,
                    frame.header.sequence
                ),
                (Operation::SendMessages as u8, 1, 77, 5),
                "connection {connection}"
            );
            assert_eq!(frame.body, batch);
        }
    });
}

#[test]
fn issue7_5_producer_numbers_sequences_per_partition_and_renews_after_a_failure() {
    run(async {
        let mut send_count = 0;
        let script: Script = Box::new(move |request| {
            send_count += 1;
            if send_count == 4 {
                return Some(error_reply(&request.header, ErrorCode::InvalidBatch, "no"));
            }
            Some(sent(request, 0))
        });
        let (addr, server) = fake_server(script).await;
        let client = Client::connect(addr).await.unwrap();
        let mut producer = bus::Producer::with_producer_id(client, 9);
        let batch = |count: u64| {
            let mut builder = BatchBuilder::default();
            for id in 0..count {
                builder.push(id, 0, b"m");
            }
            builder
        };
        let (a, b) = (Namespace::new(1, 1, 0), Namespace::new(1, 1, 1));
        producer.send(a, batch(3)).await.unwrap();
        producer.send(a, batch(2)).await.unwrap();
        producer.send(b, batch(1)).await.unwrap();
        assert_eq!(
            (producer.sequence_next(a), producer.sequence_next(b)),
            (5, 1)
        );
        let error = producer.send(a, batch(1)).await.unwrap_err();
        assert!(
            matches!(
                error,
                ClientError::Server {
                    code: ErrorCode::InvalidBatch,
                    ..
                }
            ),
            "{error:?}"
        );
        let renewed = producer.producer_id();
        assert_ne!(renewed, 9, "a failed send starts a new session");
        assert_eq!(producer.sequence_next(a), 0);
        producer.send(a, batch(1)).await.unwrap();
        drop(producer);
        let stamps: Vec<(u64, u64, u64)> = server
            .await
            .unwrap()
            .iter()
            .map(|frame| {
                let stamp = bus::BatchView::parse(&frame.body)
                    .unwrap()
                    .producer_stamp()
                    .unwrap();
                assert_eq!(
                    (stamp.producer, stamp.sequence),
                    (frame.header.producer, frame.header.sequence)
                );
                (frame.header.namespace, stamp.producer, stamp.sequence)
            })
            .collect();
        assert_eq!(
            stamps,
            vec![
                (a.0, 9, 0),
                (a.0, 9, 3),
                (b.0, 9, 0),
                (a.0, 9, 5),
                (a.0, renewed, 0)
            ]
        );
    });
}

/// Issue 12 item 1: the frame's `checksum_body` of a poll reply covers only its batch headers,
/// so the client's check of every batch (`BatchView::parse`, by the batch's checksum rule)
/// before messages are handed out is what catches a damaged message. A reply damaged after the
/// server sealed it: (a) a flipped payload byte fails message 1's checksum, (b) a flipped byte in
/// a message header (its id) fails the batch checksum over the message headers, (c) a flipped
/// byte in a batch header fails the frame's `checksum_body`, so `poll` itself refuses it.
#[test]
fn issue12_1_a_flipped_byte_in_a_poll_reply_is_refused_by_the_client() {
    let mut builder = BatchBuilder::default();
    builder.push(1, 1_000, b"alpha");
    builder.push(2, 1_001, b"beta");
    let mut first = builder.finish();
    bus::batch::set_base_offset(&mut first, 10);
    let mut builder = BatchBuilder::default();
    builder.push(3, 1_002, b"gamma");
    let mut second = builder.finish();
    bus::batch::set_base_offset(&mut second, 12);
    let body = [first.clone(), second].concat();
    // Positions in the reply frame: 256-byte frame header, then batch 1 (header, message 0 of
    // 32 + 5 bytes, message 1 header at 32 + 37).
    let message_1_payload = bus::HEADER_SIZE + 32 + 37 + 32 + 2;
    let message_1_id = bus::HEADER_SIZE + 32 + 37 + 16;
    let batch_2_timestamp = bus::HEADER_SIZE + first.len() + 8;
    let batch_1_checksum = bus::HEADER_SIZE + 24;
    let poll_with_flip = |at: Option<usize>| {
        let body = body.clone();
        run(async move {
            let script: Script = Box::new(move |request| {
                let mut header = reply_header(&request.header);
                header.count = 3;
                header.next_offset = 13;
                let mut frame = encode_frame(&mut header, &body);
                if let Some(at) = at {
                    frame[at] ^= 0x20;
                }
                Some(frame)
            });
            let (addr, _server) = fake_server(script).await;
            let mut client = Client::connect(addr).await.unwrap();
            client.poll(Namespace::new(1, 1, 0), 10, 100).await
        })
    };

    let intact = poll_with_flip(None).unwrap();
    assert_eq!(intact.messages().unwrap().len(), 3);

    let result = poll_with_flip(Some(message_1_payload)).unwrap();
    let expected_actual = twox_hash::XxHash3_64::oneshot(b"beTa");
    assert_eq!(
        result.messages().unwrap_err(),
        bus::BatchError::MessageChecksum {
            index: 1,
            offset_delta: 1,
            payload_len: 4,
            recorded: twox_hash::XxHash3_64::oneshot(b"beta"),
            actual: expected_actual,
        }
    );
    let result = poll_with_flip(Some(message_1_id)).unwrap();
    assert_eq!(result.messages().unwrap_err(), bus::BatchError::Checksum);

    for at in [batch_1_checksum, batch_2_timestamp] {
        match poll_with_flip(Some(at)) {
            Err(ClientError::Frame(FrameError::BodyChecksum)) => {}
            other => {
                panic!("flip at frame byte {at}: expected a body checksum error, got {other:?}")
            }
        }
    }
}
