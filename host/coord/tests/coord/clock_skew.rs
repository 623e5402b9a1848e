//! Leases judged on the broker's clock, on a real nats-server: two nodes
//! whose wall clocks are a minute ahead and a minute behind hold their seat
//! and duty leases for several TTLs with neither taking the other's, and
//! each takes the other's once it stops renewing — after its deadline,
//! within a few seconds of it. (On the node's own clock, the one ahead took
//! the other's live leases at once and judged its own lapsed on renew; the
//! one behind waited a minute past a dead holder's deadline.)

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crewlet_coord::bucket::{Bucket, Retentions};
use crewlet_coord::{Answer, Clock, Coord, CoordOptions, Held, Lease, NatsKv, Owner, ResourceName};
use crewlet_testkit::NatsServer;

/// The seat lease TTL (the leases bucket's age) and every duty's TTL here.
const TTL: Duration = Duration::from_secs(3);
/// How often a holder renews (a sixth of the TTL, as the duties do).
const BEAT: Duration = Duration::from_millis(500);
const SKEW: Duration = Duration::from_secs(60);

/// A node's wall clock, off by a fixed amount.
struct Skewed {
    ahead: bool,
}

impl Clock for Skewed {
    fn now(&self) -> SystemTime {
        if self.ahead {
            SystemTime::now() + SKEW
        } else {
            SystemTime::now() - SKEW
        }
    }
}

async fn node(url: &str, namespace: &str, ahead: bool) -> (Coord, Owner) {
    let owner = Owner::incarnation(if ahead { "ahead" } else { "behind" });
    let mut opts = CoordOptions::new(owner.clone());
    opts.namespace = namespace.to_owned();
    opts.lease_ttl = TTL;
    opts.heartbeat = BEAT;
    opts.request_timeout = Duration::from_secs(2);
    let retentions = Retentions {
        lease_ttl: TTL,
        status: opts.status_age,
        rate: opts.rate_age,
    };
    let client = async_nats::connect(url).await.expect("connect");
    let kv = NatsKv::open(
        client,
        namespace,
        &Bucket::ALL,
        &retentions,
        1,
        opts.request_timeout,
    )
    .await
    .expect("open buckets")
    .with_wall_clock(Arc::new(Skewed { ahead }));
    let kv = Arc::new(kv);
    (Coord::with_backends(kv.clone(), kv, opts), owner)
}

fn names(who: &str) -> [ResourceName; 2] {
    [
        ResourceName::seat(&format!("seat-{who}")).unwrap(),
        ResourceName::worker(&format!("duty-{who}")).unwrap(),
    ]
}

fn ttl_for(name: &ResourceName) -> Option<Duration> {
    (name.class() == "worker").then_some(TTL)
}

async fn acquire_all(c: &Coord, owner: &Owner, names: &[ResourceName; 2]) -> Vec<Lease> {
    let mut out = Vec::new();
    for n in names {
        match c.acquire(n, owner, ttl_for(n)).await {
            Ok(Answer::Yes(l)) => out.push(l),
            other => panic!("{owner} could not acquire free {n}: {other:?}"),
        }
    }
    out
}

/// Renews every lease once; panics on anything but yes. Returns when the
/// last renew was sent.
async fn renew_all(c: &Coord, leases: &mut [Lease]) -> Instant {
    let sent = Instant::now();
    for l in leases.iter_mut() {
        match c.renew(l).await {
            Ok(Answer::Yes(next)) => *l = next,
            other => panic!("{} lost its live {} on renew: {other:?}", l.owner, l.name),
        }
    }
    sent
}

/// Tries to take each of `names`; panics if any is taken.
async fn must_not_take(c: &Coord, thief: &Owner, holder: &Owner, names: &[ResourceName; 2]) {
    for n in names {
        match c.acquire(n, thief, ttl_for(n)).await {
            Ok(Answer::No(Held::By { owner, .. })) if &owner == holder => {}
            other => panic!("{thief} was not refused {holder}'s live {n}: {other:?}"),
        }
        match c.get(n).await {
            Ok(Answer::Yes(l)) if &l.owner == holder => {}
            other => panic!("{thief} does not see {holder} holding {n}: {other:?}"),
        }
    }
}

/// Takes `names` once free; returns when each was taken.
async fn take_when_free(c: &Coord, taker: &Owner, names: &[ResourceName; 2]) -> Vec<Instant> {
    let give_up = Instant::now() + TTL + Duration::from_secs(10);
    let mut at = Vec::new();
    for n in names {
        loop {
            match c.acquire(n, taker, ttl_for(n)).await {
                Ok(Answer::Yes(_)) => break,
                Ok(Answer::No(_)) => {}
                Err(e) => panic!("{taker} got unknown on {n}: {e}"),
            }
            assert!(Instant::now() < give_up, "{taker} never took {n}");
            // Polling, as a peer's placement tick would.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        at.push(Instant::now());
    }
    at
}

/// Holds both nodes' leases for three TTLs, each node trying to take the
/// other's between its renews; then one stops and the other takes over.
async fn hold_then_hand_over(first_stops_ahead: bool) {
    let server = NatsServer::start();
    let ns = format!("skew{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let (ahead, a_owner) = node(&server.url(), &ns, true).await;
    let (behind, b_owner) = node(&server.url(), &ns, false).await;
    let (a_names, b_names) = (names("a"), names("b"));
    let mut a_leases = acquire_all(&ahead, &a_owner, &a_names).await;
    let mut b_leases = acquire_all(&behind, &b_owner, &b_names).await;

    let until = Instant::now() + 3 * TTL;
    let (mut a_sent, mut b_sent) = (Instant::now(), Instant::now());
    while Instant::now() < until {
        a_sent = renew_all(&ahead, &mut a_leases).await;
        b_sent = renew_all(&behind, &mut b_leases).await;
        must_not_take(&ahead, &a_owner, &b_owner, &b_names).await;
        must_not_take(&behind, &b_owner, &a_owner, &a_names).await;
        // The holders' heartbeat.
        tokio::time::sleep(BEAT).await;
    }
    let (stopped, taker, taker_owner, names, last_sent) = if first_stops_ahead {
        ("ahead", &behind, &b_owner, &a_names, a_sent)
    } else {
        ("behind", &ahead, &a_owner, &b_names, b_sent)
    };
    let took = take_when_free(taker, taker_owner, names).await;
    for (n, t) in names.iter().zip(took) {
        let after = t.duration_since(last_sent);
        // Never before the broker's deadline (counted from a write sent
        // no earlier than `last_sent`), and soon after it.
        assert!(
            after >= TTL,
            "{taker_owner} took {n} {after:?} after {stopped}'s last renew, before its TTL"
        );
        assert!(
            after <= TTL + Duration::from_secs(3),
            "{taker_owner} took {n} {after:?} after {stopped}'s last renew: late"
        );
    }
}

#[tokio::test]
async fn a_node_ahead_takes_nothing_live_and_takes_over_a_stopped_one_in_time() {
    hold_then_hand_over(false).await;
}

#[tokio::test]
async fn a_node_behind_takes_nothing_live_and_takes_over_a_stopped_one_in_time() {
    hold_then_hand_over(true).await;
}

/// Delivery claims on the broker's clock: a node a minute ahead is refused
/// a peer's live claim and releases its own live one; a node a minute
/// behind takes a lapsed claim within seconds of its deadline. (On the
/// node's own clock, the one ahead took every live claim for lapsed — a
/// redelivery worked twice — and left its own in place on release; the
/// one behind was refused a lapsed claim for a minute.)
#[tokio::test]
async fn delivery_claims_lapse_on_the_brokers_clock() {
    let server = NatsServer::start();
    let ns = format!("skewc{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let (ahead, _) = node(&server.url(), &ns, true).await;
    let (behind, _) = node(&server.url(), &ns, false).await;

    match behind.claim_delivery("github:live", "behind/1", TTL).await {
        Ok(Answer::Yes(())) => {}
        other => panic!("a free delivery was not claimed: {other:?}"),
    }
    match ahead.claim_delivery("github:live", "ahead/1", TTL).await {
        Ok(Answer::No(c)) => assert_eq!(c.claimant, "behind/1"),
        other => panic!("the node ahead took a live claim: {other:?}"),
    }

    match ahead.claim_delivery("github:own", "ahead/2", TTL).await {
        Ok(Answer::Yes(())) => {}
        other => panic!("a free delivery was not claimed: {other:?}"),
    }
    match ahead.release_claim("github:own", "ahead/2").await {
        Ok(Answer::Yes(())) => {}
        other => panic!("the node ahead did not release its own live claim: {other:?}"),
    }
    match behind.claim_delivery("github:own", "behind/2", TTL).await {
        Ok(Answer::Yes(())) => {}
        other => panic!("a released claim was not claimable: {other:?}"),
    }

    let sent = Instant::now();
    match ahead.claim_delivery("github:lapses", "ahead/3", TTL).await {
        Ok(Answer::Yes(())) => {}
        other => panic!("a free delivery was not claimed: {other:?}"),
    }
    let give_up = sent + TTL + Duration::from_secs(10);
    loop {
        match behind
            .claim_delivery("github:lapses", "behind/3", TTL)
            .await
        {
            Ok(Answer::Yes(())) => break,
            Ok(Answer::No(c)) => assert_eq!(c.claimant, "ahead/3"),
            Err(e) => panic!("the claim answered unknown: {e}"),
        }
        assert!(
            Instant::now() < give_up,
            "the node behind was refused a lapsed claim"
        );
        // Polling, as a sender's retries would.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = sent.elapsed();
    assert!(
        after >= TTL,
        "the claim was taken {after:?} after it was made, before its TTL"
    );
    assert!(
        after <= TTL + Duration::from_secs(3),
        "the claim was taken {after:?} after it was made: late"
    );
}
