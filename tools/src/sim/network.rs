//! The simulated network: every packet between two nodes (replicas `0..replica_count`, then the
//! clients) gets a random delay in ticks, so packets overtake each other (reorder); it may be
//! lost or duplicated; and links between replicas can be cut by a partition, in one or both
//! directions. Every choice draws from the run's [`Prng`].
//!
//! It knows nothing of what packets hold and never delivers a packet twice unless it duplicated
//! it. A partition is checked at delivery, so packets already in flight across a new cut are lost
//! too.

use std::collections::BTreeMap;

use super::prng::Prng;

/// Index of a node: replicas first (`0..replica_count`), then clients.
pub type NodeIndex = usize;

/// The fault probabilities and delay bounds of the links.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkFaults {
    /// Probability that a packet is lost, 0..=1.
    pub packet_loss: f64,
    /// Probability that a packet is delivered twice (each copy with its own delay), 0..=1.
    pub packet_duplicate: f64,
    /// Fewest ticks a packet takes (>= 1: nothing arrives in the tick it was sent).
    pub delay_ticks_min: u64,
    /// Most ticks a packet takes.
    pub delay_ticks_max: u64,
}

/// Which direction of a replica's links a partition cuts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionKind {
    /// Nothing crosses between the isolated replicas and the others.
    Symmetric,
    /// The isolated replicas hear the others but are not heard (asymmetric).
    OutgoingCut,
    /// The isolated replicas are heard but hear nothing (asymmetric).
    IncomingCut,
}

/// One packet in flight.
#[derive(Debug, Clone, PartialEq)]
pub struct Packet<P> {
    pub from: NodeIndex,
    pub to: NodeIndex,
    pub payload: P,
}

/// What [`Network::send`] did with a packet (for the trace).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOutcome {
    Lost,
    Queued { copies: u8 },
}

/// Packets in flight, ordered by delivery tick then send order (so delivery is deterministic).
#[derive(Debug)]
pub struct Network<P> {
    replica_count: usize,
    faults: LinkFaults,
    in_flight: BTreeMap<(u64, u64), Packet<P>>,
    send_count: u64,
    /// `cut[from][to]`: the replica link from `from` to `to` drops every packet.
    cut: Vec<Vec<bool>>,
}

impl<P: Clone> Network<P> {
    /// A healed network between `replica_count` replicas (and any number of clients).
    ///
    /// # Panics
    /// If `delay_ticks_min` is 0 or above `delay_ticks_max`.
    pub fn new(replica_count: usize, faults: LinkFaults) -> Network<P> {
        assert!(
            faults.delay_ticks_min >= 1 && faults.delay_ticks_min <= faults.delay_ticks_max,
            "delay range {}..={}",
            faults.delay_ticks_min,
            faults.delay_ticks_max
        );
        Network {
            replica_count,
            faults,
            in_flight: BTreeMap::new(),
            send_count: 0,
            cut: vec![vec![false; replica_count]; replica_count],
        }
    }

    pub fn faults(&self) -> LinkFaults {
        self.faults
    }

    /// Replaces the fault probabilities (the liveness phase sets them to zero).
    pub fn set_faults(&mut self, faults: LinkFaults) {
        self.faults = faults;
    }

    /// Sends `payload` from `from` to `to` at tick `now`: lost with `packet_loss`, else queued
    /// with a random delay, and with `packet_duplicate` queued a second time.
    pub fn send(
        &mut self,
        prng: &mut Prng,
        now: u64,
        from: NodeIndex,
        to: NodeIndex,
        payload: P,
    ) -> SendOutcome {
        if prng.chance(self.faults.packet_loss) {
            return SendOutcome::Lost;
        }
        let copies = if prng.chance(self.faults.packet_duplicate) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay =
                prng.range_inclusive(self.faults.delay_ticks_min, self.faults.delay_ticks_max);
            self.send_count += 1;
            self.in_flight.insert(
                (now + delay, self.send_count),
                Packet {
                    from,
                    to,
                    payload: payload.clone(),
                },
            );
        }
        SendOutcome::Queued { copies }
    }

    /// Takes every packet due at or before `now`, in delivery order, dropping those whose link
    /// is cut now.
    pub fn deliver_due(&mut self, now: u64) -> Vec<Packet<P>> {
        let later = self.in_flight.split_off(&(now + 1, 0));
        let due = std::mem::replace(&mut self.in_flight, later);
        due.into_values()
            .filter(|packet| !self.is_cut(packet.from, packet.to))
            .collect()
    }

    /// Whether the link from `from` to `to` drops packets now (only replica links are ever cut).
    pub fn is_cut(&self, from: NodeIndex, to: NodeIndex) -> bool {
        from < self.replica_count && to < self.replica_count && self.cut[from][to]
    }

    /// Cuts the links between `isolated` replicas and the others, in the directions `kind`
    /// names (links among the isolated stay up).
    pub fn partition(&mut self, isolated: &[NodeIndex], kind: PartitionKind) {
        for from in 0..self.replica_count {
            for to in 0..self.replica_count {
                let from_isolated = isolated.contains(&from);
                let to_isolated = isolated.contains(&to);
                if from_isolated == to_isolated {
                    continue;
                }
                let cut = match kind {
                    PartitionKind::Symmetric => true,
                    PartitionKind::OutgoingCut => from_isolated,
                    PartitionKind::IncomingCut => to_isolated,
                };
                if cut {
                    self.cut[from][to] = true;
                }
            }
        }
    }

    /// Restores every replica link.
    pub fn heal(&mut self) {
        for row in &mut self.cut {
            row.fill(false);
        }
    }

    /// Whether any link is cut.
    pub fn is_partitioned(&self) -> bool {
        self.cut.iter().flatten().any(|&cut| cut)
    }

    /// Packets in flight.
    pub fn in_flight_count(&self) -> usize {
        self.in_flight.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn faults(packet_loss: f64, packet_duplicate: f64) -> LinkFaults {
        LinkFaults {
            packet_loss,
            packet_duplicate,
            delay_ticks_min: 1,
            delay_ticks_max: 5,
        }
    }

    #[test]
    fn delivers_every_packet_once_within_the_delay_bound_and_reorders() {
        let mut prng = Prng::new(3);
        let mut network = Network::new(3, faults(0.0, 0.0));
        for value in 0..100u32 {
            network.send(&mut prng, 0, 0, 1, value);
        }
        assert!(network.deliver_due(0).is_empty(), "nothing arrives at once");
        let delivered: Vec<u32> = (1..=5)
            .flat_map(|tick| network.deliver_due(tick))
            .map(|packet| packet.payload)
            .collect();
        let mut sorted = delivered.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
        assert_ne!(delivered, sorted, "random delays reorder packets");
        assert_eq!(network.in_flight_count(), 0);
    }

    #[test]
    fn loss_and_duplication_follow_their_probabilities() {
        let mut prng = Prng::new(4);
        let mut network = Network::new(3, faults(1.0, 0.0));
        assert_eq!(network.send(&mut prng, 0, 0, 1, ()), SendOutcome::Lost);
        network.set_faults(faults(0.0, 1.0));
        assert_eq!(
            network.send(&mut prng, 0, 0, 1, ()),
            SendOutcome::Queued { copies: 2 }
        );
        assert_eq!(network.deliver_due(10).len(), 2);
        network.set_faults(faults(0.3, 0.0));
        let sent = (0..10_000)
            .filter(|_| network.send(&mut prng, 0, 0, 1, ()) != SendOutcome::Lost)
            .count();
        assert!((6500..7500).contains(&sent), "{sent} of 10000 at loss 0.3");
    }

    #[test]
    fn partitions_cut_the_named_directions_and_heal() {
        let mut prng = Prng::new(5);
        let mut network: Network<u8> = Network::new(3, faults(0.0, 0.0));
        network.partition(&[0], PartitionKind::Symmetric);
        assert!(network.is_cut(0, 1) && network.is_cut(2, 0) && !network.is_cut(1, 2));
        // Clients (node 3 and up) are never cut off.
        assert!(!network.is_cut(3, 0) && !network.is_cut(0, 3));
        network.heal();
        network.partition(&[1], PartitionKind::OutgoingCut);
        assert!(network.is_cut(1, 0) && !network.is_cut(0, 1));
        network.heal();
        network.partition(&[1], PartitionKind::IncomingCut);
        assert!(!network.is_cut(1, 0) && network.is_cut(0, 1));
        // A packet in flight when the cut starts is lost at delivery.
        network.heal();
        network.send(&mut prng, 0, 0, 1, 9);
        network.partition(&[1], PartitionKind::Symmetric);
        assert!(network.deliver_due(10).is_empty());
        network.heal();
        assert!(!network.is_partitioned());
    }
}
