//! A node's presence against the in-memory coordination twin: the
//! `node:ID` lease is held with the node's status while the node runs, a
//! second incarnation of the same node waits (naming the holder) until the
//! first releases, and a stopped node leaves the roster at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crewlet_coord::bucket::Retentions;
use crewlet_coord::{Coord, CoordOptions, Kv, MemoryKv, NodeStatus, Owner, SystemClock};
use crewlet_fleet::presence::{Presence, PresenceView};

/// Coordination for one incarnation of `node` on the shared store `kv`,
/// on a one-second heartbeat (a refused acquire is asked again each beat).
fn incarnation(kv: &Arc<dyn Kv>, node: &str) -> Coord {
    let mut o = CoordOptions::new(Owner::incarnation(node));
    o.heartbeat = Duration::from_secs(1);
    o.lease_ttl = Duration::from_secs(30);
    Coord::with_backends(kv.clone(), kv.clone(), o)
}

fn store() -> Arc<dyn Kv> {
    let o = CoordOptions::new(Owner::incarnation("presence-test"));
    Arc::new(MemoryKv::new(
        Arc::new(SystemClock),
        &Retentions {
            lease_ttl: Duration::from_secs(30),
            status: o.status_age,
            rate: o.rate_age,
        },
    ))
}

fn start(coord: &Coord, node: &str, label: &str) -> Presence {
    let label = label.to_owned();
    Presence::start(
        coord.leases("node"),
        node.into(),
        coord.options().owner.clone(),
        move || NodeStatus {
            roles: vec!["seats".into()],
            labels: [("zone".to_owned(), label.clone())].into(),
            ..NodeStatus::default()
        },
    )
}

async fn until(what: &str, presence: &Presence, done: impl Fn(&PresenceView) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done(&presence.view()) {
        assert!(
            Instant::now() < deadline,
            "{what} within 10 s: {:?}",
            presence.view()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_node_is_present_while_it_runs_and_its_next_incarnation_waits_for_the_release() {
    let kv = store();
    let (first, second) = (incarnation(&kv, "n1"), incarnation(&kv, "n1"));
    let roster = first.roster("node");

    let running = start(&first, "n1", "a");
    until("the first incarnation admits", &running, |v| {
        v.state == "admitting" && v.epoch.is_some()
    })
    .await;
    let live = roster.live().await.unwrap();
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(live[0].name.id(), "n1");
    assert_eq!(live[0].owner, first.options().owner);
    assert_eq!(Some(live[0].epoch), running.view().epoch);
    let said = live[0]
        .status
        .clone()
        .expect("the lease carries the status");
    assert_eq!(
        (said.roles, said.labels["zone"].as_str()),
        (vec!["seats".to_owned()], "a")
    );

    // The same node again (a restart before its lease lapsed): it waits,
    // saying who holds its name, and never admits beside the first.
    let next = start(&second, "n1", "b");
    let holder = first.options().owner.as_str().to_owned();
    until("the second incarnation names the holder", &next, |v| {
        v.state == "acquiring" && v.last_error.as_deref().is_some_and(|e| e.contains(&holder))
    })
    .await;
    assert_eq!(running.view().state, "admitting");

    let first_epoch = running.view().epoch.unwrap();
    running.stop().await;
    until(
        "the second incarnation admits after the release",
        &next,
        |v| v.state == "admitting",
    )
    .await;
    assert!(
        next.view().epoch.unwrap() > first_epoch,
        "a new tenure, a newer epoch"
    );
    let live = roster.live().await.unwrap();
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(live[0].owner, second.options().owner);
    assert_eq!(live[0].status.as_ref().unwrap().labels["zone"], "b");

    let view = next.view_handle();
    next.stop().await;
    assert_eq!(view.lock().unwrap().state, "released");
    assert!(
        roster.live().await.unwrap().is_empty(),
        "a stopped node is still listed"
    );
}
