//! Repair (issue 8 section 2): a replica missing prepares (a gap, a fork, a torn or corrupt
//! journal record) fetches them from peers with `RequestPrepare` / `RequestHeaders`.
//!
//! Trust comes from the parent-checksum chain, never from the sender: `targets` holds the
//! checksums known to be on the current primary's log (a prepare or a `Commit` checksum the
//! primary sent, the chosen log of a view change, and the parents those name, link by link).
//! A prepare is accepted from anyone if its checksum is a target; it waits in `pending` until
//! it connects to the log by its parent, then replaces everything above the connection point
//! (`TruncateJournal`, then `WriteJournal` in op order). A committed op no peer supplies after
//! several rounds starts a state transfer (issue 9 section 4, `replica/transfer.rs`); repair
//! keeps trying meanwhile, and is all that is left while the transfer budget cools down.

use super::{Entry, Replica, Requested};
use crate::vsr::message::{Action, Message, PrepareHeader, ReplicaIndex, Status};
use crate::vsr::transfer::receiver::Stage;

/// Prepares (and headers) requested at once.
const REPAIR_BATCH: usize = 16;
/// Headers in one `Headers` answer at most.
pub const HEADERS_MAX: u64 = 64;
/// Peers waiting on one journal read at most.
const READERS_MAX: usize = 8;
/// Unanswered asks (one per heartbeat interval) for the header of a committed top op before a
/// primary-to-be prepares without naming its parent (see `Replica::ask_top_checksum`).
const TOP_ASKS_BEFORE_PARENTLESS: u32 = 10;

impl Replica {
    /// Forgets every repair in progress (a new view: trust is relative to its primary).
    pub(super) fn clear_repair(&mut self) {
        self.targets.clear();
        self.pending.clear();
        self.requested.clear();
    }

    fn pending_max(&self) -> usize {
        4 * self.config.pipeline_max + 64
    }

    /// Records `entry` as on the trusted chain: its checksum and its parent become targets,
    /// and unless the log already holds it, it waits in `pending` for its connection.
    pub(super) fn accept_verified(&mut self, entry: Entry, _actions: &mut [Action]) {
        let op = entry.prepare.op;
        if op <= self.commit_min {
            return;
        }
        self.targets.insert(op, entry.checksum);
        if entry.parent != 0 && op - 1 > self.commit_min {
            self.targets.entry(op - 1).or_insert(entry.parent);
        }
        if self
            .log
            .get(&op)
            .is_some_and(|held| held.checksum == entry.checksum)
        {
            self.prune_targets();
            return;
        }
        if self.pending.len() >= self.pending_max()
            && self
                .pending
                .last_key_value()
                .is_some_and(|(&highest, _)| op > highest)
        {
            return;
        }
        self.pending.insert(op, entry);
        while self.pending.len() > self.pending_max() {
            self.pending.pop_last();
        }
    }

    /// Drops targets that are committed or satisfied: the highest target the log matches
    /// verifies every op below it (the log is chained).
    pub(super) fn prune_targets(&mut self) {
        self.targets = self.targets.split_off(&(self.commit_min + 1));
        let satisfied = self
            .targets
            .iter()
            .rev()
            .find(|(op, checksum)| {
                self.log
                    .get(op)
                    .is_some_and(|entry| entry.checksum == **checksum)
            })
            .map(|(&op, _)| op);
        if let Some(op) = satisfied {
            self.verified_op = self.verified_op.max(op);
            self.targets = self.targets.split_off(&(op + 1));
        }
        let targets = &self.targets;
        let commit_min = self.commit_min;
        self.requested.retain(|op, requested| {
            if requested.checksum == 0 {
                *op > commit_min && !targets.contains_key(op)
            } else {
                targets.get(op) == Some(&requested.checksum)
            }
        });
        if self.requested.is_empty() {
            self.state_transfer_warned = false;
        }
    }

    pub(super) fn has_unsatisfied_targets(&self) -> bool {
        self.targets.iter().any(|(op, checksum)| {
            *op > self.commit_min
                && self
                    .log
                    .get(op)
                    .is_none_or(|entry| entry.checksum != *checksum)
        })
    }

    /// Connects pending prepares to the log: from the lowest, if its parent is the log's
    /// prepare below it (or that op is committed and no longer held), everything above the
    /// connection point that differs is truncated and the chain is appended.
    pub(super) fn install_pending(&mut self, actions: &mut Vec<Action>) {
        loop {
            self.pending = self.pending.split_off(&(self.commit_min + 1));
            let Some((&low, first)) = self.pending.first_key_value() else {
                self.prune_targets();
                return;
            };
            let below = low - 1;
            let linked = first.parent == 0
                || match self.log.get(&below) {
                    Some(held) => held.checksum == first.parent,
                    None => below <= self.commit_min && below < self.log_floor(),
                };
            if !linked {
                if below <= self.commit_min && self.log.contains_key(&below) {
                    if !self.fork_warned {
                        self.fork_warned = true;
                        tracing::error!(
                            op = low,
                            commit_min = self.commit_min,
                            replica = self.config.replica,
                            "a verified prepare does not chain to this replica's committed op \
                             below it; ignoring it (a committed op is never replaced)"
                        );
                    }
                    self.pending.remove(&low);
                    continue;
                }
                return;
            }
            let mut op = low;
            while let Some(candidate) = self.pending.get(&op) {
                if self
                    .log
                    .get(&op)
                    .is_some_and(|held| held.checksum == candidate.checksum)
                {
                    self.pending.remove(&op);
                    self.verified_op = self.verified_op.max(op);
                    op += 1;
                } else {
                    break;
                }
            }
            if !self.pending.contains_key(&op) {
                self.prune_targets();
                continue;
            }
            if self.op >= op && !self.truncate_log(op - 1, actions) {
                self.pending.remove(&op);
                continue;
            }
            if self.op + 1 < op {
                // Cannot happen: op - 1 is held or committed, so the log reaches it.
                return;
            }
            while let Some(entry) = self.pending.remove(&op) {
                let broken = entry.parent != 0
                    && self
                        .log
                        .get(&(op - 1))
                        .is_some_and(|held| held.checksum != entry.parent);
                if broken {
                    break;
                }
                self.append_log(entry, actions);
                self.verified_op = self.verified_op.max(op);
                op += 1;
            }
            self.prune_targets();
        }
    }

    /// The lowest op the in-memory log holds (`op + 1` when it holds none).
    fn log_floor(&self) -> u64 {
        self.log.keys().next().copied().unwrap_or(self.op + 1)
    }

    /// Drops every prepare above `to` from the log and the journal. Refuses (and logs) when
    /// that would drop a committed op.
    pub(super) fn truncate_log(&mut self, to: u64, actions: &mut Vec<Action>) -> bool {
        if to < self.commit_min {
            if !self.fork_warned {
                self.fork_warned = true;
                tracing::error!(
                    to,
                    commit_min = self.commit_min,
                    replica = self.config.replica,
                    "refusing to truncate committed ops"
                );
            }
            return false;
        }
        if to >= self.op {
            return true;
        }
        self.log.split_off(&(to + 1));
        self.op = to;
        self.top_checksum = None;
        self.verified_op = self.verified_op.min(to).max(self.commit_min);
        self.oks.retain(|&op, _| op <= to);
        self.in_flight.retain(|_, op| *op <= to);
        actions.push(Action::TruncateJournal { op: to });
        true
    }

    fn append_log(&mut self, entry: Entry, actions: &mut Vec<Action>) {
        let op = entry.prepare.op;
        debug_assert_eq!(op, self.op + 1, "the log grows by one op at a time");
        actions.push(Action::WriteJournal {
            prepare: entry.prepare.clone(),
        });
        self.log.insert(
            op,
            Entry {
                durable: false,
                ..entry
            },
        );
        self.op = op;
        self.top_checksum = None;
    }

    /// A primary-to-be whose log does not hold its top prepare (a restart from a checkpoint at
    /// `op`, or a state transfer install) asks peers for that committed op's header, at most
    /// once per heartbeat interval: its next prepare names it as parent. Returns whether it must
    /// keep waiting for the answer.
    ///
    /// When the top is committed and applied here (`op == commit_min`) and
    /// [`TOP_ASKS_BEFORE_PARENTLESS`] asks went unanswered (no peer holds it in memory: every
    /// replica restarted or installed at this checkpoint), it goes ahead: its next prepare names
    /// parent 0 ("unknown"). That is safe because the top is committed, so no log can differ at
    /// or below it; backups accept the prepare as linked, truncating any stale suffix above
    /// the top, and a lagging one bridges the gap below with anchors (`anchor_wanted`). Waiting
    /// instead would stop every view change for good.
    pub(super) fn ask_top_checksum(&mut self, actions: &mut Vec<Action>) -> bool {
        if self.top_asks.0 != self.op {
            self.top_asks = (self.op, 0);
        }
        if self.op == self.commit_min && self.top_asks.1 >= TOP_ASKS_BEFORE_PARENTLESS {
            if self.top_asks.1 == TOP_ASKS_BEFORE_PARENTLESS {
                self.top_asks.1 += 1;
                tracing::warn!(
                    replica = self.config.replica,
                    op = self.op,
                    asks = TOP_ASKS_BEFORE_PARENTLESS,
                    "no peer holds the header of the committed top op; the next prepare names \
                     no parent"
                );
            }
            return false;
        }
        if self
            .top_asked
            .is_some_and(|asked| self.now < asked + self.config.heartbeat_ticks)
        {
            return true;
        }
        let attempt = self.top_asked.map_or(0, |asked| asked as u32);
        self.top_asked = Some(self.now);
        self.top_asks.1 += 1;
        actions.push(Action::Send {
            to: self.repair_peer(attempt),
            message: Message::RequestHeaders {
                view: self.view,
                op_min: self.op,
                op_max: self.op,
            },
        });
        true
    }

    /// The peer asked on `attempt` (0-based): the primary (or the chosen log's sender during a
    /// view change) first, then the others in turn.
    fn repair_peer(&self, attempt: u32) -> ReplicaIndex {
        let me = self.config.replica;
        let preferred = match (self.install, self.status) {
            (Some(install), _) if install.source != me => install.source,
            (_, Status::Normal) if self.primary() != me => self.primary(),
            _ => self.peers().next().expect("replica_count > 1 has a peer"),
        };
        let mut order = vec![preferred];
        order.extend(self.peers().filter(|&peer| peer != preferred));
        order[attempt as usize % order.len()]
    }

    /// Targets the log does not match and no pending prepare covers, lowest first.
    fn wanted(&self) -> Vec<(u64, u128)> {
        self.targets
            .iter()
            .filter(|(op, checksum)| {
                **op > self.commit_min
                    && !self.pending.contains_key(op)
                    && self
                        .log
                        .get(op)
                        .is_none_or(|entry| entry.checksum != **checksum)
            })
            .map(|(&op, &checksum)| (op, checksum))
            .take(REPAIR_BATCH)
            .collect()
    }

    /// Sends the first request for every wanted prepare not yet asked for.
    pub(super) fn request_repairs(&mut self, actions: &mut Vec<Action>) {
        if self.config.replica_count == 1 || self.stopped {
            return;
        }
        for (op, checksum) in self.wanted() {
            if self
                .requested
                .get(&op)
                .is_some_and(|requested| requested.checksum == checksum)
            {
                continue;
            }
            self.requested.insert(
                op,
                Requested {
                    checksum,
                    attempts: 0,
                    last_tick: self.now,
                },
            );
            self.send_repair_request(op, checksum, 0, actions);
        }
        if let Some(op) = self.anchor_wanted()
            && !self.requested.contains_key(&op)
        {
            self.requested.insert(
                op,
                Requested {
                    checksum: 0,
                    attempts: 0,
                    last_tick: self.now,
                },
            );
            self.send_repair_request(op, 0, 0, actions);
        }
    }

    /// A committed op this replica needs but knows no checksum for, so no chain to walk down
    /// from: a backup behind `commit_max` whose primary's heartbeat carries no checksum (the
    /// primary released that prepare), or a new primary whose chosen log came without its top
    /// prepare. It asks peers for the headers up to that op (tracked as a request with checksum
    /// 0): a peer answers headers only for ops it committed, and a committed prepare is the
    /// same everywhere, so the answer is an anchor.
    fn anchor_wanted(&self) -> Option<u64> {
        // A pending chain whose lowest prepare names no parent (made by a primary that did not
        // know it) above a gap: the committed ops below need headers to be fetched.
        if let Some((&low, first)) = self.pending.first_key_value() {
            let below = low - 1;
            if first.parent == 0
                && below > self.op
                && below <= self.commit_max
                && !self.targets.contains_key(&below)
            {
                return Some(below);
            }
        }
        match (self.status, self.install) {
            (Status::ViewChange, Some(install))
                if install.checksum.is_none()
                    && install.op > self.op
                    && install.op <= self.commit_max =>
            {
                Some(install.op)
            }
            (Status::Normal, _)
                if self.primary() != self.config.replica
                    && self.commit_max > self.commit_min
                    && self.commit_max > self.verified_op
                    && self.targets.range(self.commit_max..).next().is_none()
                    && !self.pending.contains_key(&self.commit_max) =>
            {
                Some(self.commit_max)
            }
            _ => None,
        }
    }

    /// On a tick: re-sends requests unanswered for a heartbeat interval, to the next peer. A
    /// committed op still missing after `10 * (replica_count - 1)` rounds (ten per peer) is
    /// beyond every peer's retained journal: it starts a state transfer.
    pub(super) fn retry_repairs(&mut self, actions: &mut Vec<Action>) {
        self.forget_answered_requests();
        let interval = self.config.heartbeat_ticks.max(2);
        let due: Vec<(u64, Requested)> = self
            .requested
            .iter()
            .filter(|(_, requested)| self.now >= requested.last_tick + interval)
            .take(REPAIR_BATCH)
            .map(|(&op, &requested)| (op, requested))
            .collect();
        let rounds_before_warning = 10 * u32::from(self.config.replica_count - 1);
        for (op, requested) in due {
            let attempts = requested.attempts + 1;
            self.requested.insert(
                op,
                Requested {
                    attempts,
                    last_tick: self.now,
                    ..requested
                },
            );
            if attempts >= rounds_before_warning && op <= self.commit_max {
                self.repair_exhausted(op, attempts, actions);
            }
            self.send_repair_request(op, requested.checksum, attempts, actions);
        }
        self.request_repairs(actions);
    }

    /// Drops the requests a peer answered whose prepare waits in `pending` for the link below
    /// it: that link is a request of its own; asking again would fetch the same bytes, and
    /// count as a failed round toward state transfer (H5 finding O1: a walk down a long chain
    /// started transfers nobody needed).
    fn forget_answered_requests(&mut self) {
        let pending = &self.pending;
        self.requested.retain(|op, requested| {
            requested.checksum == 0
                || pending
                    .get(op)
                    .is_none_or(|entry| entry.checksum != requested.checksum)
        });
    }

    /// Committed op `op` failed repair for `attempts` rounds: start a state transfer when the
    /// replica is behind (`commit_min < commit_max`) and the receiver may start one (logged
    /// once per gap when it is idle and may not; nothing while a transfer is under way).
    fn repair_exhausted(&mut self, op: u64, attempts: u32, actions: &mut Vec<Action>) {
        if self.commit_min >= self.commit_max {
            return;
        }
        if self.maybe_start_transfer(actions) {
            tracing::warn!(
                op,
                replica = self.config.replica,
                attempts,
                "no peer supplies committed op {op}: starting a state transfer (issue 9); \
                 repair keeps trying"
            );
        } else if self.transfer_stage() == Stage::Idle && !self.state_transfer_warned {
            // Idle yet not started: the budget cools down, or this replica is not a backup in
            // normal status.
            self.state_transfer_warned = true;
            tracing::warn!(
                op,
                replica = self.config.replica,
                attempts,
                "no peer supplies committed op {op}: needs state transfer (issue 9), which \
                 cannot start now (retry budget cooling down, or not a backup in normal status); \
                 repair keeps trying"
            );
        }
    }

    fn send_repair_request(
        &self,
        op: u64,
        checksum: u128,
        attempt: u32,
        actions: &mut Vec<Action>,
    ) {
        let to = self.repair_peer(attempt);
        if checksum == 0 {
            // An anchor: no checksum known for this committed op. Peers answer headers only
            // for ops they committed, so the answer names the committed prepare.
            actions.push(Action::Send {
                to,
                message: Message::RequestHeaders {
                    view: self.view,
                    op_min: (self.commit_min + 1).max(op.saturating_sub(HEADERS_MAX - 1)),
                    op_max: op,
                },
            });
            return;
        }
        actions.push(Action::Send {
            to,
            message: Message::RequestPrepare {
                view: self.view,
                op,
                checksum,
            },
        });
        // A gap beyond the log whose link below is unknown: ask for the headers below too, so
        // the whole chain is known in one round trip instead of one op per round trip.
        let below = op - 1;
        if op > self.op + 1 && below > self.commit_min && !self.targets.contains_key(&below) {
            actions.push(Action::Send {
                to,
                message: Message::RequestHeaders {
                    view: self.view,
                    op_min: (self.commit_min + 1).max(op.saturating_sub(HEADERS_MAX - 1)),
                    op_max: op,
                },
            });
        }
    }

    /// Serves a `RequestPrepare` from memory, or from the journal for an older op
    /// (`ReadJournal`); nothing when the op was released by a checkpoint.
    pub(super) fn on_request_prepare(
        &mut self,
        from: ReplicaIndex,
        op: u64,
        checksum: u128,
        actions: &mut Vec<Action>,
    ) {
        // "Any" prepare (checksum 0) only for an op this replica committed: that one is the
        // same on every replica; an uncommitted one may be a fork.
        if checksum == 0 && op > self.commit_min {
            return;
        }
        let held = self.log.get(&op).or_else(|| self.pending.get(&op));
        if let Some(entry) = held {
            if checksum == 0 || entry.checksum == checksum {
                actions.push(Action::Send {
                    to: from,
                    message: Message::Prepare {
                        prepare: entry.prepare.clone(),
                    },
                });
            }
            return;
        }
        if op == 0 || op < self.journal_first_op || op >= self.log_floor() || op > self.op {
            return;
        }
        let readers = self.reads.entry(op).or_default();
        let first = readers.is_empty();
        if readers.len() < READERS_MAX && !readers.contains(&(from, checksum)) {
            readers.push((from, checksum));
        }
        if first {
            actions.push(Action::ReadJournal { op });
        }
    }

    pub(super) fn on_journal_read(
        &mut self,
        op: u64,
        prepare: Option<storage::journal::Prepare>,
        actions: &mut Vec<Action>,
    ) {
        let readers = self.reads.remove(&op).unwrap_or_default();
        let Some(prepare) = prepare else {
            return;
        };
        if prepare.op != op || prepare.body.len() > storage::limits::JOURNAL_BODY_SIZE_MAX as usize
        {
            return;
        }
        let actual = storage::journal::JournalHeader::for_prepare(&prepare).checksum;
        for (to, checksum) in readers {
            if checksum == 0 || checksum == actual {
                actions.push(Action::Send {
                    to,
                    message: Message::Prepare {
                        prepare: prepare.clone(),
                    },
                });
            }
        }
    }

    /// Serves a `RequestHeaders` from memory with the headers of committed ops (at or below
    /// `commit_min`), ascending, at most [`HEADERS_MAX`].
    pub(super) fn on_request_headers(
        &mut self,
        from: ReplicaIndex,
        op_min: u64,
        op_max: u64,
        actions: &mut Vec<Action>,
    ) {
        // Only committed ops: the requester trusts every header it gets (a committed prepare is
        // the same on every replica, now and later).
        let op_max = op_max.min(self.commit_min);
        if op_min > op_max {
            return;
        }
        let headers: Vec<PrepareHeader> = self
            .log
            .range(op_min..=op_max)
            .take(HEADERS_MAX as usize)
            .map(|(&op, entry)| PrepareHeader {
                op,
                view: entry.prepare.view,
                commit: entry.prepare.commit,
                checksum: entry.checksum,
                parent: entry.parent,
            })
            .collect();
        if headers.is_empty() {
            return;
        }
        actions.push(Action::Send {
            to: from,
            message: Message::Headers {
                view: self.view,
                headers,
            },
        });
    }

    /// Extends the targets down the chain the headers describe, from any target they match.
    /// Headers name committed prepares (a peer sends only those): each becomes a target, and
    /// so does its parent.
    pub(super) fn on_headers(&mut self, headers: &[PrepareHeader], actions: &mut Vec<Action>) {
        for header in headers.iter().rev() {
            if header.op == self.op && !self.log.contains_key(&self.op) {
                self.top_checksum = Some(header.checksum);
            }
            if header.op <= self.commit_min || header.op == 0 {
                continue;
            }
            self.targets.insert(header.op, header.checksum);
            if header.parent != 0 && header.op - 1 > self.commit_min {
                self.targets.insert(header.op - 1, header.parent);
            }
        }
        self.prune_targets();
        self.after_log_change(actions);
    }
}
