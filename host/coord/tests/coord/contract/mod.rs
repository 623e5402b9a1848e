//! The contract suite: one set of cases, run unchanged against the memory
//! twin, a single nats-server and a 3-node cluster (see `contract_suite!`).
#![allow(dead_code)]

pub mod fixtures;
mod follows;
mod records;
mod tenancy;

pub use follows::{follows_one_key_per_thread, follows_unknown_is_not_nobody};
pub use records::{replace_record, typed_claims};
pub use tenancy::{
    tenancy_holds_renews_and_releases, tenancy_refused_is_no_at_once, tenancy_unknown_is_not_no,
};

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crewlet_coord::budget::{Caps, Scope, Windows};
use crewlet_coord::kv::{Change, Expect};
use crewlet_coord::{
    Answer, Bucket, BucketName, CoordError, Existing, FenceEpoch, Held, MAX_DUTY_TTL, NamedError,
    NamedSpec, NodeStatus, NotHeld, Owner, Pointer, Refused, ResourceName, Unreleased, key_hint,
    merge_cooldowns,
};
use fixtures::Fixture;
use time::UtcOffset;
use time::macros::datetime;

/// The heavy cases (hundreds of concurrent calls each) run one at a time:
/// they test the store's arbitration, and on a 2-core runner running them
/// together with three servers starves the CPU instead.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn name(s: &str) -> ResourceName {
    ResourceName::parse(s).unwrap()
}

fn owner(s: &str) -> Owner {
    Owner(format!("{s}/{}", uuid::Uuid::new_v4().simple()))
}

fn fresh(class: &str) -> ResourceName {
    name(&format!("{class}:{}", uuid::Uuid::new_v4().simple()))
}

/// Acquire, renew, release and the epoch rules.
pub async fn acquire_renew_release_and_epochs<F: Fixture>(f: &F) {
    let c = f.coord(0);
    let (a, b) = (owner("a"), owner("b"));
    let seat = fresh("seat");
    let la = c
        .acquire(&seat, &a, None)
        .await
        .unwrap()
        .yes()
        .expect("a acquires a free seat");
    assert_eq!(la.epoch, 1);
    assert_eq!(
        c.acquire(&seat, &b, None).await.unwrap(),
        Answer::No(Held::By {
            owner: a.clone(),
            epoch: FenceEpoch(1)
        })
    );
    // The same owner asking again is the same tenure.
    assert_eq!(
        c.acquire(&seat, &a, None)
            .await
            .unwrap()
            .yes()
            .unwrap()
            .epoch,
        1
    );
    let la = c.renew(&la).await.unwrap().yes().expect("holder renews");
    assert_eq!(la.epoch, 1);
    assert_eq!(c.get(&seat).await.unwrap().yes().unwrap().owner, a);
    c.release(&la)
        .await
        .unwrap()
        .yes()
        .expect("holder releases");
    assert_eq!(c.get(&seat).await.unwrap(), Answer::No(NotHeld::Free));
    assert!(
        c.renew(&la).await.unwrap().is_no(),
        "a released tenure does not renew"
    );
    // Kept across release, bumped on every new tenure.
    assert_eq!(c.epoch(&seat).await.unwrap(), 1);
    let lb = c.acquire(&seat, &b, None).await.unwrap().yes().unwrap();
    assert_eq!(lb.epoch, 2);
    assert!(
        c.release(&la).await.unwrap().is_no(),
        "a stale tenure cannot release"
    );
    c.release(&lb).await.unwrap().yes().unwrap();
    assert_eq!(
        c.acquire(&seat, &a, None)
            .await
            .unwrap()
            .yes()
            .unwrap()
            .epoch,
        3
    );

    // The same owner after a lapse gets a new epoch.
    let seat2 = fresh("seat");
    let l1 = c.acquire(&seat2, &a, None).await.unwrap().yes().unwrap();
    f.pass(c.lease_ttl() + Duration::from_millis(300)).await;
    assert_eq!(c.get(&seat2).await.unwrap(), Answer::No(NotHeld::Free));
    assert!(
        c.renew(&l1).await.unwrap().is_no(),
        "a lapsed lease does not renew"
    );
    let l2 = c.acquire(&seat2, &a, None).await.unwrap().yes().unwrap();
    assert_eq!(l2.epoch, l1.epoch.next());
    // Presence leases live with seats and carry status.
    let me = owner("node");
    let st = NodeStatus {
        roles: vec!["seats".into()],
        turns_in_flight: Some(3),
        posture: Some("serve".into()),
        ..Default::default()
    };
    let node_id = uuid::Uuid::new_v4().simple().to_string();
    let p = c
        .acquire_presence(&node_id, &me, st.clone())
        .await
        .unwrap()
        .yes()
        .unwrap();
    assert_eq!(
        c.get(&p.name).await.unwrap().yes().unwrap().status,
        Some(st.clone())
    );
    let st2 = NodeStatus {
        draining: Some(true),
        ..st
    };
    c.renew_presence(&p, st2.clone())
        .await
        .unwrap()
        .yes()
        .unwrap();
    assert_eq!(
        c.get(&p.name).await.unwrap().yes().unwrap().status,
        Some(st2)
    );
}

/// A refused renew or release writes nothing.
pub async fn refused_calls_write_nothing<F: Fixture>(f: &F) {
    let c = f.coord(0);
    let (a, b) = (owner("a"), owner("b"));
    let seat = fresh("seat");
    let la = c.acquire(&seat, &a, None).await.unwrap().yes().unwrap();
    let before = c.get(&seat).await.unwrap().yes().unwrap();
    let mut other_owner = la.clone();
    other_owner.owner = b.clone();
    let mut other_epoch = la.clone();
    other_epoch.epoch = other_epoch.epoch.next();
    let forged = [other_owner, other_epoch];
    for bad in &forged {
        assert!(c.renew(bad).await.unwrap().is_no());
        assert!(c.release(bad).await.unwrap().is_no());
    }
    assert!(c.acquire(&seat, &b, None).await.unwrap().is_no());
    let after = c.get(&seat).await.unwrap().yes().unwrap();
    assert_eq!(
        before.revision, after.revision,
        "a refused call wrote the lease"
    );
    assert_eq!(
        c.epoch(&seat).await.unwrap(),
        la.epoch,
        "a refused call moved the epoch"
    );
}

/// 32 claimants on one fresh seat: exactly one wins, at epoch 1.
pub async fn stampede<F: Fixture>(f: &F) {
    let _heavy = HEAVY.lock().await;
    let seat = fresh("seat");
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let c = f.coord(i);
            let seat = seat.clone();
            tokio::spawn(async move { c.acquire(&seat, &owner(&format!("s{i}")), None).await })
        })
        .collect();
    let mut wins = Vec::new();
    for t in tasks {
        match t.await.unwrap().unwrap() {
            Answer::Yes(l) => wins.push(l),
            Answer::No(_) => {}
        }
    }
    assert_eq!(wins.len(), 1, "exactly one claimant wins: {wins:?}");
    assert_eq!(wins[0].epoch, 1);
    let got = f.coord(0).get(&seat).await.unwrap().yes().unwrap();
    assert_eq!(
        (got.owner, got.epoch),
        (wins[0].owner.clone(), FenceEpoch(1))
    );
}

/// 8 workers × 150 acquire/renew/release at a tiny TTL with readers
/// alongside: no epoch is ever handed to (or read as held by) two owners.
pub async fn no_epoch_to_two_owners<F: Fixture>(f: &Arc<F>) {
    let _heavy = HEAVY.lock().await;
    let duty = fresh("worker");
    let granted: Arc<Mutex<HashMap<FenceEpoch, Owner>>> = Arc::default();
    let observed: Arc<Mutex<Vec<(FenceEpoch, Owner)>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ttl = Duration::from_millis(15);
    let mut workers = Vec::new();
    for w in 0..8 {
        let (f, duty, granted) = (f.clone(), duty.clone(), granted.clone());
        workers.push(tokio::spawn(async move {
            let c = f.coord(w);
            let me = owner(&format!("w{w}"));
            for i in 0..150 {
                if let Answer::Yes(l) = c.acquire(&duty, &me, Some(ttl)).await.unwrap() {
                    let prev = granted.lock().unwrap().insert(l.epoch, me.clone());
                    assert!(
                        prev.as_ref().is_none_or(|p| *p == me),
                        "epoch {} handed to {prev:?} and {me}",
                        l.epoch
                    );
                    if let Answer::Yes(l) = c.renew(&l).await.unwrap() {
                        assert_eq!(granted.lock().unwrap().get(&l.epoch), Some(&me));
                        if i % 2 == 0 {
                            let _ = c.release(&l).await.unwrap();
                        }
                    }
                }
                f.pass(Duration::from_millis(if i % 3 == 0 { 8 } else { 1 }))
                    .await;
            }
        }));
    }
    let mut readers = Vec::new();
    for r in 0..2 {
        let (f, duty, observed, stop) = (f.clone(), duty.clone(), observed.clone(), stop.clone());
        readers.push(tokio::spawn(async move {
            let c = f.coord(r + 1);
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if let Answer::Yes(l) = c.get(&duty).await.unwrap() {
                    observed.lock().unwrap().push((l.epoch, l.owner));
                }
                tokio::task::yield_now().await;
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for r in readers {
        r.await.unwrap();
    }
    let granted = granted.lock().unwrap();
    assert!(
        granted.len() >= 8,
        "too few tenures to prove anything: {}",
        granted.len()
    );
    let mut epochs: Vec<FenceEpoch> = granted.keys().copied().collect();
    epochs.sort();
    assert_eq!(epochs.windows(2).filter(|w| w[0] == w[1]).count(), 0);
    for (epoch, who) in observed.lock().unwrap().iter() {
        assert_eq!(
            granted.get(epoch),
            Some(who),
            "a reader saw epoch {epoch} held by {who}"
        );
    }
}

/// Unknown is never a refusal: with the store broken or stopped every verb
/// answers unavailable; a renew's unknown leaves the lease intact; an
/// acquire whose answer was lost is re-claimed by its owner at its epoch.
pub async fn unknown_is_never_a_refusal<F: Fixture>(f: &F) {
    use futures::FutureExt;
    let c = f.coord(0);
    let a = owner("a");
    let seat = fresh("seat");
    // A duty long enough to outlive the outage on a real clock.
    let duty = fresh("worker");
    let la = c
        .acquire(&duty, &a, Some(Duration::from_secs(120)))
        .await
        .unwrap()
        .yes()
        .unwrap();
    let w = Windows::of(time::macros::date!(2026 - 09 - 23));
    let caps = Caps {
        day: Some(100),
        ..Default::default()
    };
    f.break_store().await;
    let hint = key_hint("sk-test");
    let other_seat = fresh("seat");
    let now = SystemTime::now();
    type Verb<'a> = futures::future::BoxFuture<'a, (&'static str, Result<(), CoordError>)>;
    let verbs: Vec<Verb<'_>> = vec![
        c.acquire(&other_seat, &a, None)
            .map(|r| ("acquire", r.map(|_| ())))
            .boxed(),
        c.renew(&la).map(|r| ("renew", r.map(|_| ()))).boxed(),
        c.release(&la).map(|r| ("release", r.map(|_| ()))).boxed(),
        c.get(&seat).map(|r| ("get", r.map(|_| ()))).boxed(),
        c.epoch(&seat).map(|r| ("epoch", r.map(|_| ()))).boxed(),
        c.list_live("seat")
            .map(|r| ("list_live", r.map(|_| ())))
            .boxed(),
        c.claim("d-1", "x", Duration::from_secs(60))
            .map(|r| ("claim", r.map(|_| ())))
            .boxed(),
        c.completed("t-1")
            .map(|r| ("completed", r.map(|_| ())))
            .boxed(),
        c.complete("t-1").map(|r| ("complete", r)).boxed(),
        c.admit("valve", 5, Duration::from_secs(10))
            .map(|r| ("admit", r.map(|_| ())))
            .boxed(),
        c.bench("fast", &hint, now).map(|r| ("bench", r)).boxed(),
        c.cooldowns().map(|r| ("cooldowns", r.map(|_| ()))).boxed(),
        c.charge("s", &w, &caps, &caps, 1)
            .map(|r| ("charge", r.map(|_| ())))
            .boxed(),
        c.refuse("s", &w, &caps, &caps)
            .map(|r| ("refuse", r.map(|_| ())))
            .boxed(),
        c.budget(&Scope::Company, &w)
            .map(|r| ("budget", r.map(|_| ())))
            .boxed(),
        c.active_config()
            .map(|r| ("active_config", r.map(|_| ())))
            .boxed(),
        c.activate("r1", None)
            .map(|r| ("activate", r.map(|_| ())))
            .boxed(),
        c.node_status("n")
            .map(|r| ("node_status", r.map(|_| ())))
            .boxed(),
        c.statuses().map(|r| ("statuses", r.map(|_| ()))).boxed(),
        c.watch_seat_pauses()
            .map(|r| ("watch_seat_pauses", r.map(|_| ())))
            .boxed(),
    ];
    for (verb, r) in futures::future::join_all(verbs).await {
        assert!(
            matches!(r, Err(ref e) if e.is_unavailable()),
            "{verb} on a broken store answered {r:?}, not unavailable"
        );
    }
    let mut bench = HashMap::new();
    bench.insert(
        ("fast".to_owned(), hint.clone()),
        SystemTime::now() + Duration::from_secs(60),
    );
    let snapshot = bench.clone();
    merge_cooldowns(&mut bench, &c.cooldowns().await);
    assert_eq!(bench, snapshot, "an unreadable store un-benched a key");
    f.heal_store().await;
    let la2 = c
        .renew(&la)
        .await
        .unwrap()
        .yes()
        .expect("the lease survived the unknown renew");
    assert_eq!(la2.epoch, la.epoch);

    // An acquire whose answer was lost: the owner asks again, same epoch.
    let seat3 = fresh("seat");
    f.lose_acks();
    let lost = c.acquire(&seat3, &a, None).await;
    assert!(matches!(lost, Err(ref e) if e.is_unavailable()), "{lost:?}");
    f.heal_store().await;
    let again = c
        .acquire(&seat3, &a, None)
        .await
        .unwrap()
        .yes()
        .expect("the owner re-claims");
    assert_eq!(
        again.epoch, 1,
        "the abandoned claim's owner re-claims at the same epoch"
    );
    assert!(c.acquire(&seat3, &owner("b"), None).await.unwrap().is_no());
}

/// Awkward names round-trip and stay distinct, through leases and listing.
pub async fn awkward_names<F: Fixture>(f: &F) {
    let c = f.coord(0);
    let a = owner("a");
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let ids = [
        "a.b", "a_2Eb", "a_b", "a b", "ünï", "a/b", "a:b", "A", "*", ">", "a_", "x=y", "a-b",
    ];
    let mut names = BTreeSet::new();
    for id in ids {
        let n = name(&format!("seat:{tag}{id}"));
        c.acquire(&n, &a, None).await.unwrap().yes().unwrap();
        names.insert(n);
    }
    for n in &names {
        assert_eq!(c.get(n).await.unwrap().yes().unwrap().name, *n);
    }
    let listed: Vec<ResourceName> = c
        .list_live("seat")
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.name)
        .filter(|n| n.id().starts_with(&tag))
        .collect();
    assert_eq!(listed.len(), names.len(), "{listed:?}");
    assert_eq!(listed.into_iter().collect::<BTreeSet<_>>(), names);
    for bad in ["seat:", ":x", "seat:a::b", "noclass"] {
        assert!(matches!(
            ResourceName::parse(bad),
            Err(CoordError::InvalidName { .. })
        ));
    }
    assert!(matches!(
        c.list_live("").await,
        Err(CoordError::InvalidName { .. })
    ));
    assert!(matches!(
        c.list_live("se.at").await,
        Err(CoordError::InvalidName { .. })
    ));
}

/// The duty ceiling is 3 h on every backend; a duty lapses at its own deadline.
pub async fn duty_ceiling_and_deadline<F: Fixture>(f: &F) {
    let c = f.coord(0);
    let a = owner("a");
    let over = c
        .acquire(
            &fresh("worker"),
            &a,
            Some(MAX_DUTY_TTL + Duration::from_secs(1)),
        )
        .await;
    match over {
        Err(e @ CoordError::TtlAboveCeiling { .. }) => {
            assert!(e.to_string().contains("10800s"), "{e}")
        }
        other => panic!("above the ceiling answered {other:?}"),
    }
    assert!(
        c.acquire(&fresh("move"), &a, Some(MAX_DUTY_TTL))
            .await
            .unwrap()
            .is_yes()
    );
    assert!(
        c.acquire(&fresh("worker"), &a, None).await.is_err(),
        "a duty must name its TTL"
    );
    let seat_over = c.acquire(&fresh("seat"), &a, Some(c.lease_ttl() * 2)).await;
    assert!(
        matches!(seat_over, Err(CoordError::TtlAboveBucketAge { .. })),
        "{seat_over:?}"
    );
    // A short duty lapses at its record's deadline, not the bucket's age.
    let duty = fresh("worker");
    let l = c
        .acquire(&duty, &a, Some(Duration::from_millis(300)))
        .await
        .unwrap()
        .yes()
        .unwrap();
    assert!(
        c.acquire(&duty, &owner("b"), Some(Duration::from_secs(60)))
            .await
            .unwrap()
            .is_no()
    );
    f.pass(Duration::from_millis(450)).await;
    let lb = c
        .acquire(&duty, &owner("b"), Some(Duration::from_secs(60)))
        .await
        .unwrap()
        .yes()
        .unwrap();
    assert_eq!(lb.epoch, l.epoch.next());
    assert_eq!(
        c.list_live("worker")
            .await
            .unwrap()
            .iter()
            .filter(|x| x.name == duty)
            .count(),
        1
    );
}

/// Listing under churn: 5 presence leases, 3 renewed in tight loops, 3,000
/// listings. Each listing holds a key at most once, nothing but the five,
/// and every lease its holder knew live from before the listing began until
/// after it ended (the deadline of its last good renew).
///
/// A lease may lapse for real: a fresh-clone CI run (the e2e lane loading
/// both cores beside it) saw a renew come later than the 2 s TTL. Then the
/// lease is free, a listing is right to leave it out, and its holder takes
/// it again. A renew refused while the holder's own deadline had not passed
/// is the store's fault, and fails the test. A stall can also make a call
/// answer unknown: a renew that does keeps its lease (as a holder does), a
/// listing that does is not an answer to check — only wrong answers fail.
/// (Such a renew may land after the stall, making the lease its holder's
/// again: then it is not free to take, and that is right too.)
pub async fn listing_under_churn<F: Fixture>(f: &Arc<F>) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    fn ms(t: SystemTime) -> u64 {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64
    }

    let _heavy = HEAVY.lock().await;
    let c = f.coord(0);
    let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let mut leases = Vec::new();
    for i in 0..5 {
        let node_id = format!("{tag}-{i}");
        let l = c
            .acquire_presence(&node_id, &owner(&node_id), NodeStatus::default())
            .await
            .unwrap()
            .yes()
            .unwrap();
        leases.push((node_id, l));
    }
    let expected: BTreeSet<ResourceName> = leases.iter().map(|(_, l)| l.name.clone()).collect();
    // Each holder's last known deadline, in Unix milliseconds (rounded down).
    let known: Arc<Vec<AtomicU64>> = Arc::new(
        leases
            .iter()
            .map(|(_, l)| AtomicU64::new(ms(l.deadline)))
            .collect(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let mut renewers = Vec::new();
    for (i, (node_id, l)) in leases.iter().enumerate() {
        let (f, stop, known) = (f.clone(), stop.clone(), known.clone());
        let (node_id, mut held) = (node_id.clone(), l.clone());
        let tight = i < 3;
        renewers.push(tokio::spawn(async move {
            let c = f.coord(i);
            let (mut renews, mut lapses, mut unknown) = (0u64, 0u64, 0u64);
            while !stop.load(Ordering::SeqCst) {
                let Ok(answer) = c.renew(&held).await else {
                    unknown += 1;
                    continue;
                };
                held = match answer {
                    Answer::Yes(l) => l,
                    Answer::No(NotHeld::Free) => {
                        let now = f.now();
                        assert!(
                            now >= held.deadline,
                            "a renew refused as free {:?} before its holder's deadline",
                            held.deadline.duration_since(now).unwrap_or_default()
                        );
                        lapses += 1;
                        let again = loop {
                            match c
                                .acquire_presence(&node_id, &owner(&node_id), NodeStatus::default())
                                .await
                            {
                                Ok(a) => break a,
                                Err(_) => unknown += 1,
                            }
                        };
                        match again {
                            Answer::Yes(l) => l,
                            // A renew that answered unknown during the
                            // stall landed after all: the lease is ours again.
                            Answer::No(Held::By { owner, epoch })
                                if owner == held.owner && epoch == held.epoch =>
                            {
                                held
                            }
                            Answer::No(other) => {
                                panic!("a lapsed presence lease refused: {other:?}")
                            }
                        }
                    }
                    Answer::No(other) => panic!("renew under churn refused: {other:?}"),
                };
                known[i].store(ms(held.deadline), Ordering::SeqCst);
                renews += 1;
                if tight {
                    tokio::task::yield_now().await;
                } else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            (renews, lapses, unknown)
        }));
    }
    let names: Arc<Vec<ResourceName>> =
        Arc::new(leases.iter().map(|(_, l)| l.name.clone()).collect());
    let listers: Vec<_> = (0..4)
        .map(|k| {
            let (f, expected, tag) = (f.clone(), expected.clone(), tag.clone());
            let (known, names) = (known.clone(), names.clone());
            tokio::spawn(async move {
                let c = f.coord(k);
                let (mut required, mut unknown) = (0usize, 0usize);
                for _ in 0..750 {
                    let before: Vec<u64> = known.iter().map(|d| d.load(Ordering::SeqCst)).collect();
                    let Ok(listed) = c.list_live("node").await else {
                        unknown += 1;
                        continue;
                    };
                    let mine: Vec<ResourceName> = listed
                        .into_iter()
                        .map(|l| l.name)
                        .filter(|n| n.id().starts_with(&tag))
                        .collect();
                    let after = ms(f.now());
                    let set: BTreeSet<_> = mine.iter().cloned().collect();
                    assert_eq!(set.len(), mine.len(), "a key listed twice");
                    assert!(set.is_subset(&expected), "a listing named a stranger");
                    for (name, deadline) in names.iter().zip(&before) {
                        if *deadline > after {
                            required += 1;
                            assert!(
                                set.contains(name),
                                "a presence lease live throughout is missing from a listing: {name:?}"
                            );
                        }
                    }
                    // Let the renewers in between listings (the twin's
                    // listing never waits on I/O, so it would never yield).
                    tokio::task::yield_now().await;
                }
                (required, unknown)
            })
        })
        .collect();
    let (mut required, mut unknown_listings) = (0, 0);
    for l in listers {
        let (r, u) = l.await.unwrap();
        required += r;
        unknown_listings += u;
    }
    stop.store(true, Ordering::SeqCst);
    let (mut total, mut lapses, mut unknown_renews) = (0, 0, 0);
    for r in renewers {
        let (n, l, u) = r.await.unwrap();
        total += n;
        lapses += l;
        unknown_renews += u;
    }
    eprintln!(
        "listing under churn: {total} renews ({lapses} lapsed, {unknown_renews} unknown), \
         {unknown_listings} of 3000 listings unknown, {required} of 15000 listed keys known live throughout"
    );
    assert!(
        total > 100,
        "the renewers barely ran ({total}); no churn was tested"
    );
    assert!(
        required > 15_000 / 4,
        "only {required} of 15000 listed keys were known live throughout; the listings tested little"
    );
}

/// Delivery claims: create-only, deadline in the record, TTL above the age refused.
pub async fn delivery_claims<F: Fixture>(f: &F) {
    let c = f.coord(0);
    let d = format!("github:{}", uuid::Uuid::new_v4());
    let won = c
        .claim(&d, "x", Duration::from_secs(300))
        .await
        .unwrap()
        .yes()
        .unwrap();
    assert_eq!(won.claimant, "x");
    assert_eq!(
        c.claim(&d, "y", Duration::from_secs(300))
            .await
            .unwrap()
            .no()
            .unwrap()
            .claimant,
        "x"
    );
    assert!(
        c.claim(&d, "x", Duration::from_secs(300))
            .await
            .unwrap()
            .is_yes()
    );
    let too_long = c.claim(&d, "x", Duration::from_secs(31 * 60)).await;
    assert!(
        matches!(too_long, Err(CoordError::TtlAboveBucketAge { .. })),
        "{too_long:?}"
    );
    let short = format!("mm:{}", uuid::Uuid::new_v4());
    c.claim(&short, "x", Duration::from_millis(300))
        .await
        .unwrap()
        .yes()
        .unwrap();
    assert!(
        c.claim(&short, "y", Duration::from_secs(60))
            .await
            .unwrap()
            .is_no()
    );
    f.pass(Duration::from_millis(450)).await;
    assert!(
        c.claim(&short, "y", Duration::from_secs(60))
            .await
            .unwrap()
            .is_yes(),
        "a lapsed claim is claimable"
    );
    // The edge's claim: the same contract, without reading its write back.
    let e = format!("slack:{}", uuid::Uuid::new_v4());
    let ttl = Duration::from_secs(300);
    assert!(c.claim_delivery(&e, "x", ttl).await.unwrap().is_yes());
    assert!(
        c.claim_delivery(&e, "x", ttl).await.unwrap().is_yes(),
        "a repeat by the claimant"
    );
    let other = c.claim_delivery(&e, "y", ttl).await.unwrap().no().unwrap();
    assert_eq!(other.claimant, "x");
    assert_eq!(
        c.claim(&e, "y", ttl).await.unwrap().no().unwrap().claimant,
        "x"
    );
    assert!(matches!(
        c.claim_delivery(&e, "x", Duration::from_secs(31 * 60))
            .await,
        Err(CoordError::TtlAboveBucketAge { .. })
    ));
}

/// Releasing a delivery claim is compare-and-delete of this attempt's
/// claim: its own claim goes (and the key is claimable), another attempt's
/// stays, a lapsed or re-taken one is not touched, and a broken store is
/// unknown with nothing removed.
pub async fn claim_release<F: Fixture>(f: &F) {
    let c = f.coord(0);
    let ttl = Duration::from_secs(300);
    let (a, b) = ("node-a/attempt-1", "node-b/attempt-2");

    let d = format!("github:{}", uuid::Uuid::new_v4());
    assert!(c.claim_delivery(&d, a, ttl).await.unwrap().is_yes());
    assert_eq!(
        f.coord(1).release_claim(&d, a).await.unwrap(),
        Answer::Yes(()),
        "the claimant releases its own claim"
    );
    assert!(
        c.claim_delivery(&d, b, ttl).await.unwrap().is_yes(),
        "a released claim is claimable"
    );
    let left = c.release_claim(&d, a).await.unwrap();
    assert!(
        matches!(left, Answer::No(Unreleased::Other(ref h)) if h.claimant == b),
        "another attempt's claim is not released: {left:?}"
    );
    assert_eq!(
        f.coord(1)
            .claim(&d, "node-c/attempt-3", ttl)
            .await
            .unwrap()
            .no()
            .unwrap()
            .claimant,
        b,
        "the other attempt's claim stays"
    );
    assert_eq!(
        c.release_claim(&format!("gitlab:{}", uuid::Uuid::new_v4()), a)
            .await
            .unwrap(),
        Answer::No(Unreleased::Absent),
        "nothing claimed, nothing released"
    );

    // Lapsed, then re-taken by another attempt: never removed by the first.
    let short = format!("slack:{}", uuid::Uuid::new_v4());
    assert!(
        c.claim_delivery(&short, a, Duration::from_millis(300))
            .await
            .unwrap()
            .is_yes()
    );
    f.pass(Duration::from_millis(450)).await;
    let lapsed = c.release_claim(&short, a).await.unwrap();
    assert!(
        matches!(lapsed, Answer::No(Unreleased::Lapsed(ref h)) if h.claimant == a),
        "a lapsed claim is not released: {lapsed:?}"
    );
    assert!(c.claim_delivery(&short, b, ttl).await.unwrap().is_yes());
    let retaken = f.coord(1).release_claim(&short, a).await.unwrap();
    assert!(
        matches!(retaken, Answer::No(Unreleased::Other(ref h)) if h.claimant == b),
        "a re-taken claim is not released: {retaken:?}"
    );
    assert!(c.claim_delivery(&short, a, ttl).await.unwrap().is_no());

    // A broken store: unknown, and the claim is still there once healed.
    let held = format!("jira:{}", uuid::Uuid::new_v4());
    assert!(c.claim_delivery(&held, a, ttl).await.unwrap().is_yes());
    f.break_store().await;
    let unknown = c.release_claim(&held, a).await;
    assert!(
        matches!(unknown, Err(ref e) if e.is_unavailable()),
        "a release on a broken store answered {unknown:?}, not unavailable"
    );
    f.heal_store().await;
    assert_eq!(
        c.claim_delivery(&held, b, ttl)
            .await
            .unwrap()
            .no()
            .unwrap()
            .claimant,
        a,
        "an unknown release removed nothing"
    );
    assert_eq!(c.release_claim(&held, a).await.unwrap(), Answer::Yes(()));
    assert_eq!(
        c.release_claim(&held, a).await.unwrap(),
        Answer::No(Unreleased::Absent),
        "a repeated release finds nothing"
    );
}

/// Buckets opened by name (module state) answer to the same primitives on
/// every backend: leader reads through any member, certified listing, a
/// watch from it, refusals as kinds (conflict, over the value cap, over the
/// byte cap — never unavailable), an owner's spec applied to an existing
/// bucket only where it differs and a reader's never, and an unknown bucket
/// named as such.
pub async fn named_buckets<F: Fixture>(f: &F) {
    use futures::StreamExt;
    let (kv, other) = (f.named(0), f.named(1));
    let replicas = f.coord(0).options().replicas;
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let name = BucketName::new(format!("mod_t{tag}_notes")).unwrap();
    let spec = |max_value_size: u32, existing: Existing| NamedSpec {
        name: name.clone(),
        description: "contract suite".into(),
        history: 1,
        age: None,
        max_bytes: 1024 * 1024,
        max_value_size,
        replicas,
        existing,
    };
    let missing = BucketName::new(format!("mod_t{tag}_never")).unwrap();
    assert_eq!(
        kv.get(&missing, "k").await,
        Err(NamedError::NoBucket(missing.clone()))
    );
    let opened = kv.open(&spec(1024, Existing::Reconfigure)).await.unwrap();
    assert!(
        opened.created && opened.reconfigured.is_empty(),
        "{opened:?}"
    );
    assert_eq!(opened.replicas, replicas.max(1));
    let again = kv.open(&spec(1024, Existing::Reconfigure)).await.unwrap();
    assert!(
        !again.created && again.reconfigured.is_empty(),
        "an unchanged spec rewrote the bucket: {again:?}"
    );
    assert!(kv.names().await.unwrap().contains(&name));
    assert_eq!(kv.get(&name, "k").await.unwrap(), None);

    let mut watch = other.watch(&name, None).await.unwrap();
    assert!(watch.initial.is_empty());
    let rev = kv
        .put(
            &name,
            "alice",
            bytes::Bytes::from_static(b"lab"),
            Expect::Any,
        )
        .await
        .unwrap()
        .unwrap();
    // Read back through another member, which never opened the bucket.
    let read = other.get(&name, "alice").await.unwrap().unwrap();
    assert_eq!((read.value.as_ref(), read.revision), (&b"lab"[..], rev));
    assert_eq!(
        kv.put(
            &name,
            "alice",
            bytes::Bytes::from_static(b"x"),
            Expect::Revision(rev + 100)
        )
        .await
        .unwrap(),
        Err(Refused::Conflict)
    );
    kv.put(
        &name,
        "bob",
        bytes::Bytes::from_static(b"desk"),
        Expect::Any,
    )
    .await
    .unwrap()
    .unwrap();
    kv.remove(&name, "alice", Expect::Any)
        .await
        .unwrap()
        .unwrap();
    assert!(other.get(&name, "alice").await.unwrap().unwrap().removed);
    let keys: BTreeSet<String> = other
        .list(&name, None)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.key)
        .collect();
    assert_eq!(keys, BTreeSet::from(["bob".to_string()]));
    // The watch delivers every key's latest revision, in revision order.
    // A revision replaced before the store read it may be skipped: a
    // bucket keeps one per key, and the broker reads for a watch a moment
    // after it stores (a fresh-clone CI run saw `put alice` skipped).
    let mut seen = Vec::new();
    while !seen.contains(&"removed alice".to_string()) {
        let next = tokio::time::timeout(Duration::from_secs(10), watch.changes.next())
            .await
            .unwrap_or_else(|_| panic!("no change within 10 s after {seen:?}"))
            .expect("the watch goes on")
            .unwrap();
        seen.push(match next {
            Change::Put(e) => format!("put {}", e.key),
            Change::Removed { key, .. } => format!("removed {key}"),
        });
    }
    let full = ["put alice", "put bob", "removed alice"];
    assert!(
        seen == full || seen == full[1..],
        "changes out of order, repeated or missing a latest revision: {seen:?}"
    );

    // Value cap: refused as a kind; a reader's spec never lifts it, the
    // owner's does.
    let big = bytes::Bytes::from(vec![b'v'; 1536]);
    assert_eq!(
        kv.put(&name, "big", big.clone(), Expect::Any)
            .await
            .unwrap(),
        Err(Refused::TooLarge)
    );
    let adopted = other.open(&spec(4096, Existing::Adopt)).await.unwrap();
    assert!(adopted.reconfigured.is_empty(), "{adopted:?}");
    assert_eq!(
        other
            .put(&name, "big", big.clone(), Expect::Any)
            .await
            .unwrap(),
        Err(Refused::TooLarge),
        "a reader's spec rewrote the owner's"
    );
    let applied = other
        .open(&spec(4096, Existing::Reconfigure))
        .await
        .unwrap();
    assert_eq!(applied.reconfigured, ["max_value_size"], "{applied:?}");
    assert!(
        kv.put(&name, "big", big, Expect::Any)
            .await
            .unwrap()
            .is_ok(),
        "the owner's spec is applied to the existing bucket"
    );

    // Byte cap: a full bucket refuses as a kind, and still answers reads.
    let small = BucketName::new(format!("mod_t{tag}_small")).unwrap();
    kv.open(&NamedSpec {
        name: small.clone(),
        max_bytes: 4096,
        ..spec(1024, Existing::Reconfigure)
    })
    .await
    .unwrap();
    let mut full = None;
    for i in 0..16 {
        let answer = kv
            .put(
                &small,
                &format!("k{i}"),
                bytes::Bytes::from(vec![b'x'; 512]),
                Expect::Any,
            )
            .await;
        match answer {
            Ok(Ok(_)) => {}
            Ok(Err(Refused::Full)) => {
                full = Some(i);
                break;
            }
            other => panic!("write {i} to a small bucket answered {other:?}"),
        }
    }
    let full = full.expect("a 4 KiB bucket refused none of 16 half-KiB values");
    assert!(full >= 2, "refused at write {full}");
    assert!(other.get(&small, "k0").await.unwrap().is_some());
    assert!(
        other
            .get(&small, &format!("k{full}"))
            .await
            .unwrap()
            .is_none(),
        "the refused write landed"
    );
}

/// The completion ledger.
pub async fn completion_ledger<F: Fixture>(f: &F) {
    let c = f.coord(0);
    let t = format!("trigger/{}", uuid::Uuid::new_v4());
    assert_eq!(c.completed(&t).await.unwrap(), Answer::No(()));
    c.complete(&t).await.unwrap();
    assert_eq!(f.coord(1).completed(&t).await.unwrap(), Answer::Yes(()));
}

/// The rate valve: fixed windows, fleet-wide count.
pub async fn rate_valve<F: Fixture>(f: &F) {
    let c = f.coord(0);
    let window = Duration::from_secs(20);
    // Start clear of a window boundary so all calls fall in one window.
    assert!(
        c.options().rate_age >= window * 2,
        "the window must fit the rate bucket's age"
    );
    let now_ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let left = window.as_millis() as u64 - now_ms % window.as_millis() as u64;
    if left < 3000 {
        tokio::time::sleep(Duration::from_millis(left + 50)).await;
    }
    let scope = format!("seat-{}", uuid::Uuid::new_v4().simple());
    for i in 0..3 {
        let v = f
            .coord(i)
            .admit(&scope, 3, window)
            .await
            .unwrap()
            .yes()
            .expect("under the limit");
        assert_eq!(v.count, i as u64 + 1);
    }
    assert!(
        f.coord(1).admit(&scope, 3, window).await.unwrap().is_no(),
        "over the limit fleet-wide"
    );
    assert!(matches!(
        c.admit(&scope, 3, c.options().rate_age).await,
        Err(CoordError::Invalid(_))
    ));
}

/// Cooldowns: an instant, extends never shortens, scoped by provider entry.
pub async fn credential_cooldowns<F: Fixture>(f: &F) {
    let c = f.coord(0);
    let provider = format!("fast-{}", uuid::Uuid::new_v4().simple());
    let hint = key_hint("sk-live-123");
    assert_eq!(hint.as_str().len(), 12);
    let base = SystemTime::now();
    let long = base + Duration::from_secs(3600);
    c.bench(&provider, &hint, long).await.unwrap();
    c.bench(&provider, &hint, base + Duration::from_secs(60))
        .await
        .unwrap();
    let mine: Vec<_> = c
        .cooldowns()
        .await
        .unwrap()
        .into_iter()
        .filter(|x| x.provider == provider)
        .collect();
    assert_eq!(mine.len(), 1);
    let ms = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    };
    assert_eq!(
        ms(mine[0].until),
        ms(long),
        "a shorter bench shortened the record"
    );
    let mut bench = HashMap::new();
    bench.insert(
        (provider.clone(), hint.clone()),
        long + Duration::from_secs(10),
    );
    assert!(
        merge_cooldowns(&mut bench, &Ok(mine.clone())).is_empty(),
        "a pull shortened a local bench"
    );
    let mut empty = HashMap::new();
    assert_eq!(merge_cooldowns(&mut empty, &Ok(mine)).len(), 1);
}

fn windows_at(utc: time::OffsetDateTime, offset_hours: i8) -> Windows {
    Windows::at(utc.into(), UtcOffset::from_hms(offset_hours, 0, 0).unwrap())
}

/// Budgets across DST, Monday and the 1st; skew never rolls a slot back.
pub async fn budget_calendar_windows<F: Fixture>(f: &F) {
    let c = f.coord(0);
    let seat = format!("seat-{}", uuid::Uuid::new_v4().simple());
    let caps = Caps {
        day: Some(100),
        week: Some(250),
        month: Some(1000),
    };
    let none = Caps::default();
    // Europe/Berlin: DST starts Sunday 2026-03-29 at 01:00 UTC (+01 → +02).
    // 00:30 and 23:30 local on the 23-hour day are the same day.
    let early = windows_at(datetime!(2026-03-28 23:30 UTC), 1);
    let late = windows_at(datetime!(2026-03-29 21:30 UTC), 2);
    assert_eq!(early, late);
    assert_eq!(early.day, "2026-03-29");
    assert_eq!(early.week, "2026-W13");
    c.charge(&seat, &early, &caps, &none, 60)
        .await
        .unwrap()
        .yes()
        .unwrap();
    let r = c
        .charge(&seat, &late, &caps, &none, 60)
        .await
        .unwrap()
        .no()
        .expect("day cap");
    assert_eq!(
        (r.period, r.spent, r.cap),
        (crewlet_coord::Period::Day, 120, 100),
        "the refusal reads the window with the refused round counted"
    );
    // Monday 00:30 local: a new day and a new ISO week, same month.
    let monday = windows_at(datetime!(2026-03-29 22:30 UTC), 2);
    assert_eq!(
        (monday.day.as_str(), monday.week.as_str()),
        ("2026-03-30", "2026-W14")
    );
    let ch = c
        .charge(&seat, &monday, &caps, &none, 50)
        .await
        .unwrap()
        .yes()
        .unwrap();
    assert_eq!(
        (
            ch.company.day.spent,
            ch.company.week.spent,
            ch.company.month.spent
        ),
        (50, 50, 170)
    );
    // The 1st: a new month.
    let first = windows_at(datetime!(2026-03-31 22:30 UTC), 2);
    assert_eq!(first.month, "2026-04");
    let ch = c
        .charge(&seat, &first, &caps, &none, 10)
        .await
        .unwrap()
        .yes()
        .unwrap();
    assert_eq!(
        (
            ch.company.day.spent,
            ch.company.week.spent,
            ch.company.month.spent
        ),
        (10, 60, 10)
    );
    // Clock skew: a node whose clock trails counts in the later window.
    let behind = windows_at(datetime!(2026-03-31 21:59 UTC), 2);
    assert_eq!(behind.day, "2026-03-31");
    let ch = c
        .charge(&seat, &behind, &caps, &none, 5)
        .await
        .unwrap()
        .yes()
        .unwrap();
    assert_eq!(ch.company.day.label, "2026-04-01");
    assert_eq!((ch.company.day.spent, ch.company.month.spent), (15, 15));
    let read = c.budget(&Scope::Company, &behind).await.unwrap();
    assert_eq!(
        (read.day.label.as_str(), read.day.spent),
        ("2026-04-01", 15),
        "a read behind rolled back"
    );
    let seat_read = c.budget(&Scope::Seat(seat.clone()), &first).await.unwrap();
    assert_eq!(seat_read.month.spent, 15);
}

/// Refused rounds are counted; `refuse` stamps without charging.
pub async fn budget_refusals<F: Fixture>(f: &F) {
    let c = f.coord(0);
    let seat = format!("seat-{}", uuid::Uuid::new_v4().simple());
    let w = Windows::of(time::macros::date!(2026 - 09 - 23));
    let company = Caps::default();
    let caps = Caps {
        day: Some(100),
        ..Default::default()
    };
    // Nothing over: refuse writes nothing.
    assert_eq!(
        c.refuse(&seat, &w, &company, &caps).await.unwrap(),
        Answer::No(())
    );
    c.charge(&seat, &w, &company, &caps, 98)
        .await
        .unwrap()
        .yes()
        .unwrap();
    let r = c
        .charge(&seat, &w, &company, &caps, 3)
        .await
        .unwrap()
        .no()
        .expect("3 over 98/100");
    assert_eq!(r.scope, Scope::Seat(seat.clone()));
    let view = c.budget(&Scope::Seat(seat.clone()), &w).await.unwrap();
    assert_eq!(view.day.spent, 101, "a refused round is still counted");
    assert!(view.day.refused_at.is_some());
    assert_eq!(
        c.budget(&Scope::Company, &w).await.unwrap().day.spent,
        101,
        "the company counts the refused round too"
    );
    assert!(
        c.charge(&seat, &w, &company, &caps, 1)
            .await
            .unwrap()
            .is_no(),
        "no room on top of a refused round"
    );
    let refusal = c
        .refuse(&seat, &w, &company, &caps)
        .await
        .unwrap()
        .yes()
        .expect("a full window is stamped");
    assert_eq!(refusal.scope, Scope::Seat(seat.clone()));
    assert_eq!(
        c.budget(&Scope::Seat(seat.clone()), &w)
            .await
            .unwrap()
            .day
            .spent,
        102
    );
    // The window turns over: no stamp, room again, spend cleared.
    let next = Windows::of(time::macros::date!(2026 - 09 - 24));
    assert_eq!(
        c.refuse(&seat, &next, &company, &caps).await.unwrap(),
        Answer::No(())
    );
    let ch = c
        .charge(&seat, &next, &company, &caps, 1)
        .await
        .unwrap()
        .yes()
        .unwrap();
    assert_eq!((ch.seat.day.spent, ch.seat.day.refused_at), (1, None));
    // A seat write failing after the company's landed names the missing share.
    f.fail_writes_to(Some(&format!("seat.{seat}")));
    let before = c.budget(&Scope::Company, &next).await.unwrap().day.spent;
    let partial = c.charge(&seat, &next, &company, &caps, 7).await;
    f.fail_writes_to(None);
    match partial {
        Err(CoordError::SeatShareUncounted { seat: s, tokens: 7 }) => assert_eq!(s, seat),
        other => panic!("a partial charge answered {other:?}"),
    }
    assert_eq!(
        c.budget(&Scope::Company, &next).await.unwrap().day.spent,
        before + 7
    );
    assert_eq!(
        c.budget(&Scope::Seat(seat.clone()), &next)
            .await
            .unwrap()
            .day
            .spent,
        1
    );
}

/// 32 concurrent charges on one record, 0 failures in 200 runs.
pub async fn budget_contention<F: Fixture>(f: &Arc<F>) {
    let _heavy = HEAVY.lock().await;
    let w = Windows::of(time::macros::date!(2026 - 09 - 23));
    let caps = Caps::default();
    let seat = format!("seat-{}", uuid::Uuid::new_v4().simple());
    let mut total = 0u64;
    for run in 0..200u64 {
        let tasks: Vec<_> = (0..32)
            .map(|i| {
                let (c, w, seat) = (f.coord(i), w.clone(), seat.clone());
                tokio::spawn(async move { c.charge(&seat, &w, &caps, &caps, run + 1).await })
            })
            .collect();
        for t in tasks {
            let r = t.await.unwrap();
            assert!(
                matches!(r, Ok(Answer::Yes(_))),
                "run {run}: a charge failed: {r:?}"
            );
        }
        total += 32 * (run + 1);
    }
    let view = f.coord(0).budget(&Scope::Seat(seat), &w).await.unwrap();
    assert_eq!(view.day.spent, total);
}

/// The config activation pointer.
pub async fn config_pointer<F: Fixture>(f: &F) {
    let c = f.coord(0);
    assert_eq!(c.active_config().await.unwrap(), Pointer::Unset);
    let e1 = c.activate("rev-1", None).await.unwrap().yes().unwrap();
    let moved = f
        .coord(1)
        .activate("rev-2", None)
        .await
        .unwrap()
        .no()
        .unwrap();
    assert_eq!(
        moved.current,
        Pointer::Set {
            revision: "rev-1".into(),
            epoch: e1
        }
    );
    let e2 = c.activate("rev-2", Some(e1)).await.unwrap().yes().unwrap();
    assert!(e2 > e1);
    assert!(
        c.activate("rev-3", Some(e1)).await.unwrap().is_no(),
        "a stale activation overwrote"
    );
    assert_eq!(
        f.coord(2).active_config().await.unwrap(),
        Pointer::Set {
            revision: "rev-2".into(),
            epoch: e2
        }
    );
}

/// Per-node status.
pub async fn node_status<F: Fixture>(f: &F) {
    let c = f.coord(0);
    let id = format!("n-{}", uuid::Uuid::new_v4().simple());
    assert_eq!(c.node_status(&id).await.unwrap(), Answer::No(()));
    let v = serde_json::json!({"applied": "rev-9", "future_key": {"x": 1}});
    c.publish_status(&id, &v).await.unwrap();
    assert_eq!(c.node_status(&id).await.unwrap(), Answer::Yes(v.clone()));
    assert_eq!(f.coord(1).statuses().await.unwrap().get(&id), Some(&v));
}

/// The seat-pause watch starts with the certified listing, then changes.
pub async fn seat_pause_watch<F: Fixture>(f: &F) {
    use futures::StreamExt;
    let c = f.coord(0);
    for h in ["ada", "bob", "cy.d"] {
        c.pause_seat(h, &serde_json::json!({"by": "ops"}))
            .await
            .unwrap();
    }
    let mut w = f.coord(1).watch_seat_pauses().await.unwrap();
    assert_eq!(
        w.initial.keys().cloned().collect::<Vec<_>>(),
        vec!["ada", "bob", "cy.d"]
    );
    c.pause_seat("dee", &serde_json::json!({"by": "ops", "stop_turn": true}))
        .await
        .unwrap();
    assert!(c.resume_seat("ada").await.unwrap().is_yes());
    assert!(c.resume_seat("ada").await.unwrap().is_no());
    async fn next(w: &mut crewlet_coord::SeatPauses) -> (String, Option<serde_json::Value>) {
        tokio::time::timeout(Duration::from_secs(10), w.changes.next())
            .await
            .expect("a change")
            .unwrap()
            .unwrap()
    }
    let (h, v) = next(&mut w).await;
    assert_eq!((h.as_str(), v.is_some()), ("dee", true));
    let (h, v) = next(&mut w).await;
    assert_eq!((h.as_str(), v), ("ada", None));
}

/// Tokens: create-only by id, revoked by a write every watcher sees, and
/// listed with revoked ones included.
pub async fn operator_tokens<F: Fixture>(f: &F) {
    use crewlet_coord::TokenRecord;
    use futures::StreamExt;
    let c = f.coord(0);
    let rec = |hash: &str, scope: &str| TokenRecord {
        hash: hash.into(),
        scope: scope.into(),
        name: "ci".into(),
        created_ms: 1_000,
        expires_ms: Some(5_000),
        revoked_ms: None,
    };
    assert!(
        c.create_token("t1", &rec("aa", "admin"))
            .await
            .unwrap()
            .is_yes()
    );
    match c.create_token("t1", &rec("bb", "read")).await.unwrap() {
        crewlet_coord::Answer::No(there) => assert_eq!(there.hash, "aa"),
        other => panic!("a second create of one id must be refused: {other:?}"),
    }
    let mut w = f.coord(1).watch_tokens().await.unwrap();
    assert_eq!(w.initial.keys().cloned().collect::<Vec<_>>(), vec!["t1"]);
    assert!(w.initial["t1"].live_at(4_999));
    assert!(!w.initial["t1"].live_at(5_000), "expired at its instant");

    assert!(c.revoke_token("nope", 9).await.unwrap().is_no());
    let revoked = match c.revoke_token("t1", 2_000).await.unwrap() {
        crewlet_coord::Answer::Yes(r) => r,
        other => panic!("revoking a token that exists: {other:?}"),
    };
    assert_eq!(revoked.revoked_ms, Some(2_000));
    match c.revoke_token("t1", 3_000).await.unwrap() {
        crewlet_coord::Answer::Yes(r) => assert_eq!(r.revoked_ms, Some(2_000)),
        other => panic!("a second revoke keeps the first time: {other:?}"),
    }
    let (id, seen) = tokio::time::timeout(Duration::from_secs(10), w.changes.next())
        .await
        .expect("a change")
        .unwrap()
        .unwrap();
    assert_eq!(id, "t1");
    let seen = seen.expect("a revocation is a write");
    assert!(!seen.live_at(1_500), "revoked is never live");
    let all = f.coord(1).tokens().await.unwrap();
    assert_eq!(all["t1"].revoked_ms, Some(2_000));
}

/// The marker sweep changes no answer, and only covers ageless buckets.
pub async fn marker_sweep_changes_no_answer<F: Fixture>(f: &F) {
    let c = f.coord(0);
    let swept: BTreeSet<Bucket> = c.swept_buckets().into_iter().collect();
    assert_eq!(
        swept,
        [
            Bucket::Config,
            Bucket::Secrets,
            Bucket::Mailboxes,
            Bucket::Positions,
            Bucket::Tokens
        ]
        .into_iter()
        .collect()
    );
    let class = "mbx";
    let v = |i: i32| serde_json::json!({"i": i});
    for b in [Bucket::Mailboxes, Bucket::Secrets, Bucket::Positions] {
        for i in 0..6 {
            c.put_record(b, class, &format!("k{i}"), &v(i))
                .await
                .unwrap();
        }
        for i in 0..3 {
            assert!(
                c.remove_record(b, class, &format!("k{i}"))
                    .await
                    .unwrap()
                    .is_yes()
            );
        }
    }
    let seat = fresh("seat");
    let l = c
        .acquire(&seat, &owner("a"), None)
        .await
        .unwrap()
        .yes()
        .unwrap();
    c.release(&l).await.unwrap().yes().unwrap();
    let answers = || async {
        let mut out = Vec::new();
        for b in [Bucket::Mailboxes, Bucket::Secrets, Bucket::Positions] {
            out.push(format!("{:?}", c.list_records(b, class).await.unwrap()));
            for i in 0..6 {
                out.push(format!(
                    "{:?}",
                    c.get_record(b, class, &format!("k{i}"))
                        .await
                        .unwrap()
                        .yes()
                        .map(|x| x.0)
                ));
            }
        }
        out.push(format!("{:?}", c.get(&seat).await.unwrap()));
        out.push(format!("{}", c.epoch(&seat).await.unwrap()));
        out
    };
    let before = answers().await;
    let report = c.sweep_markers_older_than(Duration::ZERO).await;
    assert!(report.failed.is_empty(), "{report:?}");
    assert!(
        report.swept.get(&Bucket::Mailboxes).copied().unwrap_or(0) >= 3,
        "{report:?}"
    );
    assert_eq!(answers().await, before, "the sweep changed an answer");
    // A create over a swept key is a create over nothing.
    for b in [Bucket::Mailboxes, Bucket::Secrets, Bucket::Positions] {
        assert!(
            c.create_record(b, class, "k0", &v(10))
                .await
                .unwrap()
                .is_yes()
        );
        assert!(
            c.create_record(b, class, "k5", &v(10))
                .await
                .unwrap()
                .is_no()
        );
    }
    // A record re-created after its marker survives a sweep.
    c.remove_record(Bucket::Mailboxes, class, "k0")
        .await
        .unwrap()
        .yes()
        .unwrap();
    c.put_record(Bucket::Mailboxes, class, "k0", &v(11))
        .await
        .unwrap();
    let _ = c.sweep_markers_older_than(Duration::ZERO).await;
    assert_eq!(
        c.get_record(Bucket::Mailboxes, class, "k0")
            .await
            .unwrap()
            .yes()
            .unwrap()
            .0,
        v(11)
    );
    // And the epoch survives release and sweep.
    assert_eq!(
        c.acquire(&seat, &owner("b"), None)
            .await
            .unwrap()
            .yes()
            .unwrap()
            .epoch,
        2
    );
}

/// Winners read their own win through their own member.
pub async fn winners_read_their_own_win<F: Fixture>(f: &Arc<F>, claimants: usize) {
    let _heavy = HEAVY.lock().await;
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let tasks: Vec<_> = (0..claimants)
        .map(|i| {
            let f = f.clone();
            let seat = name(&format!("seat:{tag}-{}", i / 2));
            tokio::spawn(async move {
                let c = f.coord(i);
                let me = owner(&format!("c{i}"));
                match c.acquire(&seat, &me, None).await.unwrap() {
                    Answer::Yes(l) => {
                        let got = c
                            .get(&seat)
                            .await
                            .unwrap()
                            .yes()
                            .expect("the winner reads its own win");
                        assert_eq!((got.owner, got.epoch), (me, l.epoch));
                        Some(seat)
                    }
                    Answer::No(_) => None,
                }
            })
        })
        .collect();
    let mut won = HashSet::new();
    for t in tasks {
        if let Some(seat) = t.await.unwrap() {
            assert!(won.insert(seat.clone()), "two winners on {seat}");
        }
    }
    assert_eq!(
        won.len(),
        claimants.div_ceil(2),
        "every seat has exactly one winner"
    );
}

/// Expands to one test per contract case for a fixture constructor.
#[macro_export]
macro_rules! contract_suite {
    ($fixture:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn acquire_renew_release_and_epochs() {
            contract::acquire_renew_release_and_epochs(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn refused_calls_write_nothing() {
            contract::refused_calls_write_nothing(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn follows_one_key_per_thread() {
            contract::follows_one_key_per_thread(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn follows_unknown_is_not_nobody() {
            contract::follows_unknown_is_not_nobody(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn stampede() {
            contract::stampede(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn no_epoch_to_two_owners() {
            contract::no_epoch_to_two_owners(&std::sync::Arc::new($fixture.await)).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn unknown_is_never_a_refusal() {
            contract::unknown_is_never_a_refusal(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn awkward_names() {
            contract::awkward_names(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn duty_ceiling_and_deadline() {
            contract::duty_ceiling_and_deadline(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn listing_under_churn() {
            contract::listing_under_churn(&std::sync::Arc::new($fixture.await)).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn delivery_claims() {
            contract::delivery_claims(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn claim_release() {
            contract::claim_release(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn named_buckets() {
            contract::named_buckets(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn completion_ledger() {
            contract::completion_ledger(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn rate_valve() {
            contract::rate_valve(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn credential_cooldowns() {
            contract::credential_cooldowns(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn budget_calendar_windows() {
            contract::budget_calendar_windows(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn budget_refusals() {
            contract::budget_refusals(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn budget_contention() {
            contract::budget_contention(&std::sync::Arc::new($fixture.await)).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn config_pointer() {
            contract::config_pointer(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn node_status() {
            contract::node_status(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn seat_pause_watch() {
            contract::seat_pause_watch(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn operator_tokens() {
            contract::operator_tokens(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn marker_sweep_changes_no_answer() {
            contract::marker_sweep_changes_no_answer(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn replace_record() {
            contract::replace_record(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn typed_claims() {
            contract::typed_claims(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn tenancy_holds_renews_and_releases() {
            contract::tenancy_holds_renews_and_releases(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn tenancy_unknown_is_not_no() {
            contract::tenancy_unknown_is_not_no(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn tenancy_refused_is_no_at_once() {
            contract::tenancy_refused_is_no_at_once(&$fixture.await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn winners_read_their_own_win() {
            contract::winners_read_their_own_win(&std::sync::Arc::new($fixture.await), 100).await
        }
    };
}
