//! A broker member cut off from its peers while mentions flow, through the
//! real binary: three nodes on a real 3-node NATS cluster (every stream and
//! bucket at three replicas), each dialling its own member first, six seats
//! answering Slack mentions through their chat servers, and a steady load of
//! signed mentions spread over the seats and the three ingress nodes.
//!
//! Mid-load the member leading the JetStream meta group has its routes
//! severed for [`CUT`] (the testkit's proxies: its clients stay connected,
//! so its node keeps talking to a server that has lost the fleet), then
//! healed: the hardest cut, since the other two must elect leaders for the
//! meta group and for every stream and consumer it led, and on the heal the
//! returning member unseats them again. Meanwhile the cut node's leases
//! lapse and its seats go to the other two once they serve; after the heal
//! the seats spread back, and the load goes on a little longer. A sender that is not answered 2xx retries on the next
//! node with the same event id, as Slack does.
//!
//! The rule checked: every mention an edge accepted (2xx) is answered
//! exactly once, by the seat it named, and the last of them within
//! [`ANSWER_BOUND`] of the load's end; nothing is posted in a thread nobody
//! mentioned, and a mention never accepted is answered at most once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::common::eventually;
use crate::common::fleet::{
    Fleet, SEATS, assert_each_answered_once, balanced, holders, mention, posts,
};
use crewlet_testkit::cluster::meta_leader;

const IDS: [&str; 3] = ["rc-a", "rc-b", "rc-c"];
/// The member cut off when no meta leader is reported; otherwise the meta
/// leader is (the node dialling it first is cut off with it).
const CUT_MEMBER: usize = 2;
/// How long its routes stay severed.
const CUT: Duration = Duration::from_secs(30);
/// Short, so the cut node's seats move within the cut.
const LEASE_TTL: Duration = Duration::from_secs(5);
const HEARTBEAT: Duration = Duration::from_secs(1);
/// One new mention every this long (a steady rate, whatever the answers).
const PACE: Duration = Duration::from_millis(250);
/// Attempts per mention, and the pause between them (a sender's retry):
/// a sender that keeps trying for two minutes, as Slack retries for
/// minutes. The cut member led the meta group, so the majority's streams
/// and buckets stay without leaders while it re-elects them — on a loaded
/// 2-core CI machine ~28 s of the 30 s cut (seen: 106 of 207 mentions
/// answered 503 on all of 12 attempts a second apart). A mention must be
/// accepted once the fleet serves again, not within a fixed dozen tries.
const ATTEMPTS: usize = 120;
const RETRY_PACE: Duration = Duration::from_secs(1);
/// How long the load goes on once the fleet serves again after the heal.
const AFTER_SPREAD: Duration = Duration::from_secs(3);
/// From the load's end until the last accepted mention is answered. What
/// can still be owed then: a wake held by a node that lost its seat comes
/// back after the mailbox's ack wait (10 s), a delivery held by a stalled
/// notify pull after the notify ack wait (5 s), plus a lease TTL for a seat
/// in motion and what a loaded 2-core machine adds. Seen here (2 cores,
/// six builds beside it): 0.5 ms in three runs; 0.4–19.4 s in five runs
/// whose load ended 3 s after the heal, before the load waited for the
/// fleet to serve again; before notify-inbound's pulls had a heartbeat, a
/// run took 21.8 s (its pulls silent for ~35 s after the heal).
const ANSWER_BOUND: Duration = Duration::from_secs(20);

/// A mention the load sent: its thread (unique), the seat it named, and the
/// answer of each attempt (`None`: no answer within the client's timeout).
#[derive(Debug, Clone)]
struct Sent {
    thread: String,
    seat: &'static str,
    attempts: Vec<(usize, Option<u16>)>,
}

impl Sent {
    /// The 2xx an edge accepted it with, if one did.
    fn accepted(&self) -> Option<u16> {
        self.attempts
            .iter()
            .filter_map(|(_, s)| *s)
            .find(|s| (200..300).contains(s))
    }
}

/// The steady load: a mention every [`PACE`], each sent from a thread of
/// its own so a node that answers slowly holds up only its own mentions.
struct Load {
    sent: Arc<Mutex<Vec<Sent>>>,
    stop: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
}

impl Load {
    fn start(targets: Vec<String>) -> Load {
        let sent = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (sent.clone(), stop.clone());
        let worker = std::thread::spawn(move || {
            let mut senders = Vec::new();
            let mut i = 0usize;
            while !st.load(Ordering::SeqCst) {
                let (targets, s) = (targets.clone(), s.clone());
                senders.push(std::thread::spawn(move || {
                    let seat = SEATS[i % SEATS.len()];
                    let thread = format!("80.{i}");
                    let event_id = format!("EvRc{i}");
                    let mut attempts = Vec::new();
                    for attempt in 0..ATTEMPTS {
                        let to = (i + attempt) % targets.len();
                        let status = mention(&targets[to], seat, &event_id, &thread);
                        attempts.push((to, status));
                        if status.is_some_and(|s| (200..300).contains(&s)) {
                            break;
                        }
                        std::thread::sleep(RETRY_PACE);
                    }
                    s.lock().unwrap().push(Sent {
                        thread,
                        seat,
                        attempts,
                    });
                }));
                i += 1;
                std::thread::sleep(PACE);
            }
            for t in senders {
                t.join().expect("a sender ran");
            }
        });
        Load {
            sent,
            stop,
            worker: Some(worker),
        }
    }

    /// Mentions whose sender has finished, in no particular order.
    fn finished(&self) -> Vec<Sent> {
        self.sent.lock().unwrap().clone()
    }

    /// Stops starting mentions and waits for every sender to finish.
    fn finish(&mut self) -> Vec<Sent> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(w) = self.worker.take() {
            w.join().expect("the load ran");
        }
        self.finished()
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// What the route cut's failure says of the mentions it lost.
impl Fleet {
    /// Every node's log lines that name one of `threads`' mentions (its
    /// event id), prefixed with the node.
    fn log_lines<'a>(&self, threads: impl Iterator<Item = &'a str>) -> String {
        let ids: Vec<String> = threads
            .map(|t| format!("EvRc{}", t.trim_start_matches("80.")))
            .collect();
        let mut out = String::new();
        for (n, id) in self.nodes.iter().zip(IDS) {
            for line in n.log_text().lines() {
                if ids.iter().any(|e| {
                    line.match_indices(e.as_str()).any(|(at, _)| {
                        !line[at + e.len()..].starts_with(|c: char| c.is_ascii_digit())
                    })
                }) {
                    out.push_str(&format!("{id}: {line}\n"));
                }
            }
        }
        out
    }

    /// What the fleet's event logs hold of the deliveries its edges logged
    /// for `threads` (by the trace ids in those log lines): kind and node.
    fn trails<'a>(&self, threads: impl Iterator<Item = &'a str>) -> String {
        let lines = self.log_lines(threads);
        let mut out = String::new();
        for trace in lines
            .split("trace_id=\"")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .collect::<std::collections::BTreeSet<_>>()
        {
            let mut kinds = Vec::new();
            for (n, id) in self.nodes.iter().zip(IDS) {
                let Some(r) = n
                    .get(&format!("/events?trace_id={trace}&node={id}&limit=100"))
                    .filter(|r| r.status == 200)
                else {
                    continue;
                };
                for e in r.json()["events"].as_array().cloned().unwrap_or_default() {
                    kinds.push(format!(
                        "{id}:{}:{}",
                        e["type"].as_str().unwrap_or("?"),
                        e["payload"]["outcome"].as_str().unwrap_or("")
                    ));
                }
            }
            out.push_str(&format!("{trace}: {kinds:?}\n"));
        }
        out
    }
}

#[test]
fn a_member_cut_off_for_30_s_loses_and_doubles_no_accepted_mention() {
    let t0 = Instant::now();
    let (f, _) = Fleet::start(IDS, LEASE_TTL, HEARTBEAT);
    let log = f.chat_log();
    let reader = &f.nodes[0];

    let mut load = Load::start(f.apis());
    assert!(
        eventually(Duration::from_secs(30), || posts(&log).len() >= SEATS.len()),
        "the fleet never answered the load: {:?}\n{}",
        posts(&log),
        reader.log_text()
    );

    // Cut the member off; its node's seats are held by the other two.
    let leader = meta_leader(f.cluster.member(0).spec().monitor_port);
    let cut_member = (0..3)
        .find(|&i| Some(f.cluster.server_name(i)) == leader.as_deref())
        .unwrap_or(CUT_MEMBER);
    eprintln!("cutting member {cut_member} (meta leader {leader:?})");
    let cut_node = IDS[cut_member];
    // A node of the majority is asked what the fleet looks like.
    let reader = &f.nodes[(cut_member + 1) % IDS.len()];
    f.cluster.isolate(cut_member);
    let cut_at = Instant::now();
    // Whether the majority took the cut node's seats is told, not asserted:
    // when the member cut led the meta group and most streams, the other
    // two may need most of the cut to elect leaders for them all.
    let mut during = BTreeMap::new();
    let taken = eventually(CUT - Duration::from_secs(2), || {
        during = holders(reader).unwrap_or_default();
        during.len() == SEATS.len() && during.values().all(|n| n != cut_node)
    });
    eprintln!(
        "{cut_node}'s seats {} {:?} into the cut: {during:?}",
        if taken {
            "held by the majority"
        } else {
            "not all held by the majority"
        },
        cut_at.elapsed()
    );
    std::thread::sleep(CUT.saturating_sub(cut_at.elapsed()));
    f.cluster.heal(cut_member);
    let healed = Instant::now();
    eprintln!("healed after a cut of {:?}", cut_at.elapsed());
    // The heal unseats the leaders the majority elected (the returning
    // member campaigns at a higher term): the load goes on until the
    // members agree on a meta leader again and every node sees the seats
    // spread, then a little longer.
    // (Not every member's /healthz: the returning one may report itself
    // catching up for a minute on a loaded machine while the fleet serves.)
    let ports: Vec<u16> = (0..IDS.len())
        .map(|i| f.cluster.member(i).spec().monitor_port)
        .collect();
    let mut leaders = Vec::new();
    assert!(
        eventually(Duration::from_secs(60), || {
            leaders = ports.iter().map(|p| meta_leader(*p)).collect();
            leaders[0].is_some() && leaders.iter().all(|l| l == &leaders[0])
        }),
        "the members never agreed on a meta leader after the heal: {leaders:?}"
    );
    let mut back = BTreeMap::new();
    assert!(
        eventually(Duration::from_secs(40), || f.nodes.iter().all(|n| {
            back = holders(n).unwrap_or_default();
            balanced(&back)
        })),
        "the seats never spread back after the heal: {back:?}\n{}",
        f.nodes[cut_member].log_text()
    );
    eprintln!(
        "seats spread again {:?} after the heal: {back:?}",
        healed.elapsed()
    );
    std::thread::sleep(AFTER_SPREAD);

    // The load ends; every accepted mention is answered within the bound.
    let sent = load.finish();
    let ended = Instant::now();
    let accepted: Vec<&Sent> = sent.iter().filter(|s| s.accepted().is_some()).collect();
    let unanswered = || {
        let by = posts(&log);
        accepted
            .iter()
            .filter(|s| !by.contains_key(&s.thread))
            .map(|s| (s.thread.clone(), s.seat, s.attempts.clone()))
            .collect::<Vec<_>>()
    };
    let mut missing = unanswered();
    while !missing.is_empty() && ended.elapsed() < ANSWER_BOUND {
        std::thread::sleep(Duration::from_millis(20));
        missing = unanswered();
    }
    let answered_in = ended.elapsed();
    if !missing.is_empty() {
        // Late or lost: a minute more tells which, for the failure's text.
        let late = missing.clone();
        let mut lost = missing.clone();
        while !lost.is_empty() && ended.elapsed() < ANSWER_BOUND + Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(100));
            lost = unanswered();
        }
        panic!(
            "{} of {} accepted mentions unanswered {ANSWER_BOUND:?} after the load ended: {late:?}\n\
             {} still unanswered after {:?}: {lost:?}\nwhat the nodes logged of those:\n{}\ntheir events:\n{}",
            late.len(),
            accepted.len(),
            lost.len(),
            ended.elapsed(),
            f.log_lines(lost.iter().map(|(thread, _, _)| thread.as_str())),
            f.trails(lost.iter().map(|(thread, _, _)| thread.as_str()))
        );
    }
    eprintln!(
        "{} mentions sent, {} accepted, every one answered {answered_in:?} after the load ended",
        sent.len(),
        accepted.len()
    );
    assert_eq!(
        accepted.len(),
        sent.len(),
        "the majority accepted every mention within {ATTEMPTS} attempts: {:?}",
        sent.iter()
            .filter(|s| s.accepted().is_none())
            .collect::<Vec<_>>()
    );

    // Once the fleet is quiet (no turn running, every mailbox settled),
    // each exactly once, by the seat named, and nothing else posted.
    f.wait_quiet(reader);
    assert_each_answered_once(&log, accepted.iter().map(|s| (s.thread.as_str(), s.seat)));
    let first_try = sent.iter().filter(|s| s.attempts.len() == 1).count();
    eprintln!(
        "each answered once; {first_try} accepted at the first attempt; done after {:?}",
        t0.elapsed()
    );
}
