//! One fleet's coordination twin, a node's local parts, and a bounded wait.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crewlet_coord::bucket::Retentions;
use crewlet_coord::{Coord, CoordOptions, Faulty, Kv, MemoryKv, Owner, SystemClock};
use crewlet_duties::tenure::{DutyLease, HeldDuties, Spec};
use crewlet_observe::Publisher;
use crewlet_store::Store;
use crewlet_testkit::NatsServer;
use tokio::sync::watch;

/// One fleet's coordination store, on the system clock (a lease lapses
/// when its TTL has passed, as on JetStream).
pub fn twin() -> Arc<dyn Kv> {
    let o = CoordOptions::new(Owner::incarnation("duties-test"));
    Arc::new(MemoryKv::new(
        Arc::new(SystemClock),
        &Retentions {
            lease_ttl: o.lease_ttl,
            status: o.status_age,
            rate: o.rate_age,
        },
    ))
}

/// A node `id` of the fleet whose store is `kv`.
pub fn coord(kv: &Arc<dyn Kv>, id: &str) -> Coord {
    Coord::with_backends(
        kv.clone(),
        kv.clone(),
        CoordOptions::new(Owner::incarnation(id)),
    )
}

/// A node `id` whose path to the store the test can cut and heal.
pub fn breakable(kv: &Arc<dyn Kv>, id: &str) -> (Arc<Faulty>, Coord) {
    let faulty = Faulty::new(kv.clone());
    let backend: Arc<dyn Kv> = faulty.clone();
    let coord = Coord::with_backends(
        backend.clone(),
        backend,
        CoordOptions::new(Owner::incarnation(id)),
    );
    (faulty, coord)
}

/// A node's own parts: its SQLite store, its event publisher, the stream.
pub struct Local {
    pub store: Arc<Store>,
    pub publisher: Publisher,
    pub js: async_nats::jetstream::Context,
    _dir: tempfile::TempDir,
}

impl Local {
    pub async fn open(id: &str, server: &NatsServer) -> Local {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open_in(dir.path()).unwrap());
        let client = async_nats::connect(server.url()).await.expect("connect");
        let js = async_nats::jetstream::new(client);
        Local {
            publisher: Publisher::new(id, store.clone(), js.clone()),
            store,
            js,
            _dir: dir,
        }
    }
}

/// Waits until `done` holds, failing after `within`.
pub async fn until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A node competing for `duty` on a lease of `ttl`: its lease loop, what it
/// shows as held, and its admission (kept open while the loop runs).
pub fn compete(
    coord: &Coord,
    duty: &'static str,
    ttl: Duration,
) -> (DutyLease, HeldDuties, watch::Sender<bool>) {
    let (admits, eligible) = watch::channel(true);
    let held = HeldDuties::default();
    let lease = DutyLease::start(
        Spec {
            leases: coord.leases("worker"),
            owner: coord.options().owner.clone(),
            duty,
            ttl,
        },
        held.clone(),
        eligible,
    );
    (lease, held, admits)
}
