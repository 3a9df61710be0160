//! State transfer, the core's side (issue 9 section 4, DESIGN section 10): a replica whose gap
//! lies below every peer's retained journal fetches the primary's checkpoint through its
//! [`Receiver`], checks it restorable, has the driver install it, adopts it, and repairs the
//! tail above it from peers.
//!
//! Rules kept here:
//! - Trigger: a committed op no peer supplied for the repair rounds (`replica/repair.rs`), the
//!   replica behind (`commit_min < commit_max`), a backup in normal status: it asks the
//!   primary of its view (only a primary serves).
//! - Two-phase restore: every part of the fetched state is decoded and checked first
//!   ([`crate::vsr::snapshot::check_restorable`], the same checks as boot); a refusal is a
//!   failed round and mutates nothing. Only a backup in normal status installs: its view cannot
//!   move while the install runs, and it holds no client waiting on its log.
//! - While `Installing`: nothing is applied, checkpointed or journaled; only reads that are safe
//!   (repair requests served from memory or the journal) are answered, everything else is
//!   dropped (peers re-send, repair fetches the rest after).
//! - After the install: the journal holds nothing at or below `checkpoint_op` and nothing of
//!   the old suffix above it (the driver restarted it empty), so the log restarts empty at
//!   `op = commit_min = checkpoint_op`. If the old log reached above `checkpoint_op`, the replica
//!   may have acknowledged prepares it just dropped: it sends no DoViewChange until its log is
//!   back up to that op (`lost_acked`, the rule of sim finding F10: VSR Revisited 4.2 step 3 and
//!   4.3). Like F10's, that mark lives in memory: a crash before the log is back up to the op
//!   forgets it (the restarted journal shows nothing of the dropped suffix). The window is
//!   narrow: a backup acknowledges only verified prepares, and one that held verified, durable
//!   prepares above its commit point would apply them instead of needing a transfer, so the
//!   dropped suffix is normally unverified (a fork, or ops of an older log_view).

use std::sync::Arc;

use super::Replica;
use crate::metadata::MetadataState;
use crate::vsr::client_table::{ClientTable, ClientTableSnapshot};
use crate::vsr::message::{Action, Completion, Message, ReplicaIndex, Status};
use crate::vsr::snapshot;
use crate::vsr::transfer::client_table_wire;
use crate::vsr::transfer::receiver::{
    ReceiverStep, RoundFailure, Stage, TransferCounters, VerifiedCheckpoint,
};
use crate::vsr::transfer::{ArtifactKind, TransferTarget};

/// A checkpoint checked restorable, waiting for (or in) the driver's install.
#[derive(Debug)]
pub(super) struct PendingInstall {
    checkpoint_op: u64,
    metadata: Arc<MetadataState>,
    client_table: ClientTable,
    /// The snapshot the `InstallCheckpoint` action carries; taken when the action is emitted
    /// (it waits for a checkpoint in progress to finish first: the driver must not have an
    /// older snapshot written over the installed one).
    snapshot: Option<ClientTableSnapshot>,
}

impl Replica {
    /// The state transfer receiver's stage.
    pub fn transfer_stage(&self) -> Stage {
        self.receiver.stage()
    }

    /// The state transfer receiver's counters (attempts started, installs, degraded installs,
    /// failed rounds, spent budgets).
    pub fn transfer_counters(&self) -> TransferCounters {
        self.receiver.counters()
    }

    /// Whether a transferred checkpoint is being installed (nothing may apply, checkpoint or
    /// journal until it completes).
    pub(super) fn installing(&self) -> bool {
        self.receiver.stage() == Stage::Installing
    }

    /// A new view began (this replica a backup in it): a transfer request still waiting for the
    /// previous primary's answer goes to the new primary now (adversarial finding: the receiver
    /// waited out the 5 s target timeout on a killed primary after the view change).
    pub(super) fn retarget_transfer(&mut self, actions: &mut Vec<Action>) {
        let new_primary = self.primary();
        if self.receiver.peer().is_some_and(|peer| peer != new_primary) && self.receiver.retarget()
        {
            tracing::info!(
                replica = self.config.replica,
                view = self.view,
                primary = new_primary,
                "state transfer: a new view began before the request was answered; asking its \
                 primary"
            );
            self.maybe_start_transfer(actions);
        }
    }

    /// Starts a state transfer if the receiver may (idle, not cooling down) and this replica is
    /// a backup in normal status: it asks the primary of its view (only a primary serves, issue 9
    /// section 3). In a view change it waits: it could not install then (see
    /// `installable`), and a replica cut off from its peers, the usual reason repair
    /// fails during a view change, would only spend its budget on requests nobody gets. Returns
    /// whether it started.
    pub(super) fn maybe_start_transfer(&mut self, actions: &mut Vec<Action>) -> bool {
        if self.installable().is_err() || !self.receiver.can_start(self.now) {
            return false;
        }
        let nonce = self.next_random().max(1);
        let to = self.primary();
        let message = self.receiver.start(nonce, to, self.view, self.now);
        tracing::info!(
            replica = self.config.replica,
            to,
            nonce = format_args!("{nonce:#x}"),
            commit_min = self.commit_min,
            commit_max = self.commit_max,
            "state transfer: asking the primary for its checkpoint"
        );
        actions.push(Action::Send { to, message });
        true
    }

    /// A `StateTransferTarget` from `from` (any view: the nonce names the attempt).
    pub(super) fn on_transfer_target(
        &mut self,
        from: ReplicaIndex,
        nonce: u64,
        target: TransferTarget,
        actions: &mut Vec<Action>,
    ) {
        let step = self
            .receiver
            .on_target(from, nonce, target, self.commit_min, self.now);
        self.follow_transfer_step(step, actions);
    }

    /// A `StateChunk` from `from` (any view: the nonce names the attempt).
    pub(super) fn on_transfer_chunk(
        &mut self,
        from: ReplicaIndex,
        nonce: u64,
        artifact: ArtifactKind,
        offset: u64,
        payload: &[u8],
        actions: &mut Vec<Action>,
    ) {
        let step = self
            .receiver
            .on_chunk(from, nonce, artifact, offset, payload, self.now);
        self.follow_transfer_step(step, actions);
    }

    /// One tick of the receiver's timeouts.
    pub(super) fn tick_transfer(&mut self, actions: &mut Vec<Action>) {
        let step = self.receiver.on_tick(self.now);
        self.follow_transfer_step(step, actions);
    }

    fn follow_transfer_step(&mut self, step: ReceiverStep, actions: &mut Vec<Action>) {
        match step {
            ReceiverStep::Wait => {}
            ReceiverStep::Send(request) => actions.push(Action::Send {
                to: request.to,
                message: request.message(self.view),
            }),
            ReceiverStep::Verified(verified) => self.restore_verified(&verified, actions),
            ReceiverStep::NotUseful { checkpoint_op } => tracing::info!(
                replica = self.config.replica,
                checkpoint_op,
                commit_min = self.commit_min,
                "state transfer: the offered checkpoint is not above what this replica applied; \
                 repair continues"
            ),
            ReceiverStep::Failed {
                failure,
                exhausted,
                retry,
            } => {
                self.log_failed_round(&failure, exhausted);
                if let Some(request) = retry {
                    actions.push(Action::Send {
                        to: request.to,
                        message: request.message(self.view),
                    });
                }
            }
        }
    }

    fn log_failed_round(&self, failure: &RoundFailure, exhausted: bool) {
        if exhausted {
            tracing::warn!(
                replica = self.config.replica,
                %failure,
                cooldown_ticks = crate::vsr::transfer::receiver::TRANSFER_COOLDOWN_TICKS,
                "state transfer: retry budget spent; falling back to journal repair until the \
                 cool-down passes"
            );
        } else {
            tracing::warn!(
                replica = self.config.replica,
                %failure,
                failed_rounds = self.receiver.failed_rounds(),
                "state transfer: round failed"
            );
        }
    }

    /// Phase one of the restore: checks the verified artifacts; on success asks the driver to
    /// install them (stage `Installing`), otherwise fails the round. Mutates nothing else.
    fn restore_verified(&mut self, verified: &VerifiedCheckpoint, actions: &mut Vec<Action>) {
        let checkpoint_op = verified.checkpoint_op;
        // Apart from the "fetched and checked" line: the restore check below decodes every
        // session, which on a large client table takes longer than moving the chunks.
        tracing::info!(
            replica = self.config.replica,
            checkpoint_op,
            bytes = verified.metadata.len() + verified.client_table.len(),
            "state transfer: every chunk fetched and verified; checking the checkpoint restorable"
        );
        if checkpoint_op <= self.commit_min {
            // Repair caught up while the chunks came: nothing to install, nothing failed.
            self.receiver.abandon(self.now);
            return;
        }
        let checked = self
            .installable()
            .and_then(|()| self.check_restorable(verified));
        match checked {
            Ok(pending) => {
                tracing::info!(
                    replica = self.config.replica,
                    checkpoint_op,
                    commit_min = self.commit_min,
                    op = self.op,
                    "state transfer: checkpoint fetched and checked; installing"
                );
                self.receiver.begin_install();
                self.transfer_install = Some(pending);
                self.emit_install(actions);
            }
            Err(failure) => {
                let step = self.receiver.restore_refused(failure, self.now);
                self.follow_transfer_step(step, actions);
            }
        }
    }

    /// Whether this replica may install now: a backup in normal status (a primary's log is its
    /// view's and clients wait on it; a view change may still count this replica's log).
    fn installable(&self) -> Result<(), RoundFailure> {
        if self.status != Status::Normal {
            return Err(RoundFailure::NotInstallable {
                reason: "a view change is under way",
            });
        }
        if self.primary() == self.config.replica {
            return Err(RoundFailure::NotInstallable {
                reason: "this replica is the primary",
            });
        }
        Ok(())
    }

    /// Decodes and checks every part of the fetched state (issue 9 section 4: two-phase
    /// restore): the metadata (version, rules, not past the checkpoint), the client table (the
    /// wire rules for this replica's `--clients-table-max`, then the live table's rules) and its
    /// sessions (none committed past the checkpoint). The checks are boot's
    /// ([`snapshot::check_restorable`]).
    fn check_restorable(
        &self,
        verified: &VerifiedCheckpoint,
    ) -> Result<PendingInstall, RoundFailure> {
        let refused = |reason: String| RoundFailure::RestoreRefused { reason };
        let metadata: MetadataState = serde_json::from_slice(&verified.metadata)
            .map_err(|error| refused(format!("metadata artifact does not decode: {error}")))?;
        let clients_max = self.config.clients_table_max;
        let table_snapshot = client_table_wire::decode(&verified.client_table, clients_max)
            .map_err(|error| refused(error.to_string()))?;
        let (client_table, evicted) = snapshot::check_restorable(
            verified.checkpoint_op,
            &metadata,
            &table_snapshot,
            clients_max,
        )
        .map_err(|error| refused(error.to_string()))?;
        if !evicted.is_empty() {
            // The wire decoder refuses more sessions than the table holds.
            return Err(refused(format!(
                "client table holds {} sessions more than --clients-table-max",
                evicted.len()
            )));
        }
        Ok(PendingInstall {
            checkpoint_op: verified.checkpoint_op,
            metadata: Arc::new(metadata),
            client_table,
            snapshot: Some(table_snapshot),
        })
    }

    /// Emits the `InstallCheckpoint` of the pending install once no checkpoint is in progress.
    fn emit_install(&mut self, actions: &mut Vec<Action>) {
        if self.checkpoint_in_progress.is_some() {
            return;
        }
        let Some(pending) = self.transfer_install.as_mut() else {
            return;
        };
        let Some(client_table) = pending.snapshot.take() else {
            return;
        };
        actions.push(Action::InstallCheckpoint {
            checkpoint_op: pending.checkpoint_op,
            metadata: Arc::clone(&pending.metadata),
            client_table,
        });
    }

    /// A message while `Installing`: repair requests are served (they read memory or the
    /// journal, and write nothing); the rest is dropped, peers re-send it.
    pub(super) fn on_message_while_installing(
        &mut self,
        from: ReplicaIndex,
        message: &Message,
        actions: &mut Vec<Action>,
    ) {
        match *message {
            Message::RequestPrepare { op, checksum, .. } => {
                self.on_request_prepare(from, op, checksum, actions);
            }
            Message::RequestHeaders { op_min, op_max, .. } => {
                self.on_request_headers(from, op_min, op_max, actions);
            }
            _ => {}
        }
    }

    /// A completion while `Installing`: the install's outcome, or what must still be recorded
    /// (durable writes, superblock, checkpoints, journal reads served, a journal failure).
    pub(super) fn on_io_done_while_installing(
        &mut self,
        completion: Completion,
        actions: &mut Vec<Action>,
    ) {
        match completion {
            Completion::CheckpointInstalled {
                checkpoint_op,
                degraded,
            } => self.on_checkpoint_installed(checkpoint_op, degraded, actions),
            Completion::InstallFailed {
                checkpoint_op,
                reason,
            } => self.on_install_failed(checkpoint_op, reason, actions),
            Completion::JournalWritten { op, checksum } => {
                // Recorded only (the install may fail and the log be kept); acknowledgements
                // and applies wait.
                if let Some(entry) = self.log.get_mut(&op)
                    && entry.checksum == checksum
                {
                    entry.durable = true;
                }
            }
            Completion::JournalTruncated { .. } => {}
            Completion::JournalRead { op, prepare } => self.on_journal_read(op, prepare, actions),
            Completion::JournalFailed {
                op,
                retryable,
                reason,
            } => self.on_journal_failed(op, retryable, &reason, actions),
            Completion::SuperblockWritten { view, log_view } => {
                self.superblock_durable = self.superblock_durable.max((view, log_view));
            }
            Completion::CheckpointDone {
                op,
                journal_first_op,
            } => {
                self.on_checkpoint_done(op, journal_first_op, actions);
                self.emit_install(actions);
            }
            Completion::CheckpointFailed { op } => {
                self.on_checkpoint_failed(op);
                self.emit_install(actions);
            }
        }
    }

    /// Phase two: the driver made the checkpoint durable and restarted the journal empty above
    /// it; the core adopts it (see the module docs) and repairs the tail.
    fn on_checkpoint_installed(
        &mut self,
        checkpoint_op: u64,
        degraded: bool,
        actions: &mut Vec<Action>,
    ) {
        let pending = self.transfer_install.take();
        let Some(pending) = pending.filter(|pending| pending.checkpoint_op == checkpoint_op) else {
            panic!(
                "replica {}: CheckpointInstalled at op {checkpoint_op} is not the install asked \
                 for",
                self.config.replica
            );
        };
        let old_op = self.op;
        self.adopt_checkpoint(pending);
        if old_op > checkpoint_op {
            self.remember_lost_acked(old_op);
        }
        self.receiver.installed(degraded);
        if degraded {
            tracing::warn!(
                replica = self.config.replica,
                checkpoint_op,
                "state transfer: checkpoint installed, but the superblock pairing write failed \
                 (degraded); the next checkpoint repairs the pairing"
            );
        }
        tracing::info!(
            replica = self.config.replica,
            checkpoint_op,
            dropped_above = old_op.saturating_sub(checkpoint_op),
            commit_max = self.commit_max,
            "state transfer: checkpoint installed; repairing the tail above it"
        );
        self.resume_after_install(actions);
    }

    /// After the install window (installed or failed): the primary timeout starts afresh (the
    /// replica heard nothing while it was closed, which says nothing of the primary: a
    /// view change for that would disturb the whole cluster), then what waited runs.
    fn resume_after_install(&mut self, actions: &mut Vec<Action>) {
        self.reset_primary_deadline();
        self.after_persist(actions);
        self.after_log_change(actions);
    }

    /// Makes the installed checkpoint the replica's state: state machine and client table,
    /// `commit_min = checkpoint_op = op`, journal floor above it, an empty log, repair state
    /// at or below it pruned.
    fn adopt_checkpoint(&mut self, pending: PendingInstall) {
        let checkpoint_op = pending.checkpoint_op;
        self.metadata = pending.metadata;
        self.client_table = pending.client_table;
        self.commit_min = checkpoint_op;
        self.checkpoint_op = checkpoint_op;
        self.journal_first_op = checkpoint_op + 1;
        self.commit_max = self.commit_max.max(checkpoint_op);
        // The driver's pairing recorded at least this op as committed.
        self.superblock_commit = self.superblock_commit.max(checkpoint_op);
        self.op = checkpoint_op;
        self.verified_op = checkpoint_op;
        self.log.clear();
        // The chain anchor (the checksum of the prepare at checkpoint_op) comes from peers
        // (`ask_top_checksum`, or the parent of the first repaired prepare).
        self.top_checksum = None;
        self.top_asked = None;
        self.oks.clear();
        self.in_flight.clear();
        self.journal_retry_from = None;
        let above = checkpoint_op + 1;
        self.targets = self.targets.split_off(&above);
        self.pending = self.pending.split_off(&above);
        self.requested = self.requested.split_off(&above);
        self.reads = self.reads.split_off(&above);
        self.state_transfer_warned = false;
    }

    /// The dropped log reached `old_op`: prepares up to it may have been acknowledged, so no
    /// DoViewChange until the log is back up to it in this log_view (F10's rule).
    fn remember_lost_acked(&mut self, old_op: u64) {
        let lost_op = match self.lost_acked {
            Some((log_view, op)) if log_view == self.log_view => op.max(old_op),
            _ => old_op,
        };
        self.lost_acked = Some((self.log_view, lost_op));
    }

    /// The driver's install failed and changed nothing durable: a failed round; the replica
    /// goes on from the state and log it kept.
    fn on_install_failed(&mut self, checkpoint_op: u64, reason: String, actions: &mut Vec<Action>) {
        self.transfer_install = None;
        tracing::warn!(
            replica = self.config.replica,
            checkpoint_op,
            %reason,
            "state transfer: install failed; the previous checkpoint and journal stay"
        );
        let step = self.receiver.install_failed(reason, self.now);
        self.follow_transfer_step(step, actions);
        self.resume_after_install(actions);
    }
}
