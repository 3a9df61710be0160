//! The view change (VSR Revisited section 4.2) and the catch-up of a replica found in an older
//! view (section 4.3 style: the primary answers it with a `StartView`).
//!
//! Every step that names a view is persisted first: a replica sends `StartViewChange` or
//! `DoViewChange` for view `v` only once the superblock holds `v`, and a new primary sends
//! `StartView` only once it holds `log_view = v` (issue 8 section 2: a restarted replica never
//! goes back in view, never votes twice in a view).

use storage::journal::{JournalHeader, Prepare};

use super::{DoViewChange, Entry, Install, Replica};
use crate::vsr::message::{Action, Message, ReplicaIndex, Status};
use crate::vsr::prepare::PrepareBody;

impl Replica {
    /// Moves to `new_view` in status view-change (section 4.2 step 1: a timeout, or a
    /// `StartViewChange`/`DoViewChange` for a higher view). Clients waiting at a deposed primary
    /// are answered `NotPrimary`.
    /// Moves to the view after this one (a primary timeout, a view change that did not
    /// complete, or a restarted primary), unless that would pass [`super::VIEW_MAX`]: then the
    /// replica stays where it is and says so (once per view).
    pub(super) fn start_next_view(&mut self, actions: &mut Vec<Action>) {
        match self
            .view
            .checked_add(1)
            .filter(|&next| next <= super::VIEW_MAX)
        {
            Some(next) => self.start_view_change(next, actions),
            None => {
                if !self.view_max_warned {
                    self.view_max_warned = true;
                    tracing::error!(
                        replica = self.config.replica,
                        view = self.view,
                        "view numbers exhausted: this replica cannot move past view u32::MAX - 1"
                    );
                }
            }
        }
    }

    pub(super) fn start_view_change(&mut self, new_view: u32, actions: &mut Vec<Action>) {
        if self.config.replica_count == 1 {
            return;
        }
        debug_assert!(new_view > self.view || self.status == Status::ViewChange);
        self.view = new_view;
        self.enter_view_change(new_view, actions);
    }

    /// Enters status view-change in `view` (also at open, for a replica whose `log_view` is
    /// behind its view); the `StartViewChange` follows once the superblock holds `view`.
    pub(super) fn enter_view_change(&mut self, view: u32, actions: &mut Vec<Action>) {
        self.view = view;
        self.status = Status::ViewChange;
        self.svc_sent = false;
        self.svc_from.clear();
        self.dvc_sent = false;
        self.dvcs.clear();
        self.install = None;
        self.clear_repair();
        self.verified_op = self.verified_op.min(self.commit_max).max(self.commit_min);
        self.release_clients(actions);
        self.view_change_deadline = self.now + self.random_timeout();
        self.persist(actions);
        self.after_persist(actions);
    }

    /// What the replica may do once the superblock write completed.
    pub(super) fn after_persist(&mut self, actions: &mut Vec<Action>) {
        match self.status {
            Status::ViewChange => {
                if self.superblock_durable.0 < self.view {
                    return;
                }
                if !self.svc_sent {
                    self.svc_sent = true;
                    self.broadcast(&Message::StartViewChange { view: self.view }, actions);
                }
                self.maybe_send_do_view_change(actions);
                self.check_install(actions);
            }
            Status::Normal => {
                if !self.is_primary() {
                    self.send_prepare_oks_above(self.start_view_commit, actions);
                }
            }
        }
    }

    /// Re-sends this replica's view-change messages (every heartbeat while the view change
    /// lasts: the network loses messages).
    pub(super) fn resend_view_change(&mut self, actions: &mut Vec<Action>) {
        if self.svc_sent {
            self.broadcast(&Message::StartViewChange { view: self.view }, actions);
        }
        let primary = self.primary();
        if self.dvc_sent && primary != self.config.replica {
            actions.push(Action::Send {
                to: primary,
                message: self.own_do_view_change_message(),
            });
        }
        if self.install.is_some() {
            self.check_install(actions);
        }
    }

    /// A primary answers a replica found in an older view with a `StartView`, at most once per
    /// heartbeat interval per replica.
    pub(super) fn answer_older_view(&mut self, from: ReplicaIndex, actions: &mut Vec<Action>) {
        if !self.is_primary() {
            return;
        }
        if self
            .start_view_sent
            .get(&from)
            .is_some_and(|&sent| self.now < sent + self.config.heartbeat_ticks)
        {
            return;
        }
        self.start_view_sent.insert(from, self.now);
        actions.push(Action::Send {
            to: from,
            message: self.start_view_message(),
        });
    }

    /// This replica heard the normal-status traffic of view `>= self.view` it is not part of:
    /// it sends the sender a message in its own view, which a primary answers with a
    /// `StartView` (once per tick).
    pub(super) fn ask_for_start_view(&mut self, to: ReplicaIndex, actions: &mut Vec<Action>) {
        if self.start_view_asked == self.now && self.now != 0 {
            return;
        }
        self.start_view_asked = self.now;
        let message = if self.status == Status::ViewChange {
            Message::StartViewChange { view: self.view }
        } else {
            Message::RequestHeaders {
                view: self.view,
                op_min: self.commit_min + 1,
                op_max: self.commit_min + 1,
            }
        };
        actions.push(Action::Send { to, message });
    }

    pub(super) fn on_start_view_change(
        &mut self,
        from: ReplicaIndex,
        view: u32,
        actions: &mut Vec<Action>,
    ) {
        if view < self.view {
            return;
        }
        if view > self.view {
            self.start_view_change(view, actions);
        } else if self.status == Status::Normal {
            if self.is_primary() {
                self.answer_same_view(from, actions);
            }
            return;
        }
        self.svc_from.insert(from);
        self.maybe_send_do_view_change(actions);
    }

    /// A replica still in view change in this primary's view: answer with a `StartView`.
    fn answer_same_view(&mut self, from: ReplicaIndex, actions: &mut Vec<Action>) {
        self.answer_older_view(from, actions);
    }

    pub(super) fn on_do_view_change(
        &mut self,
        from: ReplicaIndex,
        view: u32,
        dvc: DoViewChange,
        actions: &mut Vec<Action>,
    ) {
        if view < self.view || self.primary_of(view) != self.config.replica {
            return;
        }
        if let Err(reason) = check_log_suffix(&dvc.prepares, dvc.op) {
            tracing::warn!(from, view, %reason, "refusing a malformed DoViewChange");
            return;
        }
        if view > self.view {
            self.start_view_change(view, actions);
        } else if self.status == Status::Normal {
            self.answer_same_view(from, actions);
            return;
        }
        // A DoViewChange implies its sender's StartViewChange.
        self.svc_from.insert(from);
        self.dvcs.entry(from).or_insert(dvc);
        self.maybe_send_do_view_change(actions);
        self.check_do_view_change_quorum(actions);
    }

    /// Section 4.2 step 2: with `f` StartViewChanges from others (plus its own), once per view,
    /// the replica sends its log to the new primary (the new primary records its own).
    fn maybe_send_do_view_change(&mut self, actions: &mut Vec<Action>) {
        if self.status != Status::ViewChange
            || self.dvc_sent
            || self.superblock_durable.0 < self.view
            || self.svc_from.len() + 1 < self.quorum
        {
            return;
        }
        // A DoViewChange claims "my log holds every prepare I acknowledged up to log_view"
        // (VSR Revisited 4.2 step 3: every committed op is in at least one DVC of the quorum;
        // 4.3: a replica that lost state it may have acknowledged takes no part in a view
        // change until it has recovered it). Recovery cut this log at a damaged record, so
        // prepares above it that this replica may have PrepareOk'd are gone: counting this DVC
        // in a quorum could drop a committed op (seed 1547). Stay out until the log reaches
        // the lost op again in that log_view, or a newer view is installed (its StartView came
        // from a quorum that did not need this replica).
        if let Some((log_view, op)) = self.lost_acked {
            if self.log_view == log_view && self.op < op {
                tracing::debug!(
                    replica = self.config.replica,
                    view = self.view,
                    lost_op = op,
                    "not sending a DoViewChange: recovery lost journal records it may have acked"
                );
                return;
            }
            self.lost_acked = None;
        }
        self.dvc_sent = true;
        if self.primary() == self.config.replica {
            let own = self.own_do_view_change();
            self.dvcs.insert(self.config.replica, own);
            self.check_do_view_change_quorum(actions);
        } else {
            actions.push(Action::Send {
                to: self.primary(),
                message: self.own_do_view_change_message(),
            });
        }
    }

    /// This replica's log for a DoViewChange: its top prepares, at most a pipeline's worth.
    fn own_do_view_change(&self) -> DoViewChange {
        let low = self.op.saturating_sub(self.config.pipeline_max as u64) + 1;
        DoViewChange {
            log_view: self.log_view,
            op: self.op,
            commit: self.commit_max,
            prepares: self
                .log
                .range(low..)
                .map(|(_, entry)| entry.prepare.clone())
                .collect(),
        }
    }

    fn own_do_view_change_message(&self) -> Message {
        let own = self.own_do_view_change();
        Message::DoViewChange {
            view: self.view,
            log_view: own.log_view,
            op: own.op,
            commit: own.commit,
            prepares: own.prepares,
        }
    }

    fn check_do_view_change_quorum(&mut self, actions: &mut Vec<Action>) {
        if self.install.is_some()
            || !self.dvcs.contains_key(&self.config.replica)
            || self.dvcs.len() < self.quorum
        {
            return;
        }
        self.begin_install(actions);
    }

    /// Section 4.2 step 3: the new primary chooses the log with the highest `(log_view, op)`
    /// (its own on a tie), takes the highest commit number, and installs the chosen log: the
    /// prepares the chosen DVC carried, then repairs of any op below them it lacks.
    fn begin_install(&mut self, actions: &mut Vec<Action>) {
        let me = self.config.replica;
        let (source, best) = self
            .dvcs
            .iter()
            .max_by_key(|(replica, dvc)| (dvc.log_view, dvc.op, **replica == me))
            .map(|(&replica, dvc)| (replica, dvc.clone()))
            .expect("a quorum of DoViewChanges is not empty");
        let commit = self
            .dvcs
            .values()
            .map(|dvc| dvc.commit)
            .max()
            .unwrap_or(0)
            .max(self.commit_max);
        if best.op < commit {
            // Every committed op is in the chosen log (quorum intersection); a chosen log
            // shorter than the commit number means a DoViewChange lied about its log. Never
            // prepare at a committed op: let this view time out.
            tracing::error!(
                replica = me,
                view = self.view,
                chosen = source,
                op = best.op,
                commit,
                "the chosen log ends below the commit number; not starting this view"
            );
            return;
        }
        self.commit_max = commit;
        let checksum = if source == me {
            self.log.get(&best.op).map(|entry| entry.checksum)
        } else {
            best.prepares
                .last()
                .filter(|prepare| prepare.op == best.op)
                .map(|prepare| JournalHeader::for_prepare(prepare).checksum)
        };
        tracing::info!(
            replica = me,
            view = self.view,
            chosen = source,
            chosen_log_view = best.log_view,
            op = best.op,
            commit,
            "view change: installing the chosen log"
        );
        self.install = Some(Install {
            op: best.op,
            checksum,
            source,
        });
        if source != me {
            for prepare in best.prepares {
                if let Ok(entry) = Entry::new(prepare) {
                    self.accept_verified(entry, actions);
                }
            }
        }
        self.after_log_change(actions);
        self.request_repairs(actions);
    }

    /// The new primary: once the chosen log is installed, persist `log_view = view`; once that
    /// is durable, become primary.
    pub(super) fn check_install(&mut self, actions: &mut Vec<Action>) {
        let Some(install) = self.install else {
            return;
        };
        if self.status != Status::ViewChange || self.primary() != self.config.replica {
            return;
        }
        if self.log_view == self.view {
            if self.superblock_durable >= (self.view, self.view) {
                self.become_primary(actions);
            }
            return;
        }
        if !self.pending.is_empty() || self.has_unsatisfied_targets() {
            return;
        }
        if self.op > install.op && !self.truncate_log(install.op, actions) {
            return;
        }
        if self.op < install.op {
            if install.checksum.is_none() && !self.state_transfer_warned {
                self.state_transfer_warned = true;
                tracing::warn!(
                    op = install.op,
                    replica = self.config.replica,
                    view = self.view,
                    "the chosen log ends at an op whose prepare no peer sent: needs state \
                     transfer (issue 9); waiting for the next view"
                );
            }
            return;
        }
        if let Some(checksum) = install.checksum
            && self
                .log
                .get(&self.op)
                .is_none_or(|entry| entry.checksum != checksum)
        {
            return;
        }
        // log_view = view promises the journal holds this log: a crash must not leave an older
        // prepare under it (a truncate-and-rewrite not yet durable).
        if !self.durable_through(self.op) {
            return;
        }
        // The next prepare names its parent: learn the top prepare's checksum first.
        if self.op > 0
            && !self.log.contains_key(&self.op)
            && self.top_checksum.is_none()
            && self.ask_top_checksum(actions)
        {
            return;
        }
        self.verified_op = self.op;
        self.log_view = self.view;
        self.persist(actions);
    }

    /// Section 4.2 step 4: status normal, `StartView` to every backup, PrepareOks re-collected
    /// for the ops above the commit number.
    fn become_primary(&mut self, actions: &mut Vec<Action>) {
        self.status = Status::Normal;
        self.install = None;
        self.dvcs.clear();
        self.clear_repair();
        self.verified_op = self.op;
        self.oks.clear();
        for (&op, entry) in self.log.range(self.commit_max + 1..) {
            let mut oks = std::collections::BTreeSet::new();
            if entry.durable {
                oks.insert(self.config.replica);
            }
            self.oks.insert(op, oks);
        }
        self.in_flight.clear();
        for (&op, entry) in self.log.range(self.commit_min + 1..) {
            if let Ok(body) = PrepareBody::decode(&entry.prepare.body)
                && let Ok(client) = body.client_id()
            {
                let request = match body.operation {
                    crate::vsr::prepare::PrepareOperation::Register => 0,
                    crate::vsr::prepare::PrepareOperation::Metadata(_) => body.request,
                };
                self.in_flight.insert((client, request), op);
            }
        }
        self.start_view_sent.clear();
        self.heartbeat_due = self.now + self.config.heartbeat_ticks;
        tracing::info!(
            replica = self.config.replica,
            view = self.view,
            op = self.op,
            commit = self.commit_max,
            "view change complete: primary"
        );
        let start_view = self.start_view_message();
        self.broadcast(&start_view, actions);
        self.send_commit_heartbeat(actions);
        self.advance_commit(actions);
    }

    /// The primary's `StartView`: its op, commit number and top prepares above the commit
    /// number (at most a pipeline's worth; a backup repairs anything below).
    fn start_view_message(&self) -> Message {
        let low =
            (self.commit_max + 1).max(self.op.saturating_sub(self.config.pipeline_max as u64) + 1);
        let prepares = if low > self.op {
            Vec::new()
        } else {
            self.log
                .range(low..=self.op)
                .map(|(_, entry)| entry.prepare.clone())
                .collect()
        };
        Message::StartView {
            view: self.view,
            op: self.op,
            commit: self.commit_max,
            prepares,
        }
    }

    /// A backup that adopted a StartView takes `log_view = view` once its log is verified up to
    /// the StartView's op (the prepares it sent connect by the parent chain to what the backup
    /// holds, repaired where needed), and persists it before acknowledging anything.
    pub(super) fn check_view_installed(&mut self, actions: &mut Vec<Action>) {
        if self.status != Status::Normal
            || self.primary() == self.config.replica
            || self.log_view == self.view
            || self.op < self.start_view_op
            || self.verified_op < self.start_view_op
            || !self.durable_through(self.start_view_op)
        {
            return;
        }
        self.log_view = self.view;
        tracing::info!(
            replica = self.config.replica,
            view = self.view,
            op = self.op,
            "log installed up to the StartView's op"
        );
        self.persist(actions);
    }

    /// Section 4.2 step 5 (and 4.3 for a lagging replica): a backup adopts the view, truncates
    /// what the new primary's log does not hold, installs the prepares sent, repairs the rest,
    /// and PrepareOks every uncommitted op once the superblock holds the view.
    pub(super) fn on_start_view(
        &mut self,
        from: ReplicaIndex,
        view: u32,
        op: u64,
        commit: u64,
        prepares: Vec<Prepare>,
        actions: &mut Vec<Action>,
    ) {
        if view < self.view || from != self.primary_of(view) {
            return;
        }
        if let Err(reason) = check_log_suffix(&prepares, op) {
            tracing::warn!(from, view, %reason, "refusing a malformed StartView");
            return;
        }
        let already = view == self.view && self.status == Status::Normal;
        if !already {
            self.view = view;
            self.status = Status::Normal;
            self.svc_sent = false;
            self.svc_from.clear();
            self.dvc_sent = false;
            self.dvcs.clear();
            self.install = None;
            self.clear_repair();
            self.release_clients(actions);
            self.verified_op = self.verified_op.min(self.commit_max).max(self.commit_min);
            if self.op > op {
                self.truncate_log(op, actions);
            }
            self.start_view_commit = commit;
            self.start_view_op = op;
            self.persist(actions);
            tracing::info!(
                replica = self.config.replica,
                view,
                op,
                commit,
                "started view as backup"
            );
            self.retarget_transfer(actions);
        }
        self.reset_primary_deadline();
        self.commit_max = self.commit_max.max(commit);
        for prepare in prepares {
            if let Ok(entry) = Entry::new(prepare) {
                self.accept_verified(entry, actions);
            }
        }
        self.after_log_change(actions);
        self.send_prepare_oks_above(commit, actions);
    }
}

/// A DVC's or StartView's prepares: ascending, contiguous, each decodable, the last at `op`.
fn check_log_suffix(prepares: &[Prepare], op: u64) -> Result<(), String> {
    if prepares.windows(2).any(|pair| pair[1].op != pair[0].op + 1) {
        return Err("prepares are not ascending and contiguous".to_owned());
    }
    if let Some(last) = prepares.last()
        && last.op != op
    {
        return Err(format!("last prepare is op {}, not op {op}", last.op));
    }
    for prepare in prepares {
        Entry::new(prepare.clone())?;
    }
    Ok(())
}
