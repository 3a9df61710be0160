//! The deadline of a client call (`Client::with_request_timeout`): a server that holds a request
//! without answering (a replica that cannot reach a majority) ends the call with
//! `RequestTimeout`, and the connection it was waiting on is closed, so a late reply is never
//! taken for the answer to a later call. The fake server here answers nothing on its first
//! connection and everything on later ones.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use bus::{
    Client, ClientError, Frame, FrameError, Operation, encode_frame, read_frame, reply_header,
    write_frame,
};
use compio::net::TcpListener;

/// Short, so the tests end soon; the tests check which error comes, never how fast.
const TEST_REQUEST_TIMEOUT: Duration = Duration::from_millis(200);
/// How often a test looks whether the fake saw its first connection closed.
const CLOSE_POLL_INTERVAL: Duration = Duration::from_millis(10);

fn run<F: Future>(future: F) -> F::Output {
    compio::runtime::Runtime::new()
        .expect("compio runtime")
        .block_on(future)
}

/// A fake server whose first `silent_connections` connections read requests and never answer;
/// later connections answer every request with an empty success (Register: session 1).
#[derive(Clone)]
struct Fake {
    addr: SocketAddr,
    /// (connection index, request) of each request received, in order.
    received: Rc<RefCell<Vec<(usize, Frame)>>>,
    /// Connections the client closed (the fake read end of stream there).
    closed: Rc<RefCell<Vec<usize>>>,
}

async fn fake(silent_connections: usize) -> Fake {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fake = Fake {
        addr: listener.local_addr().unwrap(),
        received: Rc::default(),
        closed: Rc::default(),
    };
    let received = Rc::clone(&fake.received);
    let closed = Rc::clone(&fake.closed);
    compio::runtime::spawn(async move {
        let next = Cell::new(0usize);
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let index = next.replace(next.get() + 1);
            let received = Rc::clone(&received);
            let closed = Rc::clone(&closed);
            compio::runtime::spawn(async move {
                loop {
                    let frame = match read_frame(&mut stream, bus::limits::MESSAGE_SIZE_MAX_DEFAULT)
                        .await
                    {
                        Ok(frame) => frame,
                        Err(FrameError::Closed | FrameError::Io(_)) => {
                            closed.borrow_mut().push(index);
                            break;
                        }
                        Err(error) => panic!("fake server read: {error}"),
                    };
                    let mut header = reply_header(&frame.header);
                    if frame.header.operation == Operation::Register as u8 {
                        header.offset = 1;
                    }
                    received.borrow_mut().push((index, frame));
                    if index < silent_connections {
                        continue;
                    }
                    if write_frame(&mut stream, encode_frame(&mut header, b""))
                        .await
                        .0
                        .is_err()
                    {
                        break;
                    }
                }
            })
            .detach();
        }
    })
    .detach();
    fake
}

#[test]
fn a_request_nobody_answers_times_out_with_the_typed_error() {
    run(async {
        let server = fake(usize::MAX).await;
        let mut client = Client::connect(server.addr)
            .await
            .unwrap()
            .with_request_timeout(TEST_REQUEST_TIMEOUT);
        assert_eq!(client.request_timeout(), TEST_REQUEST_TIMEOUT);
        // A session-tracked change: its Register goes first and is never answered.
        let error = client.create_stream(9, "x").await.unwrap_err();
        match &error {
            ClientError::RequestTimeout {
                addr,
                timeout,
                attempt_count,
                last,
                ..
            } => {
                assert_eq!(*addr, server.addr);
                assert_eq!(*timeout, TEST_REQUEST_TIMEOUT);
                assert_eq!(*attempt_count, 1);
                assert!(last.is_none(), "{last:?}");
            }
            other => panic!("expected RequestTimeout, got {other:?}"),
        }
        let message = error.to_string();
        for part in [
            &format!(
                "no reply from {} within the request timeout of 200 ms",
                server.addr
            ),
            "is a majority of the replicas up?",
            "may or may not have been applied",
            "same request number",
        ] {
            assert!(message.contains(part), "{part:?} missing from: {message}");
        }
        assert_eq!(client.session(), None);
        let received = server.received.borrow();
        assert_eq!(received.len(), 1);
        assert_eq!(received[0].1.header.operation, Operation::Register as u8);
    });
}

#[test]
fn a_timed_out_call_closes_its_connection_and_the_next_call_gets_its_own_reply() {
    run(async {
        let server = fake(1).await;
        let mut client = Client::connect(server.addr)
            .await
            .unwrap()
            .with_request_timeout(TEST_REQUEST_TIMEOUT);
        let error = client.ping().await.unwrap_err();
        assert!(
            matches!(error, ClientError::RequestTimeout { .. }),
            "{error:?}"
        );
        // The client closed the connection the request is held on: its reply can never be read.
        while !server.closed.borrow().contains(&0) {
            compio::time::sleep(CLOSE_POLL_INTERVAL).await;
        }
        // The next call goes over a new connection, with the next request number.
        client.ping().await.unwrap();
        let seen: Vec<(usize, u64)> = server
            .received
            .borrow()
            .iter()
            .map(|(index, frame)| (*index, frame.header.request))
            .collect();
        assert_eq!(seen, vec![(0, 1), (1, 2)]);
    });
}
