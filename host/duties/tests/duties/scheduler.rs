//! `worker:scheduler`: a schedule due every second, two contenders.

use std::collections::BTreeMap;
use std::time::Duration;

use crewlet_company::{Active, ActiveCompany, Company};
use crewlet_coord::{Admits, Answer, Coord, Fence, ResourceName, Terms};
use crewlet_duties::scheduler::Scheduler;
use crewlet_testkit::NatsServer;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::fixture::{Local, breakable, compete, coord, twin, until};

const EXAMPLE: &str = include_str!("../../../../examples/company.toml");

/// The example company with its stand-up due every second.
fn every_second() -> ActiveCompany {
    let text = EXAMPLE.replace(r#"cron = "0 9 * * mon-fri""#, r#"cron = "* * * * * *""#);
    assert_ne!(text, EXAMPLE, "the example's stand-up schedule moved");
    let company = Company::parse(&text).expect("the example parses");
    ActiveCompany::new(Some(Active::local(company)))
}

/// The stream the wakes are published to, as the node's agent stream takes
/// them.
async fn inbox_stream(local: &Local) {
    local
        .js
        .create_stream(async_nats::jetstream::stream::Config {
            name: "DUTIES_TEST_INBOX".into(),
            subjects: vec![crewlet_bus::inbox_subject("*")],
            ..Default::default()
        })
        .await
        .expect("the inbox stream");
}

/// One contender's scheduler, working under the fences `tenure` shows.
struct Contender {
    local: Local,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Contender {
    async fn start(
        id: &str,
        coord: &Coord,
        server: &NatsServer,
        active: &ActiveCompany,
        tenure: watch::Receiver<Option<Fence>>,
    ) -> Contender {
        let local = Local::open(id, server).await;
        let work = Scheduler {
            node_id: id.into(),
            fires: coord.fires(),
            js: local.js.clone(),
            store: local.store.clone(),
            publisher: local.publisher.clone(),
            active: active.clone(),
        };
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(work.run(tenure, stopped));
        Contender { local, stop, task }
    }

    /// The fires this node published: due instant by fire key.
    fn fired(&self) -> BTreeMap<String, i64> {
        self.local
            .store
            .scheduled_runs(1_000)
            .unwrap()
            .into_iter()
            .map(|r| (r.fire_key, r.due_ms))
            .collect()
    }

    async fn stop(self) -> Local {
        let _ = self.stop.send(true);
        self.task.await.unwrap();
        self.local
    }
}

#[tokio::test]
async fn each_due_instant_fires_once_across_two_contenders_and_a_handover() {
    let server = NatsServer::start();
    let kv = twin();
    let active = every_second();
    let (a, b) = (coord(&kv, "node-a"), coord(&kv, "node-b"));
    let ttl = Duration::from_secs(3);
    let (lease_a, _, _admit_a) = compete(&a, "scheduler", ttl);
    let (lease_b, _, _admit_b) = compete(&b, "scheduler", ttl);
    let ca = Contender::start("node-a", &a, &server, &active, lease_a.fence()).await;
    inbox_stream(&ca.local).await;
    let cb = Contender::start("node-b", &b, &server, &active, lease_b.fence()).await;

    until("three fires", Duration::from_secs(20), || {
        ca.fired().len() + cb.fired().len() >= 3
    })
    .await;
    // The holder leaves (its work first, then its lease, as `Running::stop`
    // does); the other takes the duty over and fires on.
    let (holder_lease, holder, other_lease, other) = if ca.fired().is_empty() {
        (lease_b, cb, lease_a, ca)
    } else {
        (lease_a, ca, lease_b, cb)
    };
    let left = holder.stop().await;
    holder_lease.stop().await;
    let before = left.store.scheduled_runs(1_000).unwrap().len();
    until(
        "three fires by the successor",
        Duration::from_secs(20),
        || other.fired().len() >= 3,
    )
    .await;
    let successor = other.fired();
    let left_fired: BTreeMap<String, i64> = left
        .store
        .scheduled_runs(1_000)
        .unwrap()
        .into_iter()
        .map(|r| (r.fire_key, r.due_ms))
        .collect();
    other.stop().await;
    other_lease.stop().await;

    assert_eq!(left_fired.len(), before, "the node that left fired on");
    for (key, due) in &successor {
        assert!(!left_fired.contains_key(key), "{key} fired on both nodes");
        assert!(
            !left_fired.values().any(|d| d == due),
            "the instant {due} fired on both nodes"
        );
    }
    // One seat, so one fire per instant: the keys are the instants.
    let mut instants: Vec<i64> = left_fired
        .values()
        .chain(successor.values())
        .copied()
        .collect();
    let all = instants.len();
    instants.sort();
    instants.dedup();
    assert_eq!(instants.len(), all, "an instant fired twice");
}

#[tokio::test]
async fn a_lapsed_holder_is_fenced_and_fires_nothing() {
    let server = NatsServer::start();
    let kv = twin();
    let active = every_second();
    let ((cut, a), b) = (breakable(&kv, "node-a"), coord(&kv, "node-b"));
    let name = ResourceName::worker("scheduler").unwrap();
    let ttl = Duration::from_secs(2);
    let acquire = |c: &Coord| {
        let (leases, owner) = (c.leases("worker"), c.options().owner.clone());
        let name = name.clone();
        async move {
            leases
                .acquire(&name, &owner, Some(ttl), Terms::duty(ttl))
                .await
        }
    };
    let Ok(Answer::Yes(first)) = acquire(&a).await else {
        panic!("node-a wins the free duty");
    };
    let fenced = first.fence().clone();
    // Node A's renews go unanswered: its own clock fences it after the TTL.
    cut.break_store();
    until("node-a's fence says no", Duration::from_secs(10), || {
        fenced.admits() == Admits::No
    })
    .await;
    cut.heal();
    let mut second = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while second.is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "node-b takes the lapsed duty within 10 s"
        );
        match acquire(&b).await {
            Ok(Answer::Yes(t)) => second = Some(t),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let second = second.unwrap();
    assert!(
        second.epoch() > fenced.epoch(),
        "the successor's epoch is newer"
    );
    assert_eq!(fenced.admits(), Admits::No, "a lapsed fence stays no");

    // Both schedulers run, each under its own fence; the store answers both.
    let (_keep_a, tenure_a) = watch::channel(Some(fenced.clone()));
    let (_keep_b, tenure_b) = watch::channel(Some(second.fence().clone()));
    let ca = Contender::start("node-a", &a, &server, &active, tenure_a).await;
    inbox_stream(&ca.local).await;
    let cb = Contender::start("node-b", &b, &server, &active, tenure_b).await;
    until(
        "two fires by the successor",
        Duration::from_secs(20),
        || cb.fired().len() >= 2,
    )
    .await;
    assert_eq!(ca.fired(), BTreeMap::new(), "the fenced holder fired");
    ca.stop().await;
    cb.stop().await;
    drop(first);
    second.release(Some(Duration::from_secs(2))).await;
}
