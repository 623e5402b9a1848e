//! Placement: how many seats of each group this node should hold, and which.
//!
//! Rule: every node computes `share = ceil(seats in group / eligible
//! seat-nodes)` per placement group and claims unheld seats of a group only
//! while it holds fewer than that group's share; holding more (a peer
//! joined) releases the surplus. A group the company pins to node labels
//! (`[placement.groups.NAME] labels`) counts only the live seat nodes whose
//! labels hold every pair; a node that does not match has a share of 0 there
//! (it claims none and gives back any it holds), and a pinned group no live
//! node matches stays unplaced. Why: the arithmetic is deliberately dumb —
//! every node computes the same numbers from the same table, and two nodes
//! racing for the last seat are settled by the lease, not by the
//! arithmetic. Per group, because one fleet-wide ratio strands pinned
//! seats, and a group's room is never spent on another group's seats.
//! Claiming alone only converges for a fleet that shrinks, so it converges
//! in both directions.
//!
//! Which seats: candidates are ordered by a hash of (node id, handle), so
//! two nodes starting together prefer different seats, and a node gives
//! back the seats it prefers least — which its peers, hashing differently,
//! tend to prefer. The previous holder comes first ([`Tenures`], from the
//! epochs bucket): a node tries first the seats it held last or held before
//! their current holder, and gives back first the seats whose previous
//! holder is a live peer that may run them, the latest it won first. So a
//! rolling restart lands the restarted node's seats back on it (its peer
//! won them last), and the seats its peer held all along stay on their warm
//! MCP children. It orders, never gates: how many seats
//! a node claims or gives back is the share's alone, and a previous holder
//! that is gone or has no room changes nothing.

use std::collections::{BTreeMap, BTreeSet};

use crewlet_company::Handle;

/// A placement group's name; `None` is the default group.
pub type Group = Option<String>;

/// A node's labels (`[node] labels`), or the labels a group is pinned to.
pub type Labels = BTreeMap<String, String>;

/// Who held a seat's last two tenures, by node id (from the epochs bucket).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tenures {
    /// The node of the latest epoch: the holder now, or the last one.
    pub last: Option<String>,
    /// The node of the epoch before it.
    pub before: Option<String>,
}

/// What a node knows at one tick.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    /// This node's id (for the candidate order).
    pub node_id: &'a str,
    /// Live nodes that run seats (presence, not saying they drain), with their
    /// labels; this node is counted whether listed or not, with
    /// `own_labels`.
    pub nodes: &'a BTreeMap<String, Labels>,
    /// This node's labels.
    pub own_labels: &'a Labels,
    /// Every seat of the company, with its group.
    pub seats: &'a BTreeMap<Handle, Group>,
    /// The groups pinned to node labels; a group absent here runs on any
    /// seat node.
    pub pins: &'a BTreeMap<String, Labels>,
    /// Seats this node holds and means to keep (not being released).
    pub holding: &'a BTreeSet<Handle>,
    /// When each held seat was won here, as a sequence (later is larger);
    /// a seat absent counts as the oldest.
    pub acquired: &'a BTreeMap<Handle, u64>,
    /// Seats this node may not claim now: being set up or torn down here,
    /// or backing off after a failed equip.
    pub unavailable: &'a BTreeSet<Handle>,
    /// Previous holders, when read; a seat absent has no preference.
    pub tenures: &'a BTreeMap<Handle, Tenures>,
}

/// What one group asks of this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupPlan {
    pub group: Group,
    pub seats: usize,
    /// Live seat nodes that may run the group's seats (this one included
    /// when it matches the pin).
    pub eligible: usize,
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

impl GroupPlan {
    /// More candidates than room: the previous holders order the claims.
    pub fn claims_a_choice(&self) -> bool {
        self.room > 0 && self.candidates.len() > self.room
    }

    /// A surplus that is a choice among the held: the previous holders
    /// decide which seats go.
    pub fn gives_back_a_choice(&self) -> bool {
        !self.surplus.is_empty() && self.surplus.len() < self.held
    }
}

/// Whether, and how fresh, a tick wants the previous holders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    /// Nothing to choose: no read.
    No,
    /// Only the claim order is at stake: a read up to a heartbeat old does
    /// (a hint, and a node taking seats over ticks on every release).
    Recent,
    /// Which seats to give back: a fresh read, since this node's own wins
    /// change who held them before.
    Fresh,
}

/// The whole tick's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub groups: Vec<GroupPlan>,
    /// Held seats the company no longer has.
    pub removed: Vec<Handle>,
}

impl Plan {
    /// Whether reading the previous holders could change this plan.
    pub fn wants_tenures(&self) -> Wanted {
        if self.groups.iter().any(GroupPlan::gives_back_a_choice) {
            Wanted::Fresh
        } else if self.groups.iter().any(GroupPlan::claims_a_choice) {
            Wanted::Recent
        } else {
            Wanted::No
        }
    }
}

/// `ceil(seats / nodes)`, with at least one node.
pub fn share(seats: usize, nodes: usize) -> usize {
    seats.div_ceil(nodes.max(1))
}

/// Whether a node with `labels` may run seats pinned to `pin`: it holds
/// every pair.
pub fn matches(pin: &Labels, labels: &Labels) -> bool {
    pin.iter().all(|(k, v)| labels.get(k) == Some(v))
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
    let me = inp.node_id;
    let mut by_group: BTreeMap<&Group, Vec<&Handle>> = BTreeMap::new();
    for (h, g) in inp.seats {
        by_group.entry(g).or_default().push(h);
    }
    let tenure = |h: &Handle| inp.tenures.get(h);
    // Held here last, or before the node that holds it now.
    let was_mine = |h: &Handle| {
        tenure(h).is_some_and(|t| t.last.as_deref() == Some(me) || t.before.as_deref() == Some(me))
    };
    let mut groups = Vec::new();
    for (group, mut members) in by_group {
        let pin = group.as_ref().and_then(|g| inp.pins.get(g));
        let fits = |labels: &Labels| pin.is_none_or(|p| matches(p, labels));
        let here = fits(inp.own_labels);
        let eligible: BTreeSet<&str> = inp
            .nodes
            .iter()
            .filter(|(id, labels)| id.as_str() != me && fits(labels))
            .map(|(id, _)| id.as_str())
            .chain(here.then_some(me))
            .collect();
        // Its previous holder is a live peer that may run it.
        let goes_home = |h: &Handle| {
            tenure(h)
                .and_then(|t| t.before.as_deref())
                .is_some_and(|b| b != me && eligible.contains(b))
        };
        members.sort_by_key(|h| (!was_mine(h), rank(me, h), (*h).clone()));
        let share = if here {
            share(members.len(), eligible.len())
        } else {
            0
        };
        let mut mine: Vec<&Handle> = members
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
        // Least preferred first: a live previous holder's, the latest won
        // first (the coldest here); then by rank.
        mine.sort_by_key(|h| {
            let home = goes_home(h);
            let won = if home {
                inp.acquired.get(*h).copied().unwrap_or(0)
            } else {
                0
            };
            (
                !home,
                std::cmp::Reverse(won),
                std::cmp::Reverse((rank(me, h), (*h).clone())),
            )
        });
        let surplus = mine
            .iter()
            .take(held.saturating_sub(share))
            .map(|h| (*h).clone())
            .collect();
        groups.push(GroupPlan {
            group: group.clone(),
            seats: members.len(),
            eligible: eligible.len(),
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

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// `n` live seat nodes without labels: `n1` (this node) … `nN`.
    fn plain(n: usize) -> BTreeMap<String, Labels> {
        (1..=n).map(|i| (format!("n{i}"), Labels::new())).collect()
    }

    /// The table of one tick, to be varied field by field.
    struct Tick {
        node_id: &'static str,
        nodes: BTreeMap<String, Labels>,
        own_labels: Labels,
        seats: BTreeMap<Handle, Group>,
        pins: BTreeMap<String, Labels>,
        holding: BTreeSet<Handle>,
        acquired: BTreeMap<Handle, u64>,
        unavailable: BTreeSet<Handle>,
        tenures: BTreeMap<Handle, Tenures>,
    }

    impl Tick {
        fn new(
            node_id: &'static str,
            nodes: BTreeMap<String, Labels>,
            seats: BTreeMap<Handle, Group>,
        ) -> Tick {
            let own_labels = nodes.get(node_id).cloned().unwrap_or_default();
            Tick {
                node_id,
                nodes,
                own_labels,
                seats,
                pins: BTreeMap::new(),
                holding: BTreeSet::new(),
                acquired: BTreeMap::new(),
                unavailable: BTreeSet::new(),
                tenures: BTreeMap::new(),
            }
        }

        fn plan(&self) -> Plan {
            plan(&Inputs {
                node_id: self.node_id,
                nodes: &self.nodes,
                own_labels: &self.own_labels,
                seats: &self.seats,
                pins: &self.pins,
                holding: &self.holding,
                acquired: &self.acquired,
                unavailable: &self.unavailable,
                tenures: &self.tenures,
            })
        }
    }

    fn tenure(last: &str, before: Option<&str>) -> Tenures {
        Tenures {
            last: Some(last.to_owned()),
            before: before.map(str::to_owned),
        }
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
        let mut t = Tick::new(
            "n1",
            plain(2),
            seats(&[
                ("g1", Some("gpu")),
                ("g2", Some("gpu")),
                ("g3", Some("gpu")),
                ("g4", Some("gpu")),
                ("d1", None),
                ("d2", None),
            ]),
        );
        // Holding two default seats: the default group is over its share
        // of 1, the gpu group still has room for 2.
        t.holding = [h("d1"), h("d2")].into();
        let p = t.plan();
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
        let mut t = Tick::new(
            "n1",
            plain(1),
            seats(&[("a", None), ("b", None), ("c", None)]),
        );
        t.holding = [h("gone")].into();
        t.unavailable = [h("b")].into();
        let p = t.plan();
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
        let order = |node: &'static str| {
            Tick::new(node, BTreeMap::new(), s.clone()).plan().groups[0]
                .candidates
                .clone()
        };
        let (a, b) = (order("node-a"), order("node-b"));
        assert_eq!(a, order("node-a"), "deterministic");
        assert_ne!(a, b, "two nodes do not race for the same seats first");
        let mut t = Tick::new("node-a", plain(0), s.clone());
        t.nodes.insert("node-b".into(), Labels::new());
        t.holding = s.keys().cloned().collect();
        let surplus = &t.plan().groups[0].surplus;
        assert_eq!(surplus.len(), 16);
        let least: Vec<Handle> = a.iter().rev().take(16).cloned().collect();
        assert_eq!(surplus, &least);
    }

    #[test]
    fn a_pinned_group_counts_only_the_nodes_whose_labels_match() {
        let nodes: BTreeMap<String, Labels> = [
            ("n1".to_owned(), labels(&[("accel", "gpu"), ("zone", "eu")])),
            ("n2".to_owned(), labels(&[("accel", "gpu")])),
            ("n3".to_owned(), labels(&[("zone", "eu")])),
        ]
        .into();
        let s = seats(&[
            ("g1", Some("gpu")),
            ("g2", Some("gpu")),
            ("g3", Some("gpu")),
            ("g4", Some("gpu")),
            ("f1", Some("free")),
            ("f2", Some("free")),
            ("f3", Some("free")),
        ]);
        let pins: BTreeMap<String, Labels> =
            [("gpu".to_owned(), labels(&[("accel", "gpu")]))].into();
        let group = |p: &Plan, g: &str| {
            p.groups
                .iter()
                .find(|x| x.group.as_deref() == Some(g))
                .cloned()
                .unwrap()
        };
        // n1 and n2 carry accel=gpu: the gpu seats split between them; the
        // undeclared group `free` runs on all three.
        let mut t = Tick::new("n1", nodes.clone(), s.clone());
        t.pins = pins.clone();
        let p = t.plan();
        let gpu = group(&p, "gpu");
        assert_eq!((gpu.eligible, gpu.share, gpu.room), (2, 2, 2));
        assert_eq!(gpu.candidates.len(), 4);
        let free = group(&p, "free");
        assert_eq!((free.eligible, free.share), (3, 1));
        // n3 lacks the label: it claims no gpu seat and gives back any it
        // holds, while it keeps its share of the free group.
        let mut t = Tick::new("n3", nodes.clone(), s.clone());
        t.pins = pins.clone();
        t.holding = [h("g1"), h("g2"), h("f1")].into();
        let p = t.plan();
        let gpu = group(&p, "gpu");
        assert_eq!((gpu.eligible, gpu.share, gpu.room), (2, 0, 0));
        assert!(gpu.candidates.is_empty());
        let mut given = gpu.surplus.clone();
        given.sort();
        assert_eq!(given, vec![h("g1"), h("g2")]);
        let free = group(&p, "free");
        assert_eq!((free.share, free.held), (1, 1));
        assert!(free.surplus.is_empty());
        // No live node matches: nobody's share, so the seats stay unplaced.
        let mut t = Tick::new("n3", nodes, s);
        t.pins = [("gpu".to_owned(), labels(&[("accel", "tpu")]))].into();
        let gpu = group(&t.plan(), "gpu");
        assert_eq!((gpu.eligible, gpu.share), (0, 0));
    }

    #[test]
    fn a_node_tries_first_the_seats_it_held_before() {
        let names: Vec<String> = (0..12).map(|i| format!("s{i}")).collect();
        let s: BTreeMap<Handle, Group> = names.iter().map(|n| (h(n), None)).collect();
        let mut t = Tick::new("n1", plain(3), s.clone());
        let by_rank = t.plan().groups[0].candidates.clone();
        // The three n1 ranks last: one it held last (free now), one another
        // node took from it, one n2 holds and took from n3.
        let last3: Vec<Handle> = by_rank.iter().rev().take(3).cloned().collect();
        t.tenures = [
            (last3[0].clone(), tenure("n1", Some("n3"))),
            (last3[1].clone(), tenure("n2", Some("n1"))),
            (last3[2].clone(), tenure("n2", Some("n3"))),
        ]
        .into();
        let p = t.plan();
        let c = &p.groups[0].candidates;
        assert_eq!(c.len(), 12, "it orders, never removes");
        let mut first: Vec<Handle> = c[..2].to_vec();
        first.sort();
        let mut want = vec![last3[0].clone(), last3[1].clone()];
        want.sort();
        assert_eq!(first, want);
        assert_eq!(c.last(), Some(&last3[2]), "n3's seat keeps its rank");
        assert_eq!(p.groups[0].room, 4, "the share is the share");
    }

    #[test]
    fn a_node_gives_back_first_the_seats_a_live_peer_held_before() {
        let names: Vec<String> = (0..6).map(|i| format!("s{i}")).collect();
        let s: BTreeMap<Handle, Group> = names.iter().map(|n| (h(n), None)).collect();
        let mut t = Tick::new("n1", plain(2), s.clone());
        t.holding = s.keys().cloned().collect();
        let by_rank = t.plan().groups[0].surplus.clone();
        assert_eq!(by_rank.len(), 3);
        // The three n1 prefers most came from n2, which is back.
        let from_n2: Vec<Handle> = s.keys().filter(|k| !by_rank.contains(k)).cloned().collect();
        t.tenures = from_n2
            .iter()
            .map(|k| (k.clone(), tenure("n1", Some("n2"))))
            .collect();
        assert_eq!(t.plan().wants_tenures(), Wanted::Fresh);
        let mut back = t.plan().groups[0].surplus.clone();
        back.sort();
        assert_eq!(back, from_n2, "n2's seats go home");
        // It never gates: a previous holder that is not live, or may not run
        // the group, changes nothing.
        t.nodes.remove("n2");
        t.nodes.insert("n9".into(), Labels::new());
        assert_eq!(t.plan().groups[0].surplus, by_rank, "n2 is gone");
        t.nodes.remove("n9");
        t.nodes.insert("n2".into(), labels(&[("accel", "cpu")]));
        t.seats = names
            .iter()
            .map(|n| (h(n), Some("gpu".to_owned())))
            .collect();
        t.pins = [("gpu".to_owned(), labels(&[("accel", "gpu")]))].into();
        t.own_labels = labels(&[("accel", "gpu")]);
        let p = t.plan();
        assert_eq!(p.groups[0].share, 6, "n2 may not run gpu seats");
        assert!(p.groups[0].surplus.is_empty());
    }

    #[test]
    fn of_the_seats_a_peer_held_before_the_latest_won_go_back_first() {
        // n2 held all six; n1 won three when it joined, and the other three
        // while n2 restarted. n2 is back: those three go back to it.
        let names: Vec<String> = (0..6).map(|i| format!("s{i}")).collect();
        let s: BTreeMap<Handle, Group> = names.iter().map(|n| (h(n), None)).collect();
        let mut t = Tick::new("n1", plain(2), s.clone());
        t.holding = s.keys().cloned().collect();
        t.tenures = s
            .keys()
            .map(|k| (k.clone(), tenure("n1", Some("n2"))))
            .collect();
        let by_rank = t.plan().groups[0].surplus.clone();
        // The latest won are the three n1 would keep by rank.
        let kept: Vec<Handle> = s.keys().filter(|k| !by_rank.contains(k)).cloned().collect();
        t.acquired = s
            .keys()
            .map(|k| (k.clone(), if kept.contains(k) { 10 } else { 1 }))
            .collect();
        let mut back = t.plan().groups[0].surplus.clone();
        back.sort();
        assert_eq!(back, kept);
    }

    #[test]
    fn the_previous_holders_are_read_only_when_they_could_change_the_plan() {
        let s = seats(&[("a", None), ("b", None), ("c", None), ("d", None)]);
        let mut t = Tick::new("n1", plain(2), s.clone());
        assert_eq!(
            t.plan().wants_tenures(),
            Wanted::Recent,
            "4 candidates for 2 places"
        );
        t.holding = [h("a"), h("b")].into();
        assert_eq!(
            t.plan().wants_tenures(),
            Wanted::No,
            "at its share: nothing to choose"
        );
        t.holding = s.keys().cloned().collect();
        assert_eq!(
            t.plan().wants_tenures(),
            Wanted::Fresh,
            "which 2 of 4 to give back"
        );
        t.nodes = plain(1);
        t.holding = BTreeSet::new();
        assert_eq!(
            t.plan().wants_tenures(),
            Wanted::No,
            "every candidate is tried anyway"
        );
    }
}
