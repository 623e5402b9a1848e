//! The tenancy: one held lease, renewed by its own task, asked through its
//! fence — against every backend.

use std::time::{Duration, Instant};

use crewlet_coord::{Admits, Answer, Held, Released, Standing, Tenancy, Terms};

use super::fixtures::Fixture;
use super::{fresh, owner};

/// Waits (at most `bound`) until the tenancy's answer satisfies `ok`;
/// returns every answer seen on the way, the last one included.
async fn until(t: &Tenancy, bound: Duration, ok: impl Fn(&Standing) -> bool) -> Vec<Standing> {
    let mut rx = t.standing();
    let mut seen = vec![rx.borrow_and_update().clone()];
    let deadline = Instant::now() + bound;
    while !ok(seen.last().expect("seen")) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.changed()).await {
            Ok(Ok(())) => seen.push(rx.borrow_and_update().clone()),
            Ok(Err(_)) | Err(_) => panic!("not reached within {bound:?}; seen {seen:?}"),
        }
    }
    seen
}

/// A held duty stays ours past its TTL because its task renews it; a peer
/// is refused meanwhile; a release gives it back at once and the fence
/// says no from then on.
pub async fn tenancy_holds_renews_and_releases<F: Fixture>(f: &F) {
    let c = f.coord(0);
    let ttl = Duration::from_millis(1500);
    let (a, b) = (owner("a"), owner("b"));
    let duty = fresh("worker");
    let t = Tenancy::acquire(&c, &duty, &a, Some(ttl), Terms::duty(ttl))
        .await
        .unwrap()
        .yes()
        .expect("a free duty is acquired");
    let epoch = t.epoch();
    assert_eq!(t.fence().admits(), Admits::Yes);
    assert_eq!(t.fence().admitted(), Some(epoch));
    let admit_until = t
        .fence()
        .admit_until()
        .expect("a live tenure admits until a deadline");
    assert!(admit_until > Instant::now() && admit_until <= Instant::now() + ttl / 3);
    // Three renews, each followed by half a TTL of store time: without
    // them the lease would have lapsed.
    for _ in 0..3 {
        let before = c.renewals().yes;
        let deadline = Instant::now() + Duration::from_secs(10);
        while c.renewals().yes == before {
            assert!(Instant::now() < deadline, "no renew within 10 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        f.pass(ttl / 2).await;
    }
    match c.acquire(&duty, &b, Some(ttl)).await.unwrap() {
        Answer::No(Held::By { owner, epoch: e }) => assert_eq!((owner, e), (a.clone(), epoch)),
        other => panic!("the held duty was not refused to a peer: {other:?}"),
    }
    assert_eq!(t.fence().admits(), Admits::Yes);
    let fence = t.fence().clone();
    assert_eq!(t.release(Some(Duration::from_secs(5))).await, Released::Yes);
    assert_eq!(
        fence.admits(),
        Admits::No,
        "a released tenure admits nothing"
    );
    assert_eq!(fence.admit_until(), None);
    let next = c.acquire(&duty, &b, Some(ttl)).await.unwrap().yes();
    assert_eq!(
        next.map(|l| l.epoch),
        Some(epoch.next()),
        "a peer takes the released duty at once, at the next epoch"
    );
}

/// A store that stops answering makes the answer unknown first — never no
/// while the TTL runs — and no once the TTL has passed on the holder's
/// clock.
pub async fn tenancy_unknown_is_not_no<F: Fixture>(f: &F) {
    let c = f.coord(0);
    let ttl = Duration::from_secs(6);
    let duty = fresh("worker");
    let t = Tenancy::acquire(&c, &duty, &owner("a"), Some(ttl), Terms::duty(ttl))
        .await
        .unwrap()
        .yes()
        .expect("a free duty is acquired");
    let broken = Instant::now();
    f.break_store().await;
    let seen = until(&t, Duration::from_secs(20), |s| s.admits == Admits::No).await;
    let gave_up = broken.elapsed();
    f.heal_store().await;
    let unknown = seen
        .iter()
        .position(|s| s.admits == Admits::Unknown)
        .unwrap_or_else(|| panic!("the answer went to no without being unknown: {seen:?}"));
    assert!(
        seen[..unknown].iter().all(|s| s.admits == Admits::Yes),
        "{seen:?}"
    );
    assert!(
        seen[unknown..seen.len() - 1]
            .iter()
            .all(|s| s.admits == Admits::Unknown),
        "{seen:?}"
    );
    assert!(
        seen.iter().any(|s| s.unknown.is_some()),
        "why the renews were unknown is kept: {seen:?}"
    );
    // Given up by the holder's clock: no sooner than the TTL after the
    // last good renew, which was at most a renew period before the break.
    assert!(
        gave_up + ttl / 6 >= ttl,
        "given up after {gave_up:?}, before the TTL"
    );
    assert_eq!(t.fence().admits(), Admits::No);
    t.ended().await;
}

/// The store's definite no (the tenure removed under the holder) is no at
/// the next renew, and nothing is left to release.
pub async fn tenancy_refused_is_no_at_once<F: Fixture>(f: &F) {
    let c = f.coord(0);
    let ttl = Duration::from_millis(1500);
    let duty = fresh("worker");
    let a = owner("a");
    let sent = Instant::now();
    let lease = c
        .acquire(&duty, &a, Some(ttl))
        .await
        .unwrap()
        .yes()
        .expect("a free duty is acquired");
    let t = Tenancy::hold(c.clone(), lease.clone(), sent, Terms::duty(ttl));
    // Taken from under the holder (its own renews may move the record
    // between the read and the delete: ask again).
    let mut removed = false;
    for _ in 0..20 {
        let cur = c.get(&duty).await.unwrap().yes().expect("still held");
        if c.release(&cur).await.unwrap().is_yes() {
            removed = true;
            break;
        }
    }
    assert!(removed, "the tenure could not be removed under its holder");
    let peer = c
        .acquire(&duty, &owner("b"), Some(ttl))
        .await
        .unwrap()
        .yes()
        .expect("a peer takes the removed duty");
    assert_eq!(peer.epoch, lease.epoch.next());
    let seen = until(&t, Duration::from_secs(10), |s| s.admits == Admits::No).await;
    assert!(
        seen.iter().all(|s| s.admits != Admits::Unknown),
        "a definite no is no at once, never unknown first: {seen:?}"
    );
    assert_eq!(t.release(None).await, Released::NotOurs(None));
    assert_eq!(
        c.get(&duty).await.unwrap().yes().map(|l| l.owner),
        Some(peer.owner),
        "the peer's tenure is left alone"
    );
}
