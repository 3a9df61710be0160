//! The simulator's checks, each a named rule (issue 8 section 4). The world reports what it
//! observes (a replica's commits and state digest, the prepares written, the Apply actions, the
//! replies clients receive); the checker keeps a global record and returns the first violation.
//!
//! Rules:
//! - `agreement`: no two replicas commit different prepares (checksums) at the same op.
//! - `state-digest`: replicas at the same commit point have the same state digest.
//! - `exactly-once`: a client's request is applied by one op only, and its reply matches that op
//!   (a Register's session is the op; a change's reply says success iff it applied).
//! - `reply-stable`: every final reply to one request is identical (a retry gets the original).
//! - `commit-lost`: (after the heal) the converged commit reaches every op ever committed.
//! - `install-committed-state` (issue 9): a replica installs a transferred checkpoint only of a
//!   committed op, and only the state every replica had at that commit point (its digest).
//!
//! The world checks a few more itself: `session-kept` (a client is never answered Evicted while
//! the client table has room), `recovery`, `superblock-monotonic`, `checkpoint-monotonic`, `install-monotonic`,
//! `install-adopted`, `converged-digest`,
//! `wire`, `prepare-body`, `reply-token`, `core-panic` and `liveness`.
//!
//! It never touches a replica: it only judges what the world tells it.

use std::collections::BTreeMap;

use shards::vsr::message::ClientReply;

/// A broken rule: its name and what was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub rule: &'static str,
    pub detail: String,
}

fn violation(rule: &'static str, detail: String) -> Result<(), Violation> {
    Err(Violation { rule, detail })
}

/// Who asked for a prepare (decoded from its body).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrepareOrigin {
    pub client: u128,
    pub request: u64,
}

/// The global record the rules are checked against.
#[derive(Debug, Default)]
pub struct Checker {
    /// op -> (checksum, the replica that first committed it).
    committed: BTreeMap<u64, (u128, u8)>,
    /// commit point -> (state digest, the replica that first reported it).
    digests: BTreeMap<u64, (u64, u8)>,
    /// Prepare checksum -> who asked for it (every prepare a journal was asked to write).
    origins: BTreeMap<u128, PrepareOrigin>,
    /// (client, request) -> the op that committed it.
    applied_at: BTreeMap<(u128, u64), u64>,
    /// op -> whether the state machine applied the change (false: a deterministic rejection).
    apply_outcome: BTreeMap<u64, bool>,
    /// (client, request) -> the first final reply received.
    replies: BTreeMap<(u128, u64), ClientReply>,
}

impl Checker {
    pub fn new() -> Checker {
        Checker::default()
    }

    /// A journal was asked to write the prepare with `checksum`, asked for by `origin`.
    pub fn on_prepare(&mut self, checksum: u128, origin: PrepareOrigin) {
        self.origins.insert(checksum, origin);
    }

    /// Replica `replica` has committed the prepare `checksum` at `op`.
    ///
    /// # Errors
    /// `agreement` if another prepare was committed at `op`; `exactly-once` if the request the
    /// prepare carries was already committed at another op.
    pub fn on_commit(&mut self, replica: u8, op: u64, checksum: u128) -> Result<(), Violation> {
        match self.committed.get(&op) {
            Some(&(first, first_replica)) if first != checksum => {
                return violation(
                    "agreement",
                    format!(
                        "op {op}: replica {replica} committed prepare {checksum:#034x}, replica \
                         {first_replica} committed {first:#034x}"
                    ),
                );
            }
            Some(_) => return Ok(()),
            None => {}
        }
        self.committed.insert(op, (checksum, replica));
        let Some(origin) = self.origins.get(&checksum).copied() else {
            return Ok(());
        };
        let key = (origin.client, origin.request);
        if let Some(&first_op) = self.applied_at.get(&key) {
            return violation(
                "exactly-once",
                format!(
                    "client {:#x} request {} committed twice: at op {first_op} and at op {op}",
                    origin.client, origin.request
                ),
            );
        }
        self.applied_at.insert(key, op);
        Ok(())
    }

    /// A replica applied op `op`; `applied` false for a rejected change.
    pub fn on_apply(&mut self, op: u64, applied: bool) {
        self.apply_outcome.entry(op).or_insert(applied);
    }

    /// Replica `replica` is at commit point `commit_min` with state digest `digest`.
    ///
    /// # Errors
    /// `state-digest` if another replica had another digest at this commit point.
    pub fn on_digest(
        &mut self,
        replica: u8,
        commit_min: u64,
        digest: u64,
    ) -> Result<(), Violation> {
        match self.digests.get(&commit_min) {
            Some(&(first, first_replica)) if first != digest => violation(
                "state-digest",
                format!(
                    "commit {commit_min}: replica {replica} has state digest {digest:#018x}, \
                     replica {first_replica} had {first:#018x}"
                ),
            ),
            Some(_) => Ok(()),
            None => {
                self.digests.insert(commit_min, (digest, replica));
                Ok(())
            }
        }
    }

    /// Replica `replica` asks to install a transferred checkpoint at `checkpoint_op` whose
    /// state has digest `digest` (DESIGN section 10: it installs a committed state).
    ///
    /// # Errors
    /// `install-committed-state` if no replica committed `checkpoint_op`, no replica was ever
    /// seen at that commit point, or the state differs from what they had there.
    pub fn on_install(
        &mut self,
        replica: u8,
        checkpoint_op: u64,
        digest: u64,
    ) -> Result<(), Violation> {
        if checkpoint_op > self.commit_max() {
            return violation(
                "install-committed-state",
                format!(
                    "replica {replica} installs checkpoint {checkpoint_op} above every commit \
                     ({})",
                    self.commit_max()
                ),
            );
        }
        match self.digests.get(&checkpoint_op) {
            Some(&(first, _)) if first == digest => Ok(()),
            Some(&(first, first_replica)) => violation(
                "install-committed-state",
                format!(
                    "replica {replica} installs checkpoint {checkpoint_op} with state digest \
                     {digest:#018x}; replica {first_replica} had {first:#018x} at that commit"
                ),
            ),
            None => violation(
                "install-committed-state",
                format!(
                    "replica {replica} installs checkpoint {checkpoint_op}, a commit point no \
                     replica was seen at"
                ),
            ),
        }
    }

    /// Client `client` received the final reply `reply` to request `request` (a Committed or
    /// Registered reply; NotPrimary, Error and Evicted are not final).
    ///
    /// # Errors
    /// `reply-stable` if an earlier reply to the same request differs; `exactly-once` if the
    /// reply does not match the op that committed the request, or the request never committed.
    pub fn on_reply(
        &mut self,
        client: u128,
        request: u64,
        reply: &ClientReply,
    ) -> Result<(), Violation> {
        let key = (client, request);
        if let Some(first) = self.replies.get(&key) {
            if first != reply {
                return violation(
                    "reply-stable",
                    format!(
                        "client {client:#x} request {request}: reply {reply:?} differs from the \
                         first reply {first:?}"
                    ),
                );
            }
            return Ok(());
        }
        self.replies.insert(key, reply.clone());
        let Some(&op) = self.applied_at.get(&key) else {
            return violation(
                "exactly-once",
                format!(
                    "client {client:#x} request {request} was answered {reply:?} but no replica \
                     committed it"
                ),
            );
        };
        match reply {
            ClientReply::Registered { session } if *session != op => violation(
                "exactly-once",
                format!(
                    "client {client:#x}: Register committed at op {op} but the reply names \
                     session {session}"
                ),
            ),
            ClientReply::Committed(cached) => {
                if cached.request != request {
                    return violation(
                        "exactly-once",
                        format!(
                            "client {client:#x} request {request}: the reply is for request {}",
                            cached.request
                        ),
                    );
                }
                match self.apply_outcome.get(&op) {
                    Some(&applied) if applied != (cached.error_code == 0) => violation(
                        "exactly-once",
                        format!(
                            "client {client:#x} request {request} at op {op}: applied={applied} \
                             but the reply's error code is {}",
                            cached.error_code
                        ),
                    ),
                    _ => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }

    /// The highest op any replica committed.
    pub fn commit_max(&self) -> u64 {
        self.committed.last_key_value().map_or(0, |(&op, _)| op)
    }

    /// After the heal: every replica converged at `converged_commit`.
    ///
    /// # Errors
    /// `commit-lost` if an op above it was committed before.
    pub fn check_converged(&self, converged_commit: u64) -> Result<(), Violation> {
        let commit_max = self.commit_max();
        if converged_commit < commit_max {
            let (checksum, replica) = self.committed[&commit_max];
            return violation(
                "commit-lost",
                format!(
                    "the cluster converged at commit {converged_commit}, but replica {replica} \
                     had committed op {commit_max} (prepare {checksum:#034x})"
                ),
            );
        }
        Ok(())
    }

    /// Requests committed so far.
    pub fn committed_request_count(&self) -> usize {
        self.applied_at.len()
    }
}

#[cfg(test)]
mod tests {
    use shards::vsr::client_table::CachedReply;

    use super::*;

    fn cached(request: u64, error_code: u32) -> ClientReply {
        ClientReply::Committed(CachedReply {
            request,
            operation: 2,
            error_code,
            offset: 0,
            count: 0,
            body: Vec::new(),
            request_checksum: 0,
        })
    }

    #[test]
    fn agreement_catches_a_different_prepare_at_one_op() {
        let mut checker = Checker::new();
        checker.on_commit(0, 5, 0xaa).unwrap();
        checker.on_commit(1, 5, 0xaa).unwrap();
        let error = checker.on_commit(2, 5, 0xbb).unwrap_err();
        assert_eq!(error.rule, "agreement");
        assert!(error.detail.contains("replica 2") && error.detail.contains("replica 0"));
    }

    #[test]
    fn state_digests_must_agree_per_commit_point() {
        let mut checker = Checker::new();
        checker.on_digest(0, 3, 1).unwrap();
        checker.on_digest(1, 4, 2).unwrap();
        checker.on_digest(1, 3, 1).unwrap();
        assert_eq!(checker.on_digest(2, 4, 9).unwrap_err().rule, "state-digest");
    }

    #[test]
    fn a_request_committed_twice_or_answered_wrongly_is_caught() {
        let mut checker = Checker::new();
        let origin = PrepareOrigin {
            client: 7,
            request: 1,
        };
        checker.on_prepare(0x1, origin);
        checker.on_prepare(0x2, origin);
        checker.on_commit(0, 1, 0x1).unwrap();
        checker.on_apply(1, true);
        checker.on_reply(7, 1, &cached(1, 0)).unwrap();
        // The same reply again (a retry) is fine; another one is not.
        checker.on_reply(7, 1, &cached(1, 0)).unwrap();
        assert_eq!(
            checker.on_reply(7, 1, &cached(1, 3)).unwrap_err().rule,
            "reply-stable"
        );
        assert_eq!(
            checker.on_commit(0, 2, 0x2).unwrap_err().rule,
            "exactly-once"
        );

        let mut checker = Checker::new();
        checker.on_prepare(0x1, origin);
        checker.on_commit(0, 1, 0x1).unwrap();
        checker.on_apply(1, false);
        let error = checker.on_reply(7, 1, &cached(1, 0)).unwrap_err();
        assert_eq!(error.rule, "exactly-once");
        assert!(error.detail.contains("applied=false"), "{}", error.detail);
        // A reply to a request nobody committed is a forged commit.
        assert_eq!(
            checker.on_reply(7, 2, &cached(2, 0)).unwrap_err().rule,
            "exactly-once"
        );
        let register = PrepareOrigin {
            client: 8,
            request: 0,
        };
        checker.on_prepare(0x3, register);
        checker.on_commit(0, 2, 0x3).unwrap();
        let error = checker
            .on_reply(8, 0, &ClientReply::Registered { session: 1 })
            .unwrap_err();
        assert!(error.detail.contains("session 1"), "{}", error.detail);
    }

    #[test]
    fn issue9_install_of_an_uncommitted_or_different_state_is_caught() {
        let mut checker = Checker::new();
        checker.on_commit(0, 16, 0x16).unwrap();
        checker.on_digest(0, 16, 0xabc).unwrap();
        checker.on_install(1, 16, 0xabc).unwrap();
        let error = checker.on_install(1, 16, 0xdef).unwrap_err();
        assert_eq!(error.rule, "install-committed-state");
        assert!(error.detail.contains("replica 0 had"), "{}", error.detail);
        // Above every commit, or a commit point nobody reported: refused.
        assert!(
            checker
                .on_install(1, 32, 0xabc)
                .unwrap_err()
                .detail
                .contains("above every")
        );
        checker.on_commit(0, 20, 0x20).unwrap();
        assert!(
            checker
                .on_install(1, 18, 0xabc)
                .unwrap_err()
                .detail
                .contains("no replica")
        );
    }

    #[test]
    fn converging_below_a_committed_op_is_a_lost_commit() {
        let mut checker = Checker::new();
        checker.on_commit(1, 9, 0x9).unwrap();
        checker.check_converged(9).unwrap();
        assert_eq!(checker.check_converged(8).unwrap_err().rule, "commit-lost");
    }
}
