//! Placement: how many seats of each group this node should hold, and which.
//!
//! Rule: every node computes `share = ceil(seats in group / live seat-nodes)`
//! per placement group and claims unheld seats of a group only while it holds
//! fewer than that group's share; holding more (a peer joined) releases the
//! surplus. Why: the arithmetic is deliberately dumb — every node computes
//! the same numbers from the same table, and two nodes racing for the last
//! seat are settled by the lease, not by the arithmetic. Per group, because
//! one fleet-wide ratio strands pinned seats, and a group's room is never
//! spent on another group's seats. Claiming alone only converges for a fleet
//! that shrinks, so it converges in both directions.
//!
//! Candidates are ordered by a hash of (node id, handle): two nodes starting
//! together prefer different seats, and a node gives back the seats it
//! prefers least — which its peers, hashing differently, tend to prefer.

use std::collections::{BTreeMap, BTreeSet};

use crewlet_company::Handle;

/// A placement group's name; `None` is the default group.
pub type Group = Option<String>;

/// What a node knows at one tick.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    /// This node's id (for the candidate order).
    pub node_id: &'a str,
    /// Live nodes that run seats, this node included (at least 1).
    pub live_seat_nodes: usize,
    /// Every seat of the company, with its group.
    pub seats: &'a BTreeMap<Handle, Group>,
    /// Seats this node holds and means to keep (not being released).
    pub holding: &'a BTreeSet<Handle>,
    /// Seats this node may not claim now: being set up or torn down here,
    /// or backing off after a failed equip.
    pub unavailable: &'a BTreeSet<Handle>,
}

/// What one group asks of this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupPlan {
    pub group: Group,
    pub seats: usize,
    pub share: usize,
    /// How many this node holds in the group.
    pub held: usize,
    /// How many more to claim (share − held, or 0).
    pub room: usize,
    /// Seats to try, most preferred first; try until `room` are won.
    pub candidates: Vec<Handle>,
    /// Seats to give back (least preferred first).
    pub surplus: Vec<Handle>,
}

/// The whole tick's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub groups: Vec<GroupPlan>,
    /// Held seats the company no longer has.
    pub removed: Vec<Handle>,
}

/// `ceil(seats / nodes)`, with at least one node.
pub fn share(seats: usize, nodes: usize) -> usize {
    seats.div_ceil(nodes.max(1))
}

/// The candidate order: FNV-1a over `node_id`, a separator, and the handle.
pub fn rank(node_id: &str, handle: &Handle) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node_id
        .bytes()
        .chain(std::iter::once(0xff))
        .chain(handle.as_str().bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Computes the plan for one tick.
pub fn plan(inp: &Inputs<'_>) -> Plan {
    let mut by_group: BTreeMap<&Group, Vec<&Handle>> = BTreeMap::new();
    for (h, g) in inp.seats {
        by_group.entry(g).or_default().push(h);
    }
    let by_rank = |hs: &mut Vec<&Handle>| {
        hs.sort_by_key(|h| (rank(inp.node_id, h), (*h).clone()));
    };
    let mut groups = Vec::new();
    for (group, mut members) in by_group {
        by_rank(&mut members);
        let share = share(members.len(), inp.live_seat_nodes);
        let mine: Vec<&Handle> = members
            .iter()
            .copied()
            .filter(|h| inp.holding.contains(*h))
            .collect();
        let held = mine.len();
        let room = share.saturating_sub(held);
        let candidates = if room == 0 {
            Vec::new()
        } else {
            members
                .iter()
                .filter(|h| !inp.holding.contains(**h) && !inp.unavailable.contains(**h))
                .map(|h| (*h).clone())
                .collect()
        };
        let surplus = mine
            .iter()
            .rev()
            .take(held.saturating_sub(share))
            .map(|h| (*h).clone())
            .collect();
        groups.push(GroupPlan {
            group: group.clone(),
            seats: members.len(),
            share,
            held,
            room,
            candidates,
            surplus,
        });
    }
    let removed = inp
        .holding
        .iter()
        .filter(|h| !inp.seats.contains_key(*h))
        .cloned()
        .collect();
    Plan { groups, removed }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &str) -> Handle {
        Handle::parse(s).unwrap()
    }

    fn seats(spec: &[(&str, Option<&str>)]) -> BTreeMap<Handle, Group> {
        spec.iter()
            .map(|(n, g)| (h(n), g.map(str::to_owned)))
            .collect()
    }

    #[test]
    fn share_is_the_ceiling_and_never_divides_by_zero() {
        assert_eq!(share(6, 2), 3);
        assert_eq!(share(5, 2), 3);
        assert_eq!(share(1, 3), 1);
        assert_eq!(share(0, 3), 0);
        assert_eq!(share(4, 0), 4);
    }

    #[test]
    fn a_groups_room_is_not_spent_on_another_group() {
        let s = seats(&[
            ("g1", Some("gpu")),
            ("g2", Some("gpu")),
            ("g3", Some("gpu")),
            ("g4", Some("gpu")),
            ("d1", None),
            ("d2", None),
        ]);
        // Holding two default seats: the default group is over its share
        // of 1, the gpu group still has room for 2.
        let holding: BTreeSet<Handle> = [h("d1"), h("d2")].into();
        let p = plan(&Inputs {
            node_id: "n1",
            live_seat_nodes: 2,
            seats: &s,
            holding: &holding,
            unavailable: &BTreeSet::new(),
        });
        let default = p.groups.iter().find(|g| g.group.is_none()).unwrap();
        assert_eq!((default.share, default.held, default.room), (1, 2, 0));
        assert_eq!(default.surplus.len(), 1);
        assert!(default.candidates.is_empty());
        let gpu = p.groups.iter().find(|g| g.group.is_some()).unwrap();
        assert_eq!((gpu.share, gpu.held, gpu.room), (2, 0, 2));
        assert_eq!(gpu.candidates.len(), 4);
        assert!(gpu.candidates.iter().all(|c| c.as_str().starts_with('g')));
    }

    #[test]
    fn removed_seats_and_unavailable_ones_are_not_candidates() {
        let s = seats(&[("a", None), ("b", None), ("c", None)]);
        let holding: BTreeSet<Handle> = [h("gone")].into();
        let unavailable: BTreeSet<Handle> = [h("b")].into();
        let p = plan(&Inputs {
            node_id: "n1",
            live_seat_nodes: 1,
            seats: &s,
            holding: &holding,
            unavailable: &unavailable,
        });
        assert_eq!(p.removed, vec![h("gone")]);
        let g = &p.groups[0];
        assert_eq!(g.room, 3);
        let mut c = g.candidates.clone();
        c.sort();
        assert_eq!(c, vec![h("a"), h("c")]);
    }

    #[test]
    fn two_nodes_prefer_different_orders_and_give_back_their_least_preferred() {
        let names: Vec<String> = (0..32).map(|i| format!("s{i}")).collect();
        let s: BTreeMap<Handle, Group> = names.iter().map(|n| (h(n), None)).collect();
        let none = BTreeSet::new();
        let order = |node: &str| {
            plan(&Inputs {
                node_id: node,
                live_seat_nodes: 1,
                seats: &s,
                holding: &none,
                unavailable: &none,
            })
            .groups[0]
                .candidates
                .clone()
        };
        let (a, b) = (order("node-a"), order("node-b"));
        assert_eq!(a, order("node-a"), "deterministic");
        assert_ne!(a, b, "two nodes do not race for the same seats first");
        let all: BTreeSet<Handle> = s.keys().cloned().collect();
        let p = plan(&Inputs {
            node_id: "node-a",
            live_seat_nodes: 2,
            seats: &s,
            holding: &all,
            unavailable: &none,
        });
        let surplus = &p.groups[0].surplus;
        assert_eq!(surplus.len(), 16);
        let least: Vec<Handle> = a.iter().rev().take(16).cloned().collect();
        assert_eq!(surplus, &least);
    }
}
