//! Seat ownership against a real nats-server: placement, the acquire →
//! equip → attach order and its mirror, batching, verdicts, lost leases.

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer;
use common::*;
use crewlet_company::Active;
use crewlet_coord::{Answer, Owner, ResourceName};
use crewlet_seats::{SeatLeases, SeatState, Seats, SeatsConfig, SeatsError, TurnVerdict};

fn seats_of(names: &[String]) -> Vec<(&str, Option<&str>)> {
    names.iter().map(|n| (n.as_str(), None)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_holds_every_seat_equips_first_and_runs_a_wake_kept_before_it_started() {
    let names = handles(5, "s");
    let env = Env::start(company(&seats_of(&names))).await;
    // Published before any node runs: the mailbox keeps it.
    env.wake("s2", "early-1", None).await;
    // No presence row: the node counts itself anyway.
    let mut node = env.node("n1", Recorder::new(), false).await;
    node.wait_held(5).await;
    let held = node.seats().held();
    assert_eq!(held.len(), 5);
    for h in &held {
        assert_eq!(h.state, SeatState::Admitting);
        assert!(h.epoch >= 1);
        assert_eq!(
            env.holder_of(h.handle.as_str()).await.as_ref(),
            Some(&node.owner),
            "the store names this node as {}'s holder",
            h.handle
        );
    }
    node.host
        .wait("the early wake's run to end", |c| {
            c.iter()
                .any(|c| matches!(c, common::Call::RunEnd { deliveries, .. } if deliveries == &["early-1"]))
        })
        .await;
    // Equip came before the first run, once.
    let s2 = node.host.calls_of("s2");
    let equip = s2
        .iter()
        .position(|c| matches!(c, common::Call::Equip { .. }))
        .unwrap();
    let run = s2
        .iter()
        .position(|c| matches!(c, common::Call::RunStart { .. }))
        .unwrap();
    let hydrate = s2
        .iter()
        .position(|c| matches!(c, common::Call::Hydrate { read: true, .. }))
        .unwrap();
    assert!(equip < hydrate && hydrate < run, "{s2:?}");
    assert_eq!(
        s2.iter()
            .filter(|c| matches!(c, common::Call::Equip { .. }))
            .count(),
        1
    );
    // Acked and confirmed: gone from the interest-retention stream, so it
    // can never be delivered again.
    until("the early wake to leave the stream", || async {
        env.agent_messages().await == 0
    })
    .await;
    let (pending, ack_pending, _) = env.mailbox("s2").await;
    assert_eq!((pending, ack_pending), (0, 0));
    assert_eq!(node.host.runs_of_delivery("early-1"), 1);
    // The fence epoch a turn sees is the lease's.
    let epoch = held
        .iter()
        .find(|h| h.handle.as_str() == "s2")
        .unwrap()
        .epoch;
    assert!(
        node.host
            .calls_of("s2")
            .iter()
            .any(|c| matches!(c, common::Call::RunStart { epoch: e, .. } if *e == epoch))
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_node_takes_half_and_the_first_gives_its_surplus_back() {
    let names = handles(6, "s");
    let env = Env::start(company(&seats_of(&names))).await;
    let mut a = env.node("node-a", Recorder::new(), true).await;
    a.wait_held(6).await;
    let mut b = env.node("node-b", Recorder::new(), true).await;
    a.wait_held(3).await;
    b.wait_held(3).await;
    let (ha, hb) = (a.held_handles(), b.held_handles());
    assert!(ha.is_disjoint(&hb), "{ha:?} / {hb:?}");
    assert_eq!(ha.len() + hb.len(), 6);
    // The store agrees with both.
    for h in &ha {
        assert_eq!(env.holder_of(h).await, Some(a.owner.clone()));
    }
    for h in &hb {
        assert_eq!(env.holder_of(h).await, Some(b.owner.clone()));
    }
    // Each surplus seat was detached and unequipped by A before B equipped it.
    for h in &hb {
        let a_unequip = a.host.calls_of(h).iter().any(|c| {
            matches!(
                c,
                common::Call::Unequip {
                    waiting_pulls: 0,
                    running: 0,
                    ..
                }
            )
        });
        assert!(
            a_unequip,
            "A never cleanly unequipped {h}: {:?}",
            a.host.calls_of(h)
        );
    }
    // Still converged a few heartbeats later: no flapping.
    tokio::time::sleep(HEARTBEAT * 5).await;
    assert_eq!((a.held_handles(), b.held_handles()), (ha, hb));
    b.stop().await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_placement_group_is_shared_on_its_own() {
    let env = Env::start(company(&[
        ("g0", Some("gpu")),
        ("g1", Some("gpu")),
        ("g2", Some("gpu")),
        ("g3", Some("gpu")),
        ("d0", None),
        ("d1", None),
    ]))
    .await;
    let mut a = env.node("node-a", Recorder::new(), true).await;
    let mut b = env.node("node-b", Recorder::new(), true).await;
    a.wait_held(3).await;
    b.wait_held(3).await;
    for n in [&a, &b] {
        let held = n.held_handles();
        let gpu = held.iter().filter(|h| h.starts_with('g')).count();
        let default = held.iter().filter(|h| h.starts_with('d')).count();
        assert!(gpu <= 2 && default <= 1, "{}: {held:?}", n.id);
    }
    let all: BTreeSet<String> = a.held_handles().union(&b.held_handles()).cloned().collect();
    assert_eq!(all.len(), 6);
    b.stop().await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seat_that_fails_to_equip_is_given_back_and_never_attached() {
    let env = Env::start(company(&[("good", None), ("bad", None)])).await;
    let mut node = env
        .node("n1", Recorder::new().failing_equip("bad"), false)
        .await;
    node.wait_held(1).await;
    assert_eq!(node.held_handles(), BTreeSet::from(["good".to_owned()]));
    node.host.wait_equip("bad").await;
    // Released by the node, not lapsed: gone well inside the TTL of the
    // tenure that was won just before equip.
    let equipped_at = Instant::now();
    until("bad's lease to be released", || async {
        env.holder_of("bad").await.is_none()
    })
    .await;
    let took = equipped_at.elapsed();
    assert!(
        took < TTL / 2,
        "bad's lease went only after {took:?}: lapsed, not released"
    );
    env.wake("bad", "to-bad", None).await;
    env.wake("good", "to-good", None).await;
    node.host
        .wait("good's run", |c| {
            c.iter()
                .any(|c| matches!(c, common::Call::RunEnd { deliveries, .. } if deliveries == &["to-good"]))
        })
        .await;
    until("good's wake to be acked", || async {
        env.mailbox("good").await.0 == 0 && env.mailbox("good").await.1 == 0
    })
    .await;
    // Several heartbeats later: bad is backing off (no hot loop), its lease
    // is free, and its wake waits untouched with no pull on its mailbox.
    tokio::time::sleep(HEARTBEAT * 5).await;
    let equips = node
        .host
        .calls_of("bad")
        .iter()
        .filter(|c| matches!(c, common::Call::Equip { .. }))
        .count();
    assert_eq!(equips, 1, "equip retried without backing off");
    assert_eq!(env.holder_of("bad").await, None);
    assert_eq!(env.mailbox("bad").await, (1, 0, 0));
    assert_eq!(node.host.runs_of_delivery("to-bad"), 0);
    assert!(
        !node.host.unequip_called("bad"),
        "a seat that never equipped is not unequipped"
    );
    node.stop().await;
}

/// acquire → equip → hydrate → attach: a seat whose memory cannot be read
/// is held but its mailbox stays detached — its wake waits, unpulled —
/// and the hydration is asked again with backoff (not in a hot loop, the
/// lease kept) until it reads; then the wake runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seat_whose_memory_cannot_be_read_takes_no_work_until_it_can() {
    let env = Env::start(company(&[("amnesiac", None)])).await;
    env.wake("amnesiac", "remember-me", None).await;
    let mut node = env
        .node("n1", Recorder::new().unreadable_memory("amnesiac"), false)
        .await;
    node.host
        .wait("two hydrations that could not read", |c| {
            c.iter()
                .filter(|c| matches!(c, common::Call::Hydrate { read: false, .. }))
                .count()
                >= 2
        })
        .await;
    let holder = env.holder_of("amnesiac").await;
    assert_eq!(holder.as_ref(), Some(&node.owner), "the lease is kept");
    tokio::time::sleep(HEARTBEAT * 3).await;
    assert!(
        node.seats().held().is_empty(),
        "not serving without its memory"
    );
    assert_eq!(node.host.runs_of_delivery("remember-me"), 0);
    assert_eq!(env.mailbox("amnesiac").await, (1, 0, 0), "nothing pulled");
    let tries = node.host.hydrations("amnesiac", false);
    assert!(
        tries <= 8,
        "{tries} hydrations in a few heartbeats: retried without backing off"
    );
    assert_eq!(env.holder_of("amnesiac").await.as_ref(), Some(&node.owner));

    node.host.mend_memory("amnesiac");
    node.host
        .wait("the waiting wake's run", |c| {
            c.iter().any(
                |c| matches!(c, common::Call::RunEnd { deliveries, .. } if deliveries == &["remember-me"]),
            )
        })
        .await;
    assert_eq!(node.host.hydrations("amnesiac", true), 1);
    let equips = node
        .host
        .calls_of("amnesiac")
        .iter()
        .filter(|c| matches!(c, common::Call::Equip { .. }))
        .count();
    assert_eq!(
        equips, 1,
        "equipped once: the retry is the hydration's only"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seat_backing_off_is_claimed_again_at_once_when_the_host_says_what_it_lacked_came() {
    let env = Env::start(company(&[("late", None)])).await;
    let (retry, retry_rx) = tokio::sync::watch::channel(0u64);
    let mut node = env
        .node_with("n1", Recorder::new().failing_equip("late"), false, |cfg| {
            cfg.retry_equip = retry_rx
        })
        .await;
    node.host.wait_equip("late").await;
    until("late's lease to be released", || async {
        env.holder_of("late").await.is_none()
    })
    .await;
    // Backing off (30 s): no second equip on the next heartbeats.
    tokio::time::sleep(HEARTBEAT * 3).await;
    let equips = || {
        node.host
            .calls_of("late")
            .iter()
            .filter(|c| matches!(c, common::Call::Equip { .. }))
            .count()
    };
    assert_eq!(equips(), 1, "equip retried without backing off");
    // What it lacked arrives (on the node: a secret became known).
    node.host.mend_equip("late");
    let moved = Instant::now();
    retry.send_modify(|n| *n += 1);
    node.wait_held(1).await;
    let took = moved.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "held {took:?} after the move: the 30 s backoff held it back"
    );
    assert_eq!(equips(), 2);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_equip_that_hangs_is_dropped_and_the_seat_given_back() {
    let env = Env::start(company(&[("good", None), ("stuck", None)])).await;
    let equip_timeout = Duration::from_millis(400);
    let mut node = env
        .node_with("n1", Recorder::new().hanging_equip("stuck"), false, |cfg| {
            cfg.equip_timeout = equip_timeout
        })
        .await;
    node.wait_held(1).await;
    node.host.wait_equip("stuck").await;
    let called = Instant::now();
    // Held (renewed) while the equip runs, released once it is dropped —
    // well before the lease could have lapsed on its own.
    until("stuck's lease to be released", || async {
        env.holder_of("stuck").await.is_none()
    })
    .await;
    let took = called.elapsed();
    assert!(
        took >= equip_timeout.mul_f64(0.8),
        "released after {took:?}, before the equip timeout"
    );
    assert!(
        took < equip_timeout + TTL / 2,
        "released only after {took:?}: lapsed, not given back"
    );
    env.wake("stuck", "to-stuck", None).await;
    tokio::time::sleep(HEARTBEAT * 5).await;
    assert_eq!(node.held_handles(), BTreeSet::from(["good".to_owned()]));
    assert_eq!(
        env.holder_of("stuck").await,
        None,
        "retried without backing off"
    );
    assert_eq!(env.mailbox("stuck").await, (1, 0, 0), "never attached");
    assert!(
        !node.host.unequip_called("stuck"),
        "a seat whose equip was dropped is not unequipped"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unequip_that_hangs_still_gives_the_lease_back() {
    let env = Env::start(company(&[("s0", None)])).await;
    let unequip_timeout = Duration::from_millis(400);
    let mut node = env
        .node_with("n1", Recorder::new().hanging_unequip("s0"), false, |cfg| {
            cfg.unequip_timeout = unequip_timeout
        })
        .await;
    node.wait_held(1).await;
    let host = node.host.clone();
    let stopping = Instant::now();
    tokio::time::timeout(PATIENCE, node.stop())
        .await
        .expect("stop returned despite the hung unequip");
    let took = stopping.elapsed();
    assert!(
        host.calls_of("s0")
            .iter()
            .any(|c| matches!(c, common::Call::UnequipHung { .. })),
        "unequip was called"
    );
    assert!(
        took >= unequip_timeout.mul_f64(0.8),
        "stopped after {took:?}"
    );
    assert_eq!(env.holder_of("s0").await, None, "s0 still held after stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wakes_of_one_conversation_run_as_one_turn() {
    let env = Env::start(company(&[("ada", None)])).await;
    let mut node = env.node("n1", Recorder::new(), false).await;
    node.wait_held(1).await;
    for d in ["c1-a", "c1-b", "c1-c"] {
        env.wake("ada", d, Some("chan#1")).await;
    }
    node.host
        .wait("the c1 turn", |c| {
            c.iter().any(|c| matches!(c, common::Call::RunEnd { .. }))
        })
        .await;
    let runs = node.host.runs();
    assert_eq!(
        runs,
        vec![(
            "ada".to_owned(),
            Some("chan#1".to_owned()),
            vec!["c1-a".to_owned(), "c1-b".to_owned(), "c1-c".to_owned()]
        )]
    );
    // Two conversations, interleaved: one turn each, each in stream order.
    for (d, c) in [
        ("x-1", "chan#x"),
        ("y-1", "chan#y"),
        ("x-2", "chan#x"),
        ("y-2", "chan#y"),
    ] {
        env.wake("ada", d, Some(c)).await;
    }
    node.host
        .wait("the x and y turns", |c| {
            c.iter()
                .filter(|c| matches!(c, common::Call::RunEnd { .. }))
                .count()
                == 3
        })
        .await;
    let mut later: Vec<_> = node.host.runs()[1..].to_vec();
    later.sort();
    assert_eq!(
        later,
        vec![
            (
                "ada".to_owned(),
                Some("chan#x".to_owned()),
                vec!["x-1".to_owned(), "x-2".to_owned()]
            ),
            (
                "ada".to_owned(),
                Some("chan#y".to_owned()),
                vec!["y-1".to_owned(), "y-2".to_owned()]
            ),
        ]
    );
    until("every wake acked", || async {
        env.agent_messages().await == 0
    })
    .await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_parks_after_the_company_changed_under_it_asks_for_room_at_once() {
    let env = Env::start(company(&[("ada", None)])).await;
    let host = Recorder::new();
    // Parks as a turn does whose caps were read at its start: its window
    // turns over in an hour.
    host.script(
        "k1",
        vec![
            Step {
                take: Duration::from_millis(600),
                verdict: TurnVerdict::Park {
                    after: Duration::from_secs(3600),
                    need: 1,
                    reason: "day window full (test)".into(),
                },
            },
            Step {
                take: Duration::ZERO,
                verdict: TurnVerdict::Done,
            },
        ],
    );
    let mut node = env.node("n1", host, false).await;
    node.wait_held(1).await;
    env.wake("ada", "k1", None).await;
    let runs_of_k1 = |c: &[common::Call]| {
        c.iter()
            .filter(
                |c| matches!(c, common::Call::RunEnd { deliveries, .. } if deliveries == &["k1"]),
            )
            .count()
    };
    node.host
        .wait("k1 to start", |c| {
            c.iter().any(
                |c| matches!(c, common::Call::RunStart { deliveries, .. } if deliveries == &["k1"]),
            )
        })
        .await;
    // A config apply (a raised cap) lands while the turn runs, its gate open.
    env.active.set(Some(Active {
        epoch: crewlet_os::ConfigEpoch(7),
        company: std::sync::Arc::new(company(&[("ada", None)])),
    }));
    node.host
        .wait("k1 to run again at once, not in an hour", |c| {
            runs_of_k1(c) == 2
        })
        .await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_is_delivered_again_and_poison_is_not() {
    let env = Env::start(company(&[("ada", None)])).await;
    let host = Recorder::new();
    host.script(
        "r1",
        vec![Step {
            take: Duration::ZERO,
            verdict: TurnVerdict::Retry {
                after: Duration::from_millis(300),
                reason: "vendor busy (test)".into(),
            },
        }],
    );
    host.script(
        "p1",
        vec![Step {
            take: Duration::ZERO,
            verdict: TurnVerdict::Poison {
                reason: "malformed request (test)".into(),
            },
        }],
    );
    let mut node = env.node("n1", host, false).await;
    node.wait_held(1).await;
    let nakked_at = Instant::now();
    env.wake("ada", "r1", None).await;
    env.wake("ada", "p1", None).await;
    node.host
        .wait("r1 to run twice", |c| {
            c.iter()
                .filter(|c| matches!(c, common::Call::RunEnd { deliveries, .. } if deliveries == &["r1"]))
                .count()
                == 2
        })
        .await;
    assert!(
        nakked_at.elapsed() >= Duration::from_millis(300),
        "redelivered before its delay"
    );
    until("both settled", || async {
        let (pending, ack_pending, _) = env.mailbox("ada").await;
        pending == 0 && ack_pending == 0 && env.agent_messages().await == 0
    })
    .await;
    // Nothing left to deliver: poison was run once and never again.
    assert_eq!(node.host.runs_of_delivery("p1"), 1);
    assert_eq!(node.host.runs_of_delivery("r1"), 2);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_turn_is_kept_in_progress_past_the_ack_wait() {
    let env = Env::start(company(&[("ada", None)])).await;
    // This mailbox forgets an unacked delivery after 1 s.
    let stream = env.js.get_stream(crewlet_bus::AGENT_STREAM).await.unwrap();
    stream
        .delete_consumer(&crewlet_bus::mailbox_durable("ada"))
        .await
        .unwrap();
    stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some(crewlet_bus::mailbox_durable("ada")),
            filter_subject: crewlet_bus::inbox_subject("ada"),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(1),
            ..Default::default()
        })
        .await
        .unwrap();
    let host = Recorder::new();
    host.script(
        "long",
        vec![Step {
            take: Duration::from_millis(2_500),
            verdict: TurnVerdict::Done,
        }],
    );
    let mut node = env.node("n1", host, false).await;
    node.wait_held(1).await;
    env.wake("ada", "long", None).await;
    node.host
        .wait("the long turn to end", |c| {
            c.iter().any(
                |c| matches!(c, common::Call::RunEnd { deliveries, .. } if deliveries == &["long"]),
            )
        })
        .await;
    until("the long wake acked", || async {
        env.agent_messages().await == 0
    })
    .await;
    assert_eq!(
        node.host.runs_of_delivery("long"),
        1,
        "redelivered mid-turn"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_is_not_a_wake_is_terminated_and_blocks_nothing() {
    let env = Env::start(company(&[("ada", None)])).await;
    let mut node = env.node("n1", Recorder::new(), false).await;
    node.wait_held(1).await;
    env.publish_raw("ada", b"{not json".to_vec()).await;
    env.wake("ada", "after-garbage", None).await;
    node.host
        .wait("the valid wake's run", |c| {
            c.iter().any(|c| matches!(c, common::Call::RunEnd { .. }))
        })
        .await;
    until("both gone from the stream", || async {
        env.agent_messages().await == 0
    })
    .await;
    assert_eq!(node.host.runs().len(), 1);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_detaches_then_unequips_then_releases() {
    let names = handles(3, "s");
    let env = Env::start(company(&seats_of(&names))).await;
    let host = Recorder::new();
    host.script(
        "slow",
        vec![Step {
            take: Duration::from_millis(600),
            verdict: TurnVerdict::Done,
        }],
    );
    let mut node = env.node("n1", host, false).await;
    node.wait_held(3).await;
    env.wake("s0", "slow", None).await;
    node.host
        .wait("the slow turn to start", |c| {
            c.iter()
                .any(|c| matches!(c, common::Call::RunStart { deliveries, .. } if deliveries == &["slow"]))
        })
        .await;
    assert_eq!(node.seats().in_flight(), 1);
    let host = node.host.clone();
    node.stop().await;
    // The running turn finished before its seat was unequipped, and no pull
    // request was waiting on any mailbox when its seat was unequipped.
    let s0 = host.calls_of("s0");
    let end = s0
        .iter()
        .position(|c| matches!(c, common::Call::RunEnd { .. }))
        .expect("the slow turn ended");
    let unequip = s0
        .iter()
        .position(|c| matches!(c, common::Call::Unequip { .. }))
        .expect("s0 unequipped");
    assert!(end < unequip, "{s0:?}");
    for n in &names {
        let u: Vec<_> = host
            .calls_of(n)
            .into_iter()
            .filter(|c| matches!(c, common::Call::Unequip { .. }))
            .collect();
        assert_eq!(
            u,
            vec![common::Call::Unequip {
                seat: n.clone(),
                waiting_pulls: 0,
                running: 0
            }]
        );
        assert_eq!(env.holder_of(n).await, None, "{n} still held after stop");
    }
    // The slow wake was acked, not handed back.
    assert_eq!(env.agent_messages().await, 0);
    // Detached: a wake now waits in the mailbox with nobody pulling.
    env.wake("s1", "after-stop", None).await;
    assert_eq!(env.mailbox("s1").await, (1, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_detaches_and_unequips_within_the_ttl() {
    let env = Env::start(company(&[("ada", None), ("bob", None)])).await;
    let mut node = env.node("n1", Recorder::new(), false).await;
    node.wait_held(2).await;
    // Steal ada: force-release its lease in the store, then another owner takes it.
    let name = ResourceName::seat("ada").unwrap();
    let lease = env.coord.get(&name).await.unwrap().yes().expect("ada held");
    let stolen_at = Instant::now();
    assert!(env.coord.release(&lease).await.unwrap().is_yes());
    let thief = Owner("thief/1".into());
    let Answer::Yes(theirs) = env.coord.acquire(&name, &thief, None).await.unwrap() else {
        panic!("the thief could not take ada");
    };
    assert!(theirs.epoch > lease.epoch, "a new tenure has a new epoch");
    // The thief keeps renewing, so ada stays theirs for the whole test.
    let keep = {
        let coord = env.coord.clone();
        tokio::spawn(async move {
            let mut theirs = theirs;
            loop {
                tokio::time::sleep(HEARTBEAT / 2).await;
                if let Ok(Answer::Yes(l)) = coord.renew(&theirs).await {
                    theirs = l;
                }
            }
        })
    };
    node.host
        .wait("ada to be unequipped", |c| {
            c.iter()
                .any(|c| matches!(c, common::Call::Unequip { seat, .. } if seat == "ada"))
        })
        .await;
    let took = stolen_at.elapsed();
    assert!(took < TTL, "gave ada up after {took:?}, over the TTL");
    node.wait_held(1).await;
    assert_eq!(node.held_handles(), BTreeSet::from(["bob".to_owned()]));
    // Our teardown did not release the thief's tenure.
    assert_eq!(env.holder_of("ada").await, Some(thief));
    node.stop().await;
    keep.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seat_removed_from_the_company_is_given_back() {
    let env = Env::start(company(&[("ada", None), ("bob", None)])).await;
    let mut node = env.node("n1", Recorder::new(), false).await;
    node.wait_held(2).await;
    env.active
        .set(Some(Active::local(company(&[("ada", None)]))));
    node.host
        .wait("bob to be unequipped", |c| {
            c.iter()
                .any(|c| matches!(c, common::Call::Unequip { seat, .. } if seat == "bob"))
        })
        .await;
    node.wait_held(1).await;
    until("bob's lease released", || async {
        env.holder_of("bob").await.is_none()
    })
    .await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_that_could_never_work_is_refused() {
    let env = Env::start(company(&[("ada", None)])).await;
    let owner = Owner("n1/x".into());
    let (js, coord) = env.node_coord(&owner).await;
    let host = std::sync::Arc::new(Recorder::new());
    let cfg = |turns: usize, node: &str| {
        let mut c = SeatsConfig::new(
            node,
            owner.clone(),
            SeatLeases::of(&coord),
            js.clone(),
            env.active.clone(),
            host.clone(),
        );
        c.max_concurrent_turns = turns;
        c
    };
    assert_eq!(Seats::start(cfg(0, "n1")).err(), Some(SeatsError::NoTurns));
    let err = Seats::start(cfg(1, ""))
        .err()
        .expect("empty node id refused");
    assert!(err.to_string().contains("node_id"), "{err}");
    let mut c = cfg(1, "n1");
    c.fetch_expiry = Duration::ZERO;
    let err = Seats::start(c).err().expect("zero fetch expiry refused");
    assert!(err.to_string().contains("fetch_expiry"), "{err}");
    assert!(host.calls().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_makes_a_seat_stale_not_lost() {
    let env = Env::start(company(&[("ada", None)])).await;
    let mut node = env.node("n1", Recorder::new(), false).await;
    node.wait_held(1).await;
    let epoch = node.seats().held()[0].epoch;
    let pid = env.server.pid().expect("server pid") as i32;
    // Freeze the broker for well over a heartbeat but under the TTL.
    crewlet_testkit::process::stop(pid);
    let frozen = Instant::now();
    let mut saw_stale = false;
    while frozen.elapsed() < TTL * 6 / 10 {
        let held = node.seats().held();
        assert_eq!(held.len(), 1, "an unknown renew is not loss");
        saw_stale |= held[0].state == SeatState::Stale;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    assert!(
        saw_stale,
        "the seat kept admitting with no good renew for a heartbeat"
    );
    let mut back = false;
    let deadline = Instant::now() + PATIENCE;
    while !back && Instant::now() < deadline {
        back = node.seats().held().first().map(|h| h.state) == Some(SeatState::Admitting);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        back,
        "the seat did not admit again after the store came back"
    );
    // The same tenure, never torn down, and it still serves.
    assert_eq!(node.seats().held()[0].epoch, epoch);
    assert!(
        !node
            .host
            .calls()
            .iter()
            .any(|c| matches!(c, common::Call::Unequip { .. }))
    );
    env.wake("ada", "after-freeze", None).await;
    node.host
        .wait("a run after the freeze", |c| {
            c.iter().any(|c| matches!(c, common::Call::RunEnd { .. }))
        })
        .await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_seats_gives_everything_back_in_the_background() {
    let names = handles(2, "s");
    let env = Env::start(company(&seats_of(&names))).await;
    let mut node = env.node("n1", Recorder::new(), false).await;
    node.wait_held(2).await;
    drop(node.seats.take());
    node.host
        .wait("both seats unequipped", |c| {
            c.iter()
                .filter(|c| matches!(c, common::Call::Unequip { .. }))
                .count()
                == 2
        })
        .await;
    for n in &names {
        until("the lease released", || async {
            env.holder_of(n).await.is_none()
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shedding_node_takes_nothing_off_its_mailboxes_until_it_admits_again() {
    let names = handles(1, "s");
    let env = Env::start(company(&seats_of(&names))).await;
    let (gate, admission) = tokio::sync::watch::channel(false);
    let mut node = env
        .node_with("n1", Recorder::new(), false, |cfg| {
            cfg.admission = admission
        })
        .await;
    node.wait_held(1).await;
    env.wake("s0", "while-shedding", None).await;
    // Held and equipped, but shedding: the wake waits in the mailbox.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(node.host.runs_of_delivery("while-shedding"), 0);
    let (pending, ack_pending, _) = env.mailbox("s0").await;
    assert_eq!((pending, ack_pending), (1, 0), "not even fetched");
    gate.send_replace(true);
    node.host
        .wait("the wake's run once admitting", |c| {
            c.iter().any(
                |c| matches!(c, common::Call::RunEnd { deliveries, .. } if deliveries == &["while-shedding"]),
            )
        })
        .await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_a_previous_holder_handed_back_for_later_runs_when_due() {
    use async_nats::jetstream::AckKind;
    use futures::StreamExt;
    let names = handles(1, "s");
    let env = Env::start(company(&seats_of(&names))).await;
    env.wake("s0", "handed-back", None).await;
    // A previous holder took the wake and handed it back for later: it is
    // due again in 2 s, and no publish rings the mailbox's doorbell then.
    let c: consumer::PullConsumer = env
        .js
        .get_consumer_from_stream(
            crewlet_bus::mailbox_durable("s0"),
            crewlet_bus::AGENT_STREAM,
        )
        .await
        .unwrap();
    let mut batch = c.fetch().max_messages(1).messages().await.unwrap();
    let taken = batch.next().await.unwrap().unwrap();
    taken
        .ack_with(AckKind::Nak(Some(Duration::from_secs(2))))
        .await
        .unwrap();
    let handed_back = Instant::now();
    let mut node = env.node("n1", Recorder::new(), false).await;
    node.wait_held(1).await;
    // Attached while the wake is not yet due: its attach fetch finds
    // nothing, no publish rings, and the sweep is 30 s away; the consumer
    // holding a wake not delivered here keeps the mailbox fetching.
    assert!(handed_back.elapsed() < Duration::from_secs(2));
    node.host
        .wait("the handed-back wake's run", |c| {
            c.iter().any(
                |c| matches!(c, common::Call::RunEnd { deliveries, .. } if deliveries == &["handed-back"]),
            )
        })
        .await;
    assert!(handed_back.elapsed() >= Duration::from_secs(2));
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_no_doorbell_announced_is_found_by_the_sweep() {
    use async_nats::jetstream::stream::{Config, Source, StorageType, SubjectTransform};
    use futures::StreamExt;
    let names = handles(1, "s");
    let env = Env::start(company(&seats_of(&names))).await;
    let mut node = env
        .node_with("n1", Recorder::new(), false, |cfg| {
            cfg.idle_fetch = Duration::from_millis(500)
        })
        .await;
    node.wait_held(1).await;
    // The mailbox is idle: its attach fetch came back empty and holds no
    // pull request open.
    let idle = Instant::now() + PATIENCE;
    while env.mailbox("s0").await.2 > 0 {
        assert!(Instant::now() < idle, "the mailbox never went idle");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A wake enters the mailbox's stream with no publish on its inbox
    // subject, as one whose ring was lost would: sourced from a side
    // stream, its subject rewritten to the inbox's. Nothing rings.
    env.js
        .create_stream(Config {
            name: "SIDE".into(),
            subjects: vec!["side.>".into()],
            storage: StorageType::Memory,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut agent = env
        .js
        .get_stream(crewlet_bus::AGENT_STREAM)
        .await
        .unwrap()
        .cached_info()
        .config
        .clone();
    agent.sources = Some(vec![Source {
        name: "SIDE".into(),
        subject_transforms: vec![SubjectTransform {
            source: "side.*".into(),
            destination: crewlet_bus::inbox_subject("{{wildcard(1)}}"),
        }],
        ..Default::default()
    }]);
    env.js.update_stream(agent).await.unwrap();
    let mut ring = env
        .client
        .subscribe(crewlet_bus::inbox_subject("s0"))
        .await
        .unwrap();
    let w = crewlet_bus::Wake {
        trace_id: "trace-unrung".into(),
        delivery_id: "unrung".into(),
        source: "test".into(),
        event_type: "ping".into(),
        handle: "s0".into(),
        seat_id: String::new(),
        reason: "route".into(),
        text: None,
        conversation: None,
        channel: None,
        thread: None,
        owed: None,
        sender: None,
    };
    env.js
        .publish("side.s0", serde_json::to_vec(&w).unwrap().into())
        .await
        .unwrap()
        .await
        .unwrap();
    node.host
        .wait("the unannounced wake's run", |c| {
            c.iter().any(
                |c| matches!(c, common::Call::RunEnd { deliveries, .. } if deliveries == &["unrung"]),
            )
        })
        .await;
    // And it was found by the sweep, not by a ring.
    let rang = tokio::time::timeout(Duration::from_millis(100), ring.next()).await;
    assert!(rang.is_err(), "a sourced wake rang the inbox subject");
    node.stop().await;
}
