//! The client table: one session slot per registered client, with the number of its last
//! committed request and a bounded ring of the replies it was sent, so a retried request gets the
//! reply it missed instead of being applied twice (at-most-once semantics; VSR Revisited section
//! 4.1 "client table", Liskov and Cowling 2012; TigerBeetle's `client_sessions`).
//!
//! Pure state: no I/O. It changes only through committed ops (`register`, `commit`), in op order,
//! on shard 0, so replaying the journal over a snapshot rebuilds exactly the table the running
//! server had. It must never hold more than `clients_max` sessions nor more than
//! [`REPLY_RING_LEN_MAX`] replies per session.

use std::collections::{BTreeMap, VecDeque};

use crate::limits::REPLY_RING_LEN_MAX;

/// One reply as it was sent for a committed request; resent as-is for a duplicate.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CachedReply {
    /// The request number this reply answers.
    pub request: u64,
    /// The request's `bus::Operation` number.
    pub operation: u8,
    /// The reply header's `error_code` (0 = success).
    pub error_code: u32,
    /// The reply header's `offset` field.
    pub offset: u64,
    /// The reply header's `count` field.
    pub count: u32,
    /// The reply body bytes.
    pub body: Vec<u8>,
    /// XXH3-64 of the committed request's arguments (`request_checksum`): a request that reuses
    /// the number with other arguments is refused instead of answered with this reply.
    pub request_checksum: u64,
}

/// XXH3-64 of a committed operation's arguments as the journal encodes them (the JSON of the
/// operation), the value [`CachedReply::request_checksum`] holds.
pub fn request_checksum(operation_json: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(operation_json)
}

/// One client's session slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The op number that committed the client's Register: the session number the client holds.
    pub session: u64,
    /// The last committed request number (0 right after Register).
    pub request: u64,
    /// The op number of this session's latest commit (Register or request): the eviction order.
    pub commit_op: u64,
    /// Replies to the latest committed requests, oldest first, at most [`REPLY_RING_LEN_MAX`].
    pub replies: VecDeque<CachedReply>,
}

/// What the table says about an incoming `(client, request)` before anything is prepared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// A request number above the session's last committed one: prepare it.
    New,
    /// Already committed: resend this reply; apply nothing.
    Cached(CachedReply),
    /// Already committed, but its reply left the ring: the client must not expect it.
    Stale {
        /// The oldest request number whose reply is still cached (0 if none is).
        oldest_cached_request: u64,
    },
    /// The client has no session: it never registered, or was evicted.
    NoSession,
}

/// Sessions keyed by client id, bounded by `clients_max`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTable {
    clients_max: usize,
    /// A `BTreeMap` so that iteration (snapshots, the eviction scan's tie-break) is deterministic.
    sessions: BTreeMap<u128, Session>,
    /// The highest `commit_op` of any session (0 when empty): the last op applied to the table,
    /// since each op commits at most one session. Kept so the op-order check is O(1) per apply
    /// (a scan of every session made registering N clients O(N^2): 100k sessions took a minute,
    /// the `transfer_cluster` bench).
    newest_commit_op: u64,
}

/// The client table as the snapshot stores it (`storage/FORMAT.md` section 9.1). Client ids are
/// `0x`-prefixed hex strings because JSON numbers above 2^53 lose precision in most readers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientTableSnapshot {
    pub sessions: Vec<SessionSnapshot>,
}

/// One session in a snapshot; see [`Session`] for the fields.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSnapshot {
    pub client: String,
    pub session: u64,
    pub request: u64,
    pub commit_op: u64,
    pub replies: Vec<CachedReply>,
}

impl ClientTable {
    /// An empty table holding at most `clients_max` sessions.
    ///
    /// # Panics
    /// If `clients_max` is 0 (the configuration validates it).
    pub fn new(clients_max: usize) -> ClientTable {
        assert!(clients_max > 0, "clients_max must be at least 1");
        ClientTable {
            clients_max,
            sessions: BTreeMap::new(),
            newest_commit_op: 0,
        }
    }

    /// Sessions held now.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// The most sessions the table holds.
    pub fn clients_max(&self) -> usize {
        self.clients_max
    }

    /// The session of `client`, if it has one.
    pub fn session(&self, client: u128) -> Option<&Session> {
        self.sessions.get(&client)
    }

    /// Classifies request number `request` of `client` (see [`Lookup`]). Never changes the table.
    pub fn lookup(&self, client: u128, request: u64) -> Lookup {
        let Some(session) = self.sessions.get(&client) else {
            return Lookup::NoSession;
        };
        if request > session.request {
            return Lookup::New;
        }
        match session
            .replies
            .iter()
            .find(|reply| reply.request == request)
        {
            Some(reply) => Lookup::Cached(reply.clone()),
            None => Lookup::Stale {
                oldest_cached_request: session.replies.front().map_or(0, |reply| reply.request),
            },
        }
    }

    /// Applies a committed Register of `client` at op `op`: a fresh session numbered `op`. Shard
    /// 0 never prepares a Register for a client that has a session (it answers with the
    /// existing one), so replacing one here happens only when replaying such a journal. When the table is full, first evicts the
    /// session whose latest commit is oldest and returns its client id.
    ///
    /// # Panics
    /// If `op` is not above every commit op already in the table (ops are applied in order).
    pub fn register(&mut self, client: u128, op: u64) -> Option<u128> {
        self.assert_op_order(op);
        let mut evicted = None;
        if !self.sessions.contains_key(&client) && self.sessions.len() >= self.clients_max {
            let oldest = self
                .sessions
                .iter()
                .min_by_key(|(_, session)| session.commit_op)
                .map(|(&id, _)| id);
            if let Some(id) = oldest {
                self.sessions.remove(&id);
                evicted = Some(id);
            }
        }
        self.sessions.insert(
            client,
            Session {
                session: op,
                request: 0,
                commit_op: op,
                replies: VecDeque::new(),
            },
        );
        self.newest_commit_op = op;
        assert!(self.sessions.len() <= self.clients_max);
        evicted
    }

    /// Applies the commit at op `op` of `client`'s request `reply.request` and caches its reply,
    /// dropping the oldest cached reply beyond [`REPLY_RING_LEN_MAX`].
    ///
    /// # Panics
    /// If `client` has no session or the request number is not above the last committed one
    /// (shard 0 checks both with [`ClientTable::lookup`] before it prepares), or `op` is out of
    /// order.
    pub fn commit(&mut self, client: u128, op: u64, reply: CachedReply) {
        self.assert_op_order(op);
        let session = self
            .sessions
            .get_mut(&client)
            .unwrap_or_else(|| panic!("commit for client {client:#034x}, which has no session"));
        assert!(
            reply.request > session.request,
            "client {client:#034x} request {} committed after request {}",
            reply.request,
            session.request
        );
        session.request = reply.request;
        session.commit_op = op;
        self.newest_commit_op = op;
        session.replies.push_back(reply);
        while session.replies.len() > REPLY_RING_LEN_MAX {
            session.replies.pop_front();
        }
    }

    fn assert_op_order(&self, op: u64) {
        // Each op commits at most one session, so the newest commit_op is the last applied op.
        let newest = self.newest_commit_op;
        assert!(
            self.sessions.is_empty() || op > newest,
            "client table op {op} applied after op {newest}"
        );
    }

    /// The table as a snapshot stores it, sessions in client-id order.
    pub fn to_snapshot(&self) -> ClientTableSnapshot {
        ClientTableSnapshot {
            sessions: self
                .sessions
                .iter()
                .map(|(client, session)| SessionSnapshot {
                    client: format!("{client:#034x}"),
                    session: session.session,
                    request: session.request,
                    commit_op: session.commit_op,
                    replies: session.replies.iter().cloned().collect(),
                })
                .collect(),
        }
    }

    /// Rebuilds a table from a snapshot, checking every rule a live table keeps: client ids
    /// parse, are non-zero and unique; rings hold at most [`REPLY_RING_LEN_MAX`] replies with
    /// increasing request numbers, the newest equal to the session's request; commit ops are at
    /// least the session number and unique. If the snapshot holds more sessions than
    /// `clients_max` (the flag was lowered), the oldest are evicted and their ids returned.
    ///
    /// # Errors
    /// The first rule broken, naming the client.
    ///
    /// # Panics
    /// If `clients_max` is 0.
    pub fn from_snapshot(
        snapshot: &ClientTableSnapshot,
        clients_max: usize,
    ) -> Result<(ClientTable, Vec<u128>), String> {
        let mut table = ClientTable::new(clients_max);
        let mut commit_ops = std::collections::BTreeSet::new();
        for entry in &snapshot.sessions {
            let client = entry
                .client
                .strip_prefix("0x")
                .and_then(|hex| u128::from_str_radix(hex, 16).ok())
                .ok_or_else(|| format!("client id {:?} is not a 0x-prefixed u128", entry.client))?;
            if client == 0 {
                return Err("client id 0 is reserved".to_owned());
            }
            if entry.replies.len() > REPLY_RING_LEN_MAX {
                return Err(format!(
                    "client {client:#034x} caches {} replies, above the ring length {REPLY_RING_LEN_MAX}",
                    entry.replies.len()
                ));
            }
            if entry
                .replies
                .windows(2)
                .any(|pair| pair[0].request >= pair[1].request)
            {
                return Err(format!(
                    "client {client:#034x}: cached replies are not in increasing request order"
                ));
            }
            if entry
                .replies
                .last()
                .is_some_and(|reply| reply.request != entry.request)
            {
                return Err(format!(
                    "client {client:#034x}: newest cached reply is not for its last request {}",
                    entry.request
                ));
            }
            if entry.commit_op < entry.session || !commit_ops.insert(entry.commit_op) {
                return Err(format!(
                    "client {client:#034x}: commit op {} is below its session {} or shared with another \
                     session",
                    entry.commit_op, entry.session
                ));
            }
            let session = Session {
                session: entry.session,
                request: entry.request,
                commit_op: entry.commit_op,
                replies: entry.replies.iter().cloned().collect(),
            };
            if table.sessions.insert(client, session).is_some() {
                return Err(format!("client {client:#034x} appears twice"));
            }
        }
        let mut evicted = Vec::new();
        while table.sessions.len() > clients_max {
            let oldest = table
                .sessions
                .iter()
                .min_by_key(|(_, session)| session.commit_op)
                .map(|(&id, _)| id)
                .expect("non-empty: above clients_max >= 1");
            table.sessions.remove(&oldest);
            evicted.push(oldest);
        }
        table.newest_commit_op = table
            .sessions
            .values()
            .map(|session| session.commit_op)
            .max()
            .unwrap_or(0);
        Ok((table, evicted))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(request: u64) -> CachedReply {
        CachedReply {
            request,
            operation: 2,
            error_code: 0,
            offset: 0,
            count: 0,
            body: Vec::new(),
            request_checksum: 0,
        }
    }

    #[test]
    fn unknown_client_has_no_session() {
        let table = ClientTable::new(4);
        assert_eq!(table.lookup(7, 1), Lookup::NoSession);
    }

    #[test]
    fn committed_request_is_cached_and_newer_is_new() {
        let mut table = ClientTable::new(4);
        assert_eq!(table.register(7, 1), None);
        assert_eq!(table.lookup(7, 1), Lookup::New);
        table.commit(7, 2, reply(1));
        assert_eq!(table.lookup(7, 1), Lookup::Cached(reply(1)));
        assert_eq!(table.lookup(7, 2), Lookup::New);
        // Request numbers may skip (reads in between use numbers too).
        assert_eq!(table.lookup(7, 9), Lookup::New);
        table.commit(7, 3, reply(9));
        assert_eq!(table.lookup(7, 9), Lookup::Cached(reply(9)));
        assert_eq!(table.session(7).map(|s| s.commit_op), Some(3));
    }

    #[test]
    fn ring_drops_oldest_reply_and_reports_stale() {
        let mut table = ClientTable::new(1);
        table.register(7, 1);
        let count = REPLY_RING_LEN_MAX as u64 + 2;
        for request in 1..=count {
            table.commit(7, request + 1, reply(request));
        }
        assert_eq!(
            table.lookup(7, 1),
            Lookup::Stale {
                oldest_cached_request: 3
            }
        );
        assert_eq!(table.lookup(7, 3), Lookup::Cached(reply(3)));
        assert_eq!(table.lookup(7, count), Lookup::Cached(reply(count)));
        assert_eq!(
            table.session(7).map(|s| s.replies.len()),
            Some(REPLY_RING_LEN_MAX)
        );
    }

    #[test]
    fn full_table_evicts_least_recently_committed() {
        let mut table = ClientTable::new(2);
        assert_eq!(table.register(1, 1), None);
        assert_eq!(table.register(2, 2), None);
        // Client 1 commits later than client 2's register: client 2 is now the oldest.
        table.commit(1, 3, reply(1));
        assert_eq!(table.register(3, 4), Some(2));
        assert_eq!(table.lookup(2, 1), Lookup::NoSession);
        assert_eq!(table.session_count(), 2);
        // Re-registering a present client never evicts.
        assert_eq!(table.register(1, 5), None);
        assert_eq!(
            table.session(1).map(|s| (s.session, s.request)),
            Some((5, 0))
        );
    }

    #[test]
    #[should_panic(expected = "applied after")]
    fn out_of_order_op_panics() {
        let mut table = ClientTable::new(2);
        table.register(1, 5);
        table.register(2, 4);
    }

    #[test]
    #[should_panic(expected = "has no session")]
    fn commit_without_session_panics() {
        let mut table = ClientTable::new(2);
        table.commit(1, 1, reply(1));
    }

    #[test]
    fn snapshot_round_trips() {
        let mut table = ClientTable::new(3);
        table.register(u128::MAX, 1);
        table.register(5, 2);
        table.commit(u128::MAX, 3, reply(4));
        let snapshot = table.to_snapshot();
        assert_eq!(snapshot.sessions[1].client, format!("{:#x}", u128::MAX));
        let json = serde_json::to_vec(&snapshot).unwrap();
        let decoded: ClientTableSnapshot = serde_json::from_slice(&json).unwrap();
        let (restored, evicted) = ClientTable::from_snapshot(&decoded, 3).unwrap();
        assert_eq!(restored, table);
        assert!(evicted.is_empty());
    }

    #[test]
    fn snapshot_over_capacity_evicts_oldest() {
        let mut table = ClientTable::new(3);
        table.register(1, 1);
        table.register(2, 2);
        table.register(3, 3);
        let (restored, evicted) = ClientTable::from_snapshot(&table.to_snapshot(), 2).unwrap();
        assert_eq!(evicted, vec![1]);
        assert_eq!(restored.session_count(), 2);
    }

    #[test]
    fn snapshot_rules_are_checked() {
        let good = SessionSnapshot {
            client: "0x7".to_owned(),
            session: 1,
            request: 2,
            commit_op: 3,
            replies: vec![reply(1), reply(2)],
        };
        let cases: Vec<(SessionSnapshot, &str)> = vec![
            (
                SessionSnapshot {
                    client: "7".to_owned(),
                    ..good.clone()
                },
                "not a 0x-prefixed",
            ),
            (
                SessionSnapshot {
                    client: "0x0".to_owned(),
                    ..good.clone()
                },
                "reserved",
            ),
            (
                SessionSnapshot {
                    replies: vec![reply(2), reply(1)],
                    ..good.clone()
                },
                "increasing",
            ),
            (
                SessionSnapshot {
                    replies: vec![reply(1)],
                    ..good.clone()
                },
                "last request",
            ),
            (
                SessionSnapshot {
                    replies: (1..=REPLY_RING_LEN_MAX as u64 + 1).map(reply).collect(),
                    request: REPLY_RING_LEN_MAX as u64 + 1,
                    ..good.clone()
                },
                "ring length",
            ),
            (
                SessionSnapshot {
                    commit_op: 0,
                    ..good.clone()
                },
                "below its session",
            ),
        ];
        for (entry, expected) in cases {
            let snapshot = ClientTableSnapshot {
                sessions: vec![entry],
            };
            let error = ClientTable::from_snapshot(&snapshot, 4).unwrap_err();
            assert!(error.contains(expected), "{error} lacks {expected}");
        }
        let duplicate = ClientTableSnapshot {
            sessions: vec![
                good.clone(),
                SessionSnapshot {
                    commit_op: 9,
                    ..good
                },
            ],
        };
        let error = ClientTable::from_snapshot(&duplicate, 4).unwrap_err();
        assert!(error.contains("twice"), "{error}");
    }
}
