//! The maintenance tick: this node's event log and `scheduled_runs` past
//! their retention go, younger rows stay; the fleet's share runs on the
//! duty's holder only.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crewlet_company::ActiveCompany;
use crewlet_config::DutiesConfig;
use crewlet_coord::{Answer, Bucket, Coord, Fence, ResourceName, Terms};
use crewlet_duties::maintenance::{LastTick, Maintenance};
use crewlet_statelog::PositionBook;
use crewlet_store::{EventQuery, EventRecord, RunStatus, ScheduledRun};
use crewlet_testkit::NatsServer;
use tokio::sync::watch;

use crate::fixture::{Local, coord, twin, until};

const DAY_MS: i64 = 24 * 3600 * 1000;

/// Three events and two runs past their retention, two and one within.
fn seed(local: &Local, now_ms: i64) {
    for (id, age_days) in [
        ("old-1", 10),
        ("old-2", 9),
        ("old-3", 2),
        ("new-1", 0),
        ("new-2", 0),
    ] {
        let mut ev = EventRecord::new(id, "test_event", "node", serde_json::json!({}));
        ev.at_ms = now_ms - age_days * DAY_MS;
        local.store.append_event(&ev).unwrap();
    }
    for (key, age_days) in [("run-old-1", 40), ("run-old-2", 31), ("run-new", 3)] {
        local
            .store
            .record_run(&ScheduledRun {
                fire_key: key.into(),
                schedule: "standup".into(),
                seat: Some("ada".into()),
                due_ms: now_ms - age_days * DAY_MS,
                started_ms: None,
                finished_ms: None,
                status: RunStatus::Done,
                error: None,
            })
            .unwrap();
    }
}

fn config() -> DutiesConfig {
    DutiesConfig {
        event_retention: Duration::from_secs(24 * 3600),
        scheduled_runs_retention: Duration::from_secs(30 * 24 * 3600),
        ..DutiesConfig::default()
    }
}

/// One node's maintenance loop; `tenure` is `None` without `workers`.
fn start(
    coord: &Coord,
    local: &Local,
    tenure: Option<watch::Receiver<Option<Fence>>>,
) -> (
    Arc<Mutex<Option<LastTick>>>,
    watch::Sender<bool>,
    tokio::task::JoinHandle<()>,
) {
    let last = Arc::new(Mutex::new(None));
    let work = Maintenance {
        upkeep: coord.upkeep(),
        mailboxes: coord.records(Bucket::Mailboxes),
        positions: PositionBook::new(coord.clone()),
        owner: coord.options().owner.clone(),
        js: local.js.clone(),
        store: local.store.clone(),
        publisher: local.publisher.clone(),
        active: ActiveCompany::new(None),
        config: config(),
        last: last.clone(),
    };
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(work.run(tenure, stopped));
    (last, stop, task)
}

fn event_ids(local: &Local) -> Vec<String> {
    let mut ids: Vec<String> = local
        .store
        .events(&EventQuery {
            kind: Some("test_event".into()),
            limit: 1_000,
            ..EventQuery::default()
        })
        .unwrap()
        .into_iter()
        .map(|e| e.event_id)
        .collect();
    ids.sort();
    ids
}

fn run_keys(local: &Local) -> Vec<String> {
    let mut keys: Vec<String> = local
        .store
        .scheduled_runs(1_000)
        .unwrap()
        .into_iter()
        .map(|r| r.fire_key)
        .collect();
    keys.sort();
    keys
}

#[tokio::test]
async fn a_tick_trims_what_is_past_retention_and_nothing_else() {
    let server = NatsServer::start();
    let kv = twin();
    let (holder, plain) = (coord(&kv, "node-a"), coord(&kv, "node-b"));
    let (a, b) = (
        Local::open("node-a", &server).await,
        Local::open("node-b", &server).await,
    );
    let now_ms = jiff::Timestamp::now().as_millisecond();
    seed(&a, now_ms);
    seed(&b, now_ms);
    let ttl = Duration::from_secs(30);
    let name = ResourceName::worker("maintenance").unwrap();
    let Ok(Answer::Yes(tenancy)) = holder
        .leases("worker")
        .acquire(&name, &holder.options().owner, Some(ttl), Terms::duty(ttl))
        .await
    else {
        panic!("node-a takes the free duty");
    };
    let (_keep, tenure) = watch::channel(Some(tenancy.fence().clone()));
    let (last_a, stop_a, task_a) = start(&holder, &a, Some(tenure));
    let (last_b, stop_b, task_b) = start(&plain, &b, None);
    until("both nodes ticked", Duration::from_secs(15), || {
        last_a.lock().unwrap().is_some() && last_b.lock().unwrap().is_some()
    })
    .await;
    let _ = (stop_a.send(true), stop_b.send(true));
    task_a.await.unwrap();
    task_b.await.unwrap();

    for (local, last, node) in [(&a, &last_a, "node-a"), (&b, &last_b, "node-b")] {
        let tick = last.lock().unwrap().clone().unwrap();
        assert_eq!(tick.error, None, "{node}'s trim failed");
        assert_eq!(
            (tick.events_deleted, tick.scheduled_runs_deleted),
            (3, 2),
            "{node} trims its own tables, holder or not"
        );
        assert_eq!(
            event_ids(local),
            ["new-1", "new-2"],
            "{node}'s young events"
        );
        assert_eq!(run_keys(local), ["run-new"], "{node}'s young runs");
    }
    // The fleet's share: on the holder, under its epoch; never elsewhere.
    let fleet = last_a
        .lock()
        .unwrap()
        .clone()
        .unwrap()
        .fleet
        .expect("the holder's fleet pass");
    assert_eq!(fleet["epoch"], serde_json::json!(tenancy.epoch()));
    assert_eq!(
        fleet["mailboxes"]["skipped"], "this node serves no company yet",
        "no mailbox is stamped while no company is served"
    );
    assert!(
        last_b.lock().unwrap().clone().unwrap().fleet.is_none(),
        "a node without the duty did the fleet's work"
    );
    tenancy.release(Some(Duration::from_secs(2))).await;
}
