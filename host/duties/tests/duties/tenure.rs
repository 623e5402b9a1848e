//! A duty's lease: one holder while two compete, handed over on release.

use std::time::{Duration, Instant};

use crewlet_coord::{Admits, Coord, Fence};
use crewlet_duties::tenure::{DutyLease, HeldDuties};
use tokio::sync::watch;

use crate::fixture::{compete, coord, twin, until};

struct Contender {
    lease: DutyLease,
    held: HeldDuties,
    _admits: watch::Sender<bool>,
}

impl Contender {
    fn start(coord: &Coord) -> Contender {
        let (lease, held, admits) = compete(coord, "maintenance", Duration::from_secs(6));
        Contender {
            lease,
            held,
            _admits: admits,
        }
    }

    /// The tenure this node holds now, as its lease loop shows it (a
    /// renew late on a loaded machine makes it unknown, not another's).
    fn holding(&self) -> Option<Fence> {
        self.lease.fence().borrow().clone()
    }
}

#[tokio::test]
async fn one_holder_per_duty_and_a_handover_after_release() {
    let kv = twin();
    let (a, b) = (coord(&kv, "node-a"), coord(&kv, "node-b"));
    let (ca, cb) = (Contender::start(&a), Contender::start(&b));
    until("one node holds the duty", Duration::from_secs(10), || {
        ca.holding().is_some() || cb.holding().is_some()
    })
    .await;
    // Both keep competing (a loser asks again every second): for three
    // polls, never two holders, and the store names the one that holds.
    let watched = Instant::now() + Duration::from_secs(3);
    while Instant::now() < watched {
        assert!(
            ca.holding().is_none() || cb.holding().is_none(),
            "two nodes hold worker:maintenance at once"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (holder, holder_coord, other, other_coord) = if ca.holding().is_some() {
        (ca, &a, cb, &b)
    } else {
        (cb, &b, ca, &a)
    };
    let first = holder.holding().expect("the holder still holds");
    let live = other_coord.leases("worker").live().await.unwrap();
    let duty: Vec<_> = live
        .iter()
        .filter(|l| l.name.id() == "maintenance")
        .collect();
    assert_eq!(duty.len(), 1, "one lease per duty: {live:?}");
    assert_eq!(duty[0].owner, holder_coord.options().owner);
    assert_eq!(duty[0].epoch, first.epoch());
    let rows = holder.held.rows();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].duty.as_str(), rows[0].epoch),
        ("maintenance", first.epoch())
    );
    assert!(other.held.rows().is_empty(), "the loser shows a duty held");

    // Released, not lapsed: the other takes it within its poll, long
    // before the 6 s TTL would have run out.
    let Contender { lease, held, .. } = holder;
    lease.stop().await;
    assert!(held.rows().is_empty(), "a released duty still shows held");
    assert_eq!(first.admits(), Admits::No, "a released fence still admits");
    until(
        "the other node takes the duty",
        Duration::from_secs(5),
        || other.holding().is_some(),
    )
    .await;
    let next = other.holding().unwrap();
    assert!(
        next.epoch() > first.epoch(),
        "the new tenure's epoch is newer"
    );
    let live = other_coord.leases("worker").live().await.unwrap();
    assert!(
        live.iter()
            .any(|l| l.name.id() == "maintenance" && l.owner == other_coord.options().owner),
        "the store names the new holder: {live:?}"
    );
    other.lease.stop().await;
}
