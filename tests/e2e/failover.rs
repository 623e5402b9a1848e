//! Failover of a fleet, through the real binary: three nodes on a real
//! 3-node NATS cluster (every stream and bucket at three replicas), six
//! seats answering Slack mentions through their chat servers, and a steady
//! stream of unique mentions spread over the seats and the ingress nodes.
//! The holder of some seats is SIGKILLed mid-stream: its seats are held
//! again by the survivors within the lease TTL plus one heartbeat (and a
//! stated allowance for a loaded machine). It is
//! restarted on its data dir and seats move back to it. Through both moves
//! every accepted mention is answered exactly once — counted in the chat
//! server's log, which holds every post ever made.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::common::eventually;
use crate::common::fleet::{
    Fleet, SEATS, assert_each_answered_once, balanced, holders, mention, posts,
};

const IDS: [&str; 3] = ["fo-a", "fo-b", "fo-c"];
/// Short, so the dead holder's seats move within the test's budget.
const LEASE_TTL: Duration = Duration::from_secs(5);
const HEARTBEAT: Duration = Duration::from_secs(1);
/// What a loaded 2-core machine adds to the bound: the survivor's tick
/// running late, the claim's writes to three replicas, and reading
/// `/agents` to see it.
/// Seen 5.5–7.2 s against the 6 s bound here while other test runs shared
/// the machine.
const LOAD_SLACK: Duration = Duration::from_secs(3);
/// One mention every this long.
const PACE: Duration = Duration::from_millis(150);

/// A mention the stream sent: its thread (unique), the seat it named, and
/// whether an ingress node accepted it (202).
#[derive(Debug, Clone)]
struct Sent {
    thread: String,
    seat: &'static str,
    accepted: bool,
}

/// The steady stream: one mention every [`PACE`], seat after seat, ingress
/// node after ingress node. A delivery that is not accepted is retried on
/// the next node with the same event id, as Slack retries.
struct Stream {
    /// The ingress nodes' API addresses; locked for the length of a send,
    /// so a node taken out of it has no request in flight once the lock is
    /// had.
    targets: Arc<Mutex<Vec<String>>>,
    sent: Arc<Mutex<Vec<Sent>>>,
    stop: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
}

impl Stream {
    fn start(targets: Vec<String>) -> Stream {
        let targets = Arc::new(Mutex::new(targets));
        let sent = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (t, s, st) = (targets.clone(), sent.clone(), stop.clone());
        let worker = std::thread::spawn(move || {
            let mut i = 0usize;
            while !st.load(Ordering::SeqCst) {
                let seat = SEATS[i % SEATS.len()];
                let thread = format!("70.{i}");
                let event_id = format!("EvFo{i}");
                let mut accepted = false;
                for attempt in 0..6 {
                    {
                        let to = t.lock().unwrap();
                        let api = &to[(i + attempt) % to.len()];
                        if mention(api, seat, &event_id, &thread) == Some(202) {
                            accepted = true;
                            break;
                        }
                    }
                    // A sender's retry, paced as Slack's are (not a wait
                    // on the fleet: the next attempt goes to another node).
                    std::thread::sleep(PACE);
                }
                s.lock().unwrap().push(Sent {
                    thread,
                    seat,
                    accepted,
                });
                i += 1;
                std::thread::sleep(PACE);
            }
        });
        Stream {
            targets,
            sent,
            stop,
            worker: Some(worker),
        }
    }

    fn sent(&self) -> Vec<Sent> {
        self.sent.lock().unwrap().clone()
    }

    /// Stops sending to `api`; returns once no request to it is in flight.
    fn without(&self, api: &str) {
        self.targets.lock().unwrap().retain(|a| a != api);
    }

    fn with(&self, api: &str) {
        self.targets.lock().unwrap().push(api.to_owned());
    }

    fn finish(&mut self) -> Vec<Sent> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(w) = self.worker.take() {
            w.join().expect("the mention stream ran");
        }
        self.sent()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// How many of `sent` (from index `from` on, seats in `seats`) were answered.
fn answered(log: &Path, sent: &[Sent], from: usize, seats: &BTreeSet<String>) -> usize {
    let by = posts(log);
    sent[from.min(sent.len())..]
        .iter()
        .filter(|s| seats.contains(s.seat) && by.contains_key(&s.thread))
        .count()
}

#[test]
fn a_killed_holders_seats_move_and_come_back_with_every_mention_answered_once() {
    let t0 = Instant::now();
    let (mut f, seen) = Fleet::start(IDS, LEASE_TTL, HEARTBEAT);
    let log = f.chat_log();
    let reader = &f.nodes[0];

    let mut stream = Stream::start(f.apis());
    let every: BTreeSet<String> = SEATS.iter().map(|s| (*s).to_owned()).collect();
    assert!(
        eventually(Duration::from_secs(30), || answered(
            &log,
            &stream.sent(),
            0,
            &every
        ) >= 2 * SEATS.len()),
        "the fleet never answered the stream: {:?}\n{}",
        posts(&log),
        reader.log_text()
    );

    // SIGKILL the holder of some seats mid-stream.
    let victim = 2;
    let orphans: BTreeSet<String> = seen
        .iter()
        .filter(|(_, n)| *n == IDS[victim])
        .map(|(s, _)| s.clone())
        .collect();
    stream.without(&f.nodes[victim].api);
    f.nodes[victim].signal(libc::SIGKILL);
    let killed = Instant::now();
    f.nodes[victim].wait_exit(Duration::from_secs(10));
    let mut now_held = BTreeMap::new();
    let bound = LEASE_TTL + HEARTBEAT + LOAD_SLACK;
    assert!(
        eventually(bound + Duration::from_secs(20), || {
            now_held = holders(&f.nodes[0]).unwrap_or_default();
            now_held.len() == SEATS.len() && now_held.values().all(|n| n != IDS[victim])
        }),
        "the survivors never took {orphans:?}: {now_held:?}\n{}",
        f.nodes[0].log_text()
    );
    let failover = killed.elapsed();
    eprintln!(
        "{orphans:?} held again {failover:?} after the SIGKILL (TTL {LEASE_TTL:?} + heartbeat {HEARTBEAT:?}): {now_held:?}"
    );
    assert!(
        failover <= bound,
        "the seats took {failover:?}, over the lease TTL + one heartbeat (+{LOAD_SLACK:?} for load)"
    );
    // The moved seats answer what is sent to them now.
    let after_kill = stream.sent().len();
    assert!(
        eventually(Duration::from_secs(30), || answered(
            &log,
            &stream.sent(),
            after_kill,
            &orphans
        ) >= 2 * orphans.len()),
        "the moved seats never answered after the failover: {:?}",
        posts(&log)
    );

    // Back on its data dir: seats move to it again.
    f.nodes[victim] = f.spawn(victim);
    f.nodes[victim].wait_ready(Duration::from_secs(60));
    let back = Instant::now();
    stream.with(&f.nodes[victim].api);
    let mut returned = BTreeMap::new();
    assert!(
        eventually(Duration::from_secs(30), || {
            returned = holders(&f.nodes[0]).unwrap_or_default();
            balanced(&returned)
        }),
        "the seats never spread back two to a node: {returned:?}\n{}",
        f.nodes[victim].log_text()
    );
    eprintln!(
        "seats spread again {:?} after the restart was ready: {returned:?}",
        back.elapsed()
    );
    let regained: BTreeSet<String> = returned
        .iter()
        .filter(|(_, n)| *n == IDS[victim])
        .map(|(s, _)| s.clone())
        .collect();
    let after_back = stream.sent().len();
    assert!(
        eventually(Duration::from_secs(30), || answered(
            &log,
            &stream.sent(),
            after_back,
            &regained
        ) >= 2 * regained.len()),
        "the restarted node's seats never answered: {:?}\n{}",
        posts(&log),
        f.nodes[victim].log_text()
    );

    // The stream ends; every accepted mention is answered, and once the
    // fleet is quiet (no turn running, every mailbox settled), exactly once.
    let sent = stream.finish();
    let accepted: Vec<&Sent> = sent.iter().filter(|s| s.accepted).collect();
    assert_eq!(
        accepted.len(),
        sent.len(),
        "every mention was accepted by a live ingress node"
    );
    assert!(
        eventually(Duration::from_secs(40), || {
            let by = posts(&log);
            accepted.iter().all(|s| by.contains_key(&s.thread))
        }),
        "unanswered: {:?}",
        {
            let by = posts(&log);
            accepted
                .iter()
                .filter(|s| !by.contains_key(&s.thread))
                .map(|s| s.thread.clone())
                .collect::<Vec<_>>()
        }
    );
    f.wait_quiet(&f.nodes[0]);
    assert_each_answered_once(&log, accepted.iter().map(|s| (s.thread.as_str(), s.seat)));
    let ended = crate::common::events(&f.nodes[0], "turn_ended");
    let outcomes: BTreeSet<&str> = ended
        .iter()
        .map(|e| e["payload"]["outcome"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(
        outcomes,
        BTreeSet::from(["delivered"]),
        "the chat server can say what was posted: no turn is left uncertain"
    );
    eprintln!(
        "{} mentions, each answered once; failover {failover:?}; done after {:?}",
        accepted.len(),
        t0.elapsed()
    );
    // Stopped side by side: each gives its seats back in turn.
    for n in &f.nodes {
        n.signal(libc::SIGTERM);
    }
    let stopping = Instant::now();
    for n in &mut f.nodes {
        assert!(
            n.wait_exit(Duration::from_secs(60)).success(),
            "{}",
            n.log_text()
        );
    }
    eprintln!("the three nodes stopped in {:?}", stopping.elapsed());
}
