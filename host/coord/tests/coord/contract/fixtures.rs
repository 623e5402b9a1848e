//! The three backends the suite runs against, behind one trait.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use crewlet_coord::{
    Clock, Coord, CoordOptions, Faulty, Kv, ManualClock, MemoryKv, NamedKv, NatsKv, Owner,
    bucket::Bucket,
};
use crewlet_testkit::{Cluster, NatsServer};

/// Options every backend runs the suite with (the same on all three).
pub fn suite_options(namespace: &str, replicas: usize) -> CoordOptions {
    let mut o = CoordOptions::new(Owner::incarnation("suite"));
    o.lease_ttl = Duration::from_secs(2);
    o.heartbeat = Duration::from_millis(500);
    o.namespace = namespace.to_owned();
    o.replicas = replicas;
    o.request_timeout = Duration::from_secs(2);
    o
}

pub fn namespace() -> String {
    format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..10])
}

pub trait Fixture: Send + Sync + 'static {
    /// A handle through member `i` (modulo the member count).
    fn coord(&self, i: usize) -> Coord;
    /// The named-bucket face of the same backend, through member `i`.
    fn named(&self, i: usize) -> Arc<dyn NamedKv>;
    fn members(&self) -> usize;
    /// The store's clock now: what lease deadlines are judged against.
    fn now(&self) -> SystemTime;
    /// Lets `d` of store time pass (advances the twin's clock, or sleeps).
    fn pass(&self, d: Duration) -> impl Future<Output = ()> + Send;
    /// Breaks (or stops) the store under every handle.
    fn break_store(&self) -> impl Future<Output = ()> + Send;
    /// Heals it; returns once reads answer again.
    fn heal_store(&self) -> impl Future<Output = ()> + Send;
    /// Makes writes land but their answers get lost.
    fn lose_acks(&self);
    /// Writes to keys containing `needle` fail without landing.
    fn fail_writes_to(&self, needle: Option<&str>);
}

// ---- memory ---------------------------------------------------------------

pub struct Memory {
    clock: ManualClock,
    kv: MemoryKv,
    faulty: Arc<Faulty>,
    opts: CoordOptions,
}

impl Memory {
    pub async fn new() -> Memory {
        let clock = ManualClock::new();
        let opts = suite_options(&namespace(), 1);
        let kv = MemoryKv::new(Arc::new(clock.clone()), &retentions(&opts));
        Memory {
            clock,
            faulty: Faulty::new(Arc::new(kv.clone())),
            kv,
            opts,
        }
    }
}

pub fn retentions(o: &CoordOptions) -> crewlet_coord::bucket::Retentions {
    crewlet_coord::bucket::Retentions {
        lease_ttl: o.lease_ttl,
        status: o.status_age,
        rate: o.rate_age,
    }
}

impl Fixture for Memory {
    fn coord(&self, _i: usize) -> Coord {
        let kv: Arc<dyn Kv> = self.faulty.clone();
        Coord::with_backends(kv.clone(), kv, self.opts.clone())
    }
    fn named(&self, _i: usize) -> Arc<dyn NamedKv> {
        Arc::new(self.kv.clone())
    }
    fn members(&self) -> usize {
        1
    }
    fn now(&self) -> SystemTime {
        self.clock.now()
    }
    async fn pass(&self, d: Duration) {
        self.clock.advance(d);
        tokio::task::yield_now().await;
    }
    async fn break_store(&self) {
        self.faulty.break_store();
    }
    async fn heal_store(&self) {
        self.faulty.heal();
    }
    fn lose_acks(&self) {
        self.faulty.lose_acks();
    }
    fn fail_writes_to(&self, needle: Option<&str>) {
        self.faulty.fail_writes_to(needle);
    }
}

// ---- real servers -----------------------------------------------------------

/// Handles on real servers: one connection (and Faulty wrapper) per member.
pub struct Real {
    handles: Vec<(Arc<Faulty>, Arc<NatsKv>)>,
    opts: CoordOptions,
    server: Option<std::sync::Mutex<NatsServer>>,
    urls: Vec<String>,
}

pub async fn connect(url: &str) -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connection_timeout(Duration::from_secs(2))
        .connect(url)
        .await
        .expect("connect to the test server")
}

async fn open_handles(urls: &[String], opts: &CoordOptions) -> Vec<(Arc<Faulty>, Arc<NatsKv>)> {
    let mut handles = Vec::new();
    for url in urls {
        let client = connect(url).await;
        let nats = NatsKv::open(
            client,
            &opts.namespace,
            &Bucket::ALL,
            &retentions(opts),
            opts.replicas,
            opts.request_timeout,
        )
        .await
        .expect("open buckets");
        let nats = Arc::new(nats);
        handles.push((Faulty::new(nats.clone()), nats));
    }
    handles
}

impl Real {
    /// A fresh single server of its own.
    pub async fn single() -> Real {
        // Started on the test's own thread, which outlives the test body: a
        // server spawned from a blocking-pool thread gets its parent-death
        // signal when that idle thread retires (after about 10 s).
        let server = NatsServer::start();
        let urls = vec![server.url()];
        let opts = suite_options(&namespace(), 1);
        let handles = open_handles(&urls, &opts).await;
        Real {
            handles,
            opts,
            server: Some(std::sync::Mutex::new(server)),
            urls,
        }
    }

    /// The shared 3-node cluster (one per test binary), R3 buckets under a
    /// fresh namespace, one connection per member.
    pub async fn cluster() -> Real {
        let urls = tokio::task::spawn_blocking(|| shared_cluster().urls())
            .await
            .expect("start cluster");
        let opts = suite_options(&namespace(), 3);
        let handles = open_handles(&urls, &opts).await;
        Real {
            handles,
            opts,
            server: None,
            urls,
        }
    }

    pub fn nats(&self, i: usize) -> Arc<NatsKv> {
        self.handles[i % self.handles.len()].1.clone()
    }

    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    pub fn options(&self) -> &CoordOptions {
        &self.opts
    }
}

pub fn shared_cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<&'static Cluster> = OnceLock::new();
    CLUSTER.get_or_init(Cluster::leak_on_keeper_thread)
}

impl Fixture for Real {
    fn coord(&self, i: usize) -> Coord {
        let kv: Arc<dyn Kv> = self.handles[i % self.handles.len()].0.clone();
        Coord::with_backends(kv.clone(), kv, self.opts.clone())
    }
    fn named(&self, i: usize) -> Arc<dyn NamedKv> {
        self.handles[i % self.handles.len()].1.clone()
    }
    fn members(&self) -> usize {
        self.handles.len()
    }
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
    async fn pass(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }
    async fn break_store(&self) {
        match &self.server {
            // A single server is really stopped.
            Some(s) => s.lock().expect("server lock").kill(),
            None => self.handles.iter().for_each(|(f, _)| f.break_store()),
        }
    }
    async fn heal_store(&self) {
        self.handles.iter().for_each(|(f, _)| f.heal());
        match &self.server {
            Some(s) if !s.lock().expect("server lock").is_running() => {
                {
                    let mut s = s.lock().expect("server lock");
                    s.restart();
                    s.wait_healthy(Duration::from_secs(20));
                }
                // Until the client has reconnected and the leader answers.
                let c = self.coord(0);
                let probe = crewlet_coord::ResourceName::parse("seat:heal-probe").unwrap();
                let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
                while let Err(e) = c.get(&probe).await {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "store did not come back: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            _ => {}
        }
    }
    fn lose_acks(&self) {
        self.handles.iter().for_each(|(f, _)| f.lose_acks());
    }
    fn fail_writes_to(&self, needle: Option<&str>) {
        self.handles
            .iter()
            .for_each(|(f, _)| f.fail_writes_to(needle));
    }
}
