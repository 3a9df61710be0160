//! `Client` in a cluster (issue 8 section 2): it follows `NotPrimary` to the address the answer
//! names, or to the next address of its list when the answer names none or the named one cannot
//! be reached, resends the same request (same client id and request number), and fails with
//! `NoPrimary` when no server answers as the primary within its retry budget. Fake servers here
//! accept any number of connections and answer each request as the test scripts.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use bus::{
    BatchBuilder, Client, ClientError, ErrorCode, Frame, FrameError, Namespace, Operation,
    encode_frame, not_primary, read_frame, reply_header, write_frame,
};
use compio::net::TcpListener;

fn run<F: Future>(future: F) -> F::Output {
    compio::runtime::Runtime::new()
        .expect("compio runtime")
        .block_on(future)
}

/// How one fake server answers each request.
type Script = Rc<dyn Fn(&Frame) -> Vec<u8>>;

/// A fake server: every request it receives, in order.
#[derive(Clone)]
struct Fake {
    addr: SocketAddr,
    received: Rc<RefCell<Vec<Frame>>>,
}

impl Fake {
    /// (operation, client, request) of each request received.
    fn identities(&self) -> Vec<(u8, u128, u64)> {
        self.received
            .borrow()
            .iter()
            .map(|f| (f.header.operation, f.header.client, f.header.request))
            .collect()
    }
}

/// Binds a fake server that serves every connection it accepts with `script`, until the
/// runtime ends.
async fn fake(script: Script) -> Fake {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fake = Fake {
        addr: listener.local_addr().unwrap(),
        received: Rc::default(),
    };
    let received = Rc::clone(&fake.received);
    compio::runtime::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let script = Rc::clone(&script);
            let received = Rc::clone(&received);
            compio::runtime::spawn(async move {
                loop {
                    let frame = match read_frame(&mut stream, bus::limits::MESSAGE_SIZE_MAX_DEFAULT)
                        .await
                    {
                        Ok(frame) => frame,
                        Err(FrameError::Closed | FrameError::Io(_)) => break,
                        Err(error) => panic!("fake server read: {error}"),
                    };
                    let answer = script(&frame);
                    received.borrow_mut().push(frame);
                    if write_frame(&mut stream, answer).await.0.is_err() {
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

/// A primary: a Register gets session 1 in `offset`, anything else an empty success.
fn primary() -> Script {
    Rc::new(|request: &Frame| {
        let mut header = reply_header(&request.header);
        if request.header.operation == Operation::Register as u8 {
            header.offset = 1;
        }
        encode_frame(&mut header, b"")
    })
}

/// A backup of view 3 whose primary is replica 1 at `primary_addr` (`None`: a view change).
fn backup(primary_addr: Option<SocketAddr>) -> Script {
    Rc::new(move |request: &Frame| {
        not_primary(
            &request.header,
            3,
            1,
            primary_addr.map(|addr| addr.to_string()).as_deref(),
        )
    })
}

/// A backup that answers Register like a primary (sessions are replicated) and every other
/// request `NotPrimary` naming `primary_addr`.
fn backup_after_register(primary_addr: SocketAddr) -> Script {
    let register = primary();
    let other = backup(Some(primary_addr));
    Rc::new(move |request: &Frame| {
        if request.header.operation == Operation::Register as u8 {
            register(request)
        } else {
            other(request)
        }
    })
}

/// An address where nothing listens.
fn dead_address() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    addr
}

#[test]
fn not_primary_moves_to_the_named_primary_and_resends_the_same_request() {
    run(async {
        let new_primary = fake(primary()).await;
        let old = fake(backup_after_register(new_primary.addr)).await;
        let mut client = Client::connect(old.addr).await.unwrap();
        let id = client.client_id();
        client.create_stream(7, "orders").await.unwrap();
        assert_eq!(client.addr(), new_primary.addr);
        let create = Operation::CreateStream as u8;
        let register = Operation::Register as u8;
        // Registered at the old address; the change refused there and resent unchanged.
        assert_eq!(old.identities(), vec![(register, id, 0), (create, id, 1)]);
        assert_eq!(new_primary.identities(), vec![(create, id, 1)]);
        assert_eq!(
            old.received.borrow()[1].body,
            new_primary.received.borrow()[0].body
        );
        // The next call goes straight to the primary.
        client.delete_stream(7).await.unwrap();
        assert_eq!(old.identities().len(), 2);
        assert_eq!(
            new_primary.identities(),
            vec![(create, id, 1), (Operation::DeleteStream as u8, id, 2)]
        );
    });
}

#[test]
fn an_empty_not_primary_moves_to_the_next_address_in_turn() {
    run(async {
        let first = fake(backup(None)).await;
        let second = fake(backup(None)).await;
        let third = fake(primary()).await;
        let mut client = Client::connect_any(&[first.addr, second.addr, third.addr])
            .await
            .unwrap();
        assert_eq!(client.addr(), first.addr);
        client.ping().await.unwrap();
        assert_eq!(client.addr(), third.addr);
        let id = client.client_id();
        let ping = Operation::Ping as u8;
        for fake in [&first, &second, &third] {
            assert_eq!(fake.identities(), vec![(ping, id, 1)]);
        }
    });
}

#[test]
fn an_unreachable_named_primary_moves_to_the_next_address() {
    run(async {
        let first = fake(backup(Some(dead_address()))).await;
        let second = fake(primary()).await;
        let mut client = Client::connect_any(&[first.addr, second.addr])
            .await
            .unwrap();
        client.ping().await.unwrap();
        assert_eq!(client.addr(), second.addr);
        assert_eq!(second.identities().len(), 1);
    });
}

#[test]
fn a_dead_first_address_is_skipped_on_connect_and_on_failover() {
    run(async {
        let dead = dead_address();
        let live = fake(primary()).await;
        let client = Client::connect_any(&[dead, live.addr]).await.unwrap();
        assert_eq!(client.addr(), live.addr);
        assert_eq!(client.addresses(), &[dead, live.addr]);
        let client = Client::connect_any_with_timeout(&[dead, live.addr], Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(client.addr(), live.addr);
        let error = Client::connect_any_with_timeout(&[dead, dead_address()], Duration::ZERO)
            .await
            .unwrap_err();
        assert!(
            matches!(
                error,
                ClientError::ConnectAnyTimeout {
                    attempt_count: 2,
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(
            error
                .to_string()
                .starts_with(&format!("cannot connect to any of {dead},")),
            "{error}"
        );
    });
}

#[test]
fn a_plain_send_follows_not_primary_since_nothing_was_applied() {
    run(async {
        let new_primary = fake(primary()).await;
        let old = fake(backup(Some(new_primary.addr))).await;
        let mut client = Client::connect(old.addr).await.unwrap();
        let mut batch = BatchBuilder::default();
        batch.push(1, 1_000, b"hello");
        let batch = batch.finish();
        client
            .send_messages(Namespace::new(1, 1, 0), batch.clone())
            .await
            .unwrap();
        assert_eq!(old.received.borrow()[0].body, batch);
        assert_eq!(new_primary.received.borrow()[0].body, batch);
    });
}

#[test]
fn no_primary_anywhere_fails_with_no_primary_naming_the_addresses() {
    run(async {
        let first = fake(backup(None)).await;
        let second = fake(backup(None)).await;
        let mut client = Client::connect_any(&[first.addr, second.addr])
            .await
            .unwrap()
            .with_retry_budget(Duration::from_millis(300));
        let error = client.ping().await.unwrap_err();
        let ClientError::NoPrimary {
            addresses,
            attempt_count,
            redirect_count,
            last,
        } = &error
        else {
            panic!("expected NoPrimary, got {error:?}");
        };
        assert_eq!(*addresses, format!("{},{}", first.addr, second.addr));
        assert!(
            *redirect_count >= 2 && attempt_count == redirect_count,
            "{error}"
        );
        assert!(
            matches!(
                **last,
                ClientError::Server {
                    code: ErrorCode::NotPrimary,
                    ..
                }
            ),
            "{error}"
        );
        // Both servers were asked, in turn.
        assert!(!first.identities().is_empty() && !second.identities().is_empty());
    });
}

#[test]
fn two_servers_naming_each_other_are_bounded() {
    run(async {
        // Each names the other: a confused pair. The client must not spin.
        let a_names: Rc<std::cell::Cell<Option<SocketAddr>>> = Rc::default();
        let b_names: Rc<std::cell::Cell<Option<SocketAddr>>> = Rc::default();
        let naming = |cell: &Rc<std::cell::Cell<Option<SocketAddr>>>| -> Script {
            let cell = Rc::clone(cell);
            Rc::new(move |request: &Frame| backup(cell.get())(request))
        };
        let a = fake(naming(&a_names)).await;
        let b = fake(naming(&b_names)).await;
        a_names.set(Some(b.addr));
        b_names.set(Some(a.addr));
        let mut client = Client::connect(a.addr)
            .await
            .unwrap()
            .with_retry_budget(Duration::from_millis(300));
        let error = client.ping().await.unwrap_err();
        assert!(matches!(error, ClientError::NoPrimary { .. }), "{error:?}");
        // Every other move waits its backoff (10, 20, 40, 80 ms ... within 300 ms): a handful of
        // attempts, not a hot loop.
        let total = a.identities().len() + b.identities().len();
        assert!((2..=16).contains(&total), "{total} attempts");
    });
}

#[test]
fn a_single_address_client_retries_an_empty_not_primary_on_the_same_server() {
    run(async {
        let only = fake(backup(None)).await;
        let mut client = Client::connect(only.addr)
            .await
            .unwrap()
            .with_retry_budget(Duration::from_millis(100));
        let error = client.ping().await.unwrap_err();
        assert!(
            error.to_string().starts_with(&format!(
                "no primary answered: {} attempts over {}",
                only.identities().len(),
                only.addr
            )),
            "{error}"
        );
        assert!(only.identities().len() >= 2, "retried on the same server");
        assert_eq!(client.addr(), only.addr);
    });
}

#[test]
fn a_single_address_client_returns_to_its_address_when_the_named_primary_dies() {
    run(async {
        // The only known address is a backup naming a primary that is gone.
        let gone = dead_address();
        let calls = Rc::new(std::cell::Cell::new(0u32));
        let counter = Rc::clone(&calls);
        let named = backup(Some(gone));
        let primary_now = primary();
        // First answer: NotPrimary naming the dead primary; later (the view changed to this
        // replica): served.
        let only = fake(Rc::new(move |request: &Frame| {
            counter.set(counter.get() + 1);
            if counter.get() == 1 {
                named(request)
            } else {
                primary_now(request)
            }
        }))
        .await;
        let mut client = Client::connect(only.addr).await.unwrap();
        client.ping().await.unwrap();
        assert_eq!(client.addr(), only.addr);
        assert_eq!(calls.get(), 2);
    });
}

#[test]
fn an_empty_not_primary_says_no_primary_is_known() {
    run(async {
        let only = fake(backup(None)).await;
        let mut client = Client::connect(only.addr)
            .await
            .unwrap()
            .with_retry_budget(Duration::from_millis(50));
        let error = client.ping().await.unwrap_err();
        let message = error.to_string();
        assert!(
            message.ends_with(
                "last error: server error NotPrimary (19): no primary known (a view change may be \
                 under way)"
            ),
            "{message}"
        );
        assert_eq!(
            bus::client::NO_PRIMARY_KNOWN,
            "no primary known (a view change may be under way)"
        );
    });
}

#[test]
fn a_view_change_that_never_ends_is_cut_by_the_request_timeout() {
    run(async {
        // Retry budget and redirects would go on for about 10 s; the deadline ends the call first.
        let a = fake(backup(None)).await;
        let b = fake(backup(None)).await;
        let mut client = Client::connect_any(&[a.addr, b.addr])
            .await
            .unwrap()
            .with_retry_budget(Duration::from_hours(1))
            .with_request_timeout(Duration::from_millis(100));
        let error = client.ping().await.unwrap_err();
        let ClientError::RequestTimeout {
            last, addresses, ..
        } = &error
        else {
            panic!("expected RequestTimeout, got {error:?}");
        };
        assert_eq!(*addresses, format!("{},{}", a.addr, b.addr));
        assert!(
            last.as_ref()
                .is_some_and(|last| last.to_string().contains(bus::client::NO_PRIMARY_KNOWN)),
            "{error}"
        );
    });
}
