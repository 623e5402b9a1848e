//! Shared set-up for the seat tests: a real nats-server with the streams, a
//! company, mailboxes, nodes with a recording host, presence leases.
#![allow(dead_code)]

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use crewlet_bus::Wake;
use crewlet_company::{Active, ActiveCompany, Company};
use crewlet_coord::{Answer, Bucket, Coord, CoordOptions, NodeStatus, Owner, ResourceName};
use crewlet_seats::{Batch, SeatHost, SeatLeases, SeatSpec, Seats, SeatsConfig, TurnVerdict};
use crewlet_testkit::NatsServer;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub const HEARTBEAT: Duration = Duration::from_millis(200);
pub const TTL: Duration = Duration::from_secs(1);
/// How long a test waits for a condition before failing.
pub const PATIENCE: Duration = Duration::from_secs(20);

pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// A company of `seats` (handle, group), all in one role.
pub fn company(seats: &[(&str, Option<&str>)]) -> Company {
    let mut doc = String::from(
        r#"
[org]
name = "Seat Test"

[roles.eng]
system_prompt = "test"
executor = [{ provider = "openai", model = "m", credentials = "${K}" }]
reviewer = { provider = "openai", model = "m", credentials = "${K}" }

[seats]
"#,
    );
    for (h, g) in seats {
        match g {
            Some(g) => doc.push_str(&format!("{h} = {{ role = \"eng\", group = \"{g}\" }}\n")),
            None => doc.push_str(&format!("{h} = {{ role = \"eng\" }}\n")),
        }
    }
    Company::parse(&doc).unwrap_or_else(|e| panic!("{e}"))
}

pub fn handles(n: usize, prefix: &str) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// One server with the streams, and a company's mailboxes.
pub struct Env {
    pub server: NatsServer,
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    /// An observer's coordination handle (owner `observer`).
    pub coord: Coord,
    pub active: ActiveCompany,
}

pub fn coord_options(owner: &Owner) -> CoordOptions {
    let mut o = CoordOptions::new(owner.clone());
    o.heartbeat = HEARTBEAT;
    o.lease_ttl = TTL;
    o.request_timeout = Duration::from_secs(2);
    o
}

impl Env {
    pub async fn start(company: Company) -> Env {
        init_logs();
        let server = NatsServer::start();
        let client = async_nats::connect(server.url()).await.unwrap();
        let js = jetstream::new(client.clone());
        crewlet_stream::streams::ensure_streams(&js, 1)
            .await
            .unwrap();
        let coord = Coord::open(client.clone(), coord_options(&Owner("observer".into())))
            .await
            .unwrap();
        crewlet_stream::ensure_mailboxes(
            &js,
            &coord.records(Bucket::Mailboxes),
            company.handles().map(|h| h.as_str()),
        )
        .await
        .unwrap();
        Env {
            server,
            client,
            js,
            coord,
            active: ActiveCompany::new(Some(Active::local(company))),
        }
    }

    /// Publishes a wake to `handle`'s inbox and waits for the stream's ack.
    pub async fn wake(&self, handle: &str, delivery: &str, conversation: Option<&str>) {
        let w = Wake {
            trace_id: format!("trace-{delivery}"),
            delivery_id: delivery.to_owned(),
            source: "test".into(),
            event_type: "ping".into(),
            handle: handle.to_owned(),
            seat_id: String::new(),
            reason: "route".into(),
            text: None,
            conversation: conversation.map(str::to_owned),
            channel: None,
            thread: None,
            owed: None,
            sender: None,
        };
        self.publish_raw(handle, serde_json::to_vec(&w).unwrap())
            .await;
    }

    pub async fn publish_raw(&self, handle: &str, body: Vec<u8>) {
        self.js
            .publish(crewlet_bus::inbox_subject(handle), body.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }

    /// (pending, ack pending, waiting pull requests) of a mailbox.
    pub async fn mailbox(&self, handle: &str) -> (u64, usize, usize) {
        mailbox_info(&self.js, handle).await
    }

    /// Messages left in the agent stream.
    pub async fn agent_messages(&self) -> u64 {
        let mut s = self.js.get_stream(crewlet_bus::AGENT_STREAM).await.unwrap();
        s.info().await.unwrap().state.messages
    }

    /// Who holds `seat:HANDLE` now, per the store (None: not held).
    pub async fn holder_of(&self, handle: &str) -> Option<Owner> {
        let name = ResourceName::seat(handle).unwrap();
        match self.coord.get(&name).await.unwrap() {
            Answer::Yes(l) => Some(l.owner),
            Answer::No(_) => None,
        }
    }

    /// A node's own connection and coordination handle.
    pub async fn node_coord(&self, owner: &Owner) -> (jetstream::Context, Coord) {
        let client = async_nats::connect(self.server.url()).await.unwrap();
        let coord = Coord::open(client.clone(), coord_options(owner))
            .await
            .unwrap();
        (jetstream::new(client), coord)
    }

    /// Starts a node: presence lease (roles `seats`) when `presence`, then seats.
    pub async fn node(&self, id: &str, host: Recorder, presence: bool) -> Node {
        self.node_with(id, host, presence, |_| {}).await
    }

    pub async fn node_with(
        &self,
        id: &str,
        host: Recorder,
        presence: bool,
        tune: impl FnOnce(&mut SeatsConfig<Recorder>),
    ) -> Node {
        let owner = Owner::incarnation(id);
        let (js, coord) = self.node_coord(&owner).await;
        let host = Arc::new(host.with_js(js.clone()));
        let presence = if presence {
            Some(Presence::start(coord.clone(), id, owner.clone()).await)
        } else {
            None
        };
        let mut cfg = SeatsConfig::new(
            id,
            owner.clone(),
            SeatLeases::of(&coord),
            js,
            self.active.clone(),
            host.clone(),
        );
        cfg.fetch_expiry = Duration::from_millis(200);
        cfg.batch_window = Duration::from_millis(150);
        cfg.equip_backoff = Duration::from_secs(30);
        tune(&mut cfg);
        let seats = Seats::start(cfg).unwrap();
        Node {
            id: id.to_owned(),
            owner,
            seats: Some(seats),
            host,
            presence,
        }
    }
}

pub async fn mailbox_info(js: &jetstream::Context, handle: &str) -> (u64, usize, usize) {
    let mut c: jetstream::consumer::PullConsumer = js
        .get_consumer_from_stream(
            crewlet_bus::mailbox_durable(handle),
            crewlet_bus::AGENT_STREAM,
        )
        .await
        .unwrap();
    let i = c.info().await.unwrap();
    (i.num_pending, i.num_ack_pending, i.num_waiting)
}

pub struct Node {
    pub id: String,
    pub owner: Owner,
    pub seats: Option<Seats<Recorder>>,
    pub host: Arc<Recorder>,
    pub presence: Option<Presence>,
}

impl Node {
    pub fn seats(&self) -> &Seats<Recorder> {
        self.seats.as_ref().expect("seats running")
    }

    pub fn held_handles(&self) -> BTreeSet<String> {
        self.seats()
            .held()
            .into_iter()
            .map(|h| h.handle.as_str().to_owned())
            .collect()
    }

    /// Waits until this node serves exactly `n` seats.
    pub async fn wait_held(&self, n: usize) {
        let mut rx = self.seats().watch_held();
        let r = tokio::time::timeout(PATIENCE, rx.wait_for(|v| *v == n)).await;
        assert!(
            r.is_ok(),
            "node {} did not come to hold {n} seats (holds {:?})",
            self.id,
            self.held_handles()
        );
    }

    pub async fn stop(&mut self) {
        if let Some(s) = self.seats.take() {
            s.stop().await;
        }
        if let Some(p) = self.presence.take() {
            p.stop().await;
        }
    }
}

/// A node's presence lease, renewed on the heartbeat, carrying role `seats`.
pub struct Presence {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Presence {
    pub async fn start(coord: Coord, node_id: &str, owner: Owner) -> Presence {
        let status = NodeStatus {
            roles: vec!["seats".into()],
            ..NodeStatus::default()
        };
        let mut lease = match coord
            .acquire_presence(node_id, &owner, status.clone())
            .await
            .unwrap()
        {
            Answer::Yes(l) => l,
            Answer::No(h) => panic!("presence refused: {h:?}"),
        };
        let (stop, mut rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(HEARTBEAT / 2) => {}
                    _ = rx.changed() => break,
                }
                if let Ok(Answer::Yes(l)) = coord.renew_presence(&lease, status.clone()).await {
                    lease = l;
                }
            }
            let _ = coord.release(&lease).await;
        });
        Presence { stop, task }
    }

    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// One call the host saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Equip {
        seat: String,
    },
    /// A hydration, and whether it read the seat's memory.
    Hydrate {
        seat: String,
        read: bool,
    },
    Unequip {
        seat: String,
        /// Pull requests waiting on the seat's mailbox when unequip began.
        waiting_pulls: usize,
        /// Turns of this seat still running when unequip began.
        running: usize,
    },
    RunStart {
        seat: String,
        conversation: Option<String>,
        deliveries: Vec<String>,
        epoch: crewlet_coord::FenceEpoch,
    },
    RunEnd {
        seat: String,
        deliveries: Vec<String>,
    },
    /// An unequip the test host never lets finish.
    UnequipHung {
        seat: String,
    },
}

impl Call {
    pub fn seat(&self) -> &str {
        match self {
            Call::Equip { seat }
            | Call::Hydrate { seat, .. }
            | Call::Unequip { seat, .. }
            | Call::RunStart { seat, .. }
            | Call::RunEnd { seat, .. }
            | Call::UnequipHung { seat } => seat,
        }
    }
}

/// What a turn does: wait, then answer.
#[derive(Debug, Clone)]
pub struct Step {
    pub take: Duration,
    pub verdict: TurnVerdict,
}

/// A host that records every call; turns follow a script keyed by the
/// first wake's delivery id (default: done at once).
pub struct Recorder {
    calls: Mutex<Vec<Call>>,
    changed: watch::Sender<usize>,
    fail_equip: Mutex<BTreeSet<String>>,
    /// Seats whose equip (or unequip) never returns once called.
    hang_equip: BTreeSet<String>,
    unreadable_memory: Mutex<BTreeSet<String>>,
    hang_unequip: BTreeSet<String>,
    script: Mutex<HashMap<String, VecDeque<Step>>>,
    running: Mutex<HashMap<String, usize>>,
    js: Option<jetstream::Context>,
}

pub struct Equipped {
    pub seat: String,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder {
            calls: Mutex::new(Vec::new()),
            changed: watch::channel(0).0,
            fail_equip: Mutex::new(BTreeSet::new()),
            hang_equip: BTreeSet::new(),
            unreadable_memory: Mutex::new(BTreeSet::new()),
            hang_unequip: BTreeSet::new(),
            script: Mutex::new(HashMap::new()),
            running: Mutex::new(HashMap::new()),
            js: None,
        }
    }

    pub fn failing_equip(self, handle: &str) -> Recorder {
        self.fail_equip.lock().unwrap().insert(handle.to_owned());
        self
    }

    /// From now on `handle`'s equip succeeds (what it lacked arrived).
    pub fn mend_equip(&self, handle: &str) {
        self.fail_equip.lock().unwrap().remove(handle);
    }

    /// `handle`'s memory cannot be read until [`Recorder::mend_memory`].
    pub fn unreadable_memory(self, handle: &str) -> Recorder {
        self.unreadable_memory
            .lock()
            .unwrap()
            .insert(handle.to_owned());
        self
    }

    /// From now on `handle`'s memory reads.
    pub fn mend_memory(&self, handle: &str) {
        self.unreadable_memory.lock().unwrap().remove(handle);
    }

    /// How many hydrations of `seat` did (`read`) or did not read.
    pub fn hydrations(&self, seat: &str, read: bool) -> usize {
        self.calls_of(seat)
            .iter()
            .filter(|c| matches!(c, Call::Hydrate { read: r, .. } if *r == read))
            .count()
    }

    pub fn hanging_equip(mut self, handle: &str) -> Recorder {
        self.hang_equip.insert(handle.to_owned());
        self
    }

    pub fn hanging_unequip(mut self, handle: &str) -> Recorder {
        self.hang_unequip.insert(handle.to_owned());
        self
    }

    pub fn with_js(mut self, js: jetstream::Context) -> Recorder {
        self.js = Some(js);
        self
    }

    /// Turns whose first wake is `delivery` follow `steps`, in order.
    pub fn script(&self, delivery: &str, steps: Vec<Step>) {
        self.script
            .lock()
            .unwrap()
            .insert(delivery.to_owned(), steps.into());
    }

    fn record(&self, c: Call) {
        self.calls.lock().unwrap().push(c);
        self.changed.send_modify(|n| *n += 1);
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    pub fn calls_of(&self, seat: &str) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.seat() == seat)
            .collect()
    }

    /// Runs that started, as (seat, conversation, deliveries).
    pub fn runs(&self) -> Vec<(String, Option<String>, Vec<String>)> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::RunStart {
                    seat,
                    conversation,
                    deliveries,
                    ..
                } => Some((seat, conversation, deliveries)),
                _ => None,
            })
            .collect()
    }

    pub fn runs_of_delivery(&self, delivery: &str) -> usize {
        self.runs()
            .iter()
            .filter(|(_, _, d)| d.iter().any(|x| x == delivery))
            .count()
    }

    /// Waits until `seat`'s equip has been called.
    pub async fn wait_equip(&self, seat: &str) {
        self.wait(&format!("{seat}'s equip"), |c| {
            c.iter()
                .any(|c| matches!(c, Call::Equip { seat: s } if s == seat))
        })
        .await
    }

    /// Whether `seat`'s unequip was ever called (finished or hung).
    pub fn unequip_called(&self, seat: &str) -> bool {
        self.calls_of(seat)
            .iter()
            .any(|c| matches!(c, Call::Unequip { .. } | Call::UnequipHung { .. }))
    }

    /// Waits until `pred` holds over the calls, or fails the test.
    pub async fn wait(&self, what: &str, pred: impl Fn(&[Call]) -> bool) {
        let mut rx = self.changed.subscribe();
        let ok = tokio::time::timeout(PATIENCE, async {
            loop {
                if pred(&self.calls()) {
                    return;
                }
                let _ = rx.changed().await;
            }
        })
        .await;
        assert!(
            ok.is_ok(),
            "timed out waiting for {what}; calls: {:#?}",
            self.calls()
        );
    }
}

impl SeatHost for Recorder {
    type Equipped = Equipped;

    async fn equip(&self, seat: &SeatSpec, _active: &Active) -> Result<Equipped, String> {
        let h = seat.handle.as_str().to_owned();
        self.record(Call::Equip { seat: h.clone() });
        if self.fail_equip.lock().unwrap().contains(&h) {
            return Err(format!("seat {h} cannot be equipped (test)"));
        }
        if self.hang_equip.contains(&h) {
            std::future::pending::<()>().await;
        }
        Ok(Equipped { seat: h })
    }

    async fn hydrate(&self, seat: &SeatSpec) -> Result<(), String> {
        let h = seat.handle.as_str().to_owned();
        let read = !self.unreadable_memory.lock().unwrap().contains(&h);
        self.record(Call::Hydrate {
            seat: h.clone(),
            read,
        });
        if read {
            Ok(())
        } else {
            Err(format!("seat {h}'s memory cannot be read (test)"))
        }
    }

    async fn unequip(&self, seat: &SeatSpec, equipped: Equipped) {
        assert_eq!(seat.handle.as_str(), equipped.seat);
        if self.hang_unequip.contains(&equipped.seat) {
            self.record(Call::UnequipHung {
                seat: equipped.seat.clone(),
            });
            std::future::pending::<()>().await;
        }
        let waiting_pulls = match &self.js {
            Some(js) => mailbox_info(js, &equipped.seat).await.2,
            None => 0,
        };
        let running = self
            .running
            .lock()
            .unwrap()
            .get(&equipped.seat)
            .copied()
            .unwrap_or(0);
        self.record(Call::Unequip {
            seat: equipped.seat,
            waiting_pulls,
            running,
        });
    }

    async fn run(&self, seat: &SeatSpec, equipped: &Equipped, batch: Batch) -> TurnVerdict {
        assert_eq!(seat.handle.as_str(), equipped.seat);
        let deliveries: Vec<String> = batch.wakes.iter().map(|w| w.delivery_id.clone()).collect();
        *self
            .running
            .lock()
            .unwrap()
            .entry(equipped.seat.clone())
            .or_default() += 1;
        self.record(Call::RunStart {
            seat: equipped.seat.clone(),
            conversation: batch.conversation.clone(),
            deliveries: deliveries.clone(),
            epoch: batch.fence.epoch(),
        });
        let step = self
            .script
            .lock()
            .unwrap()
            .get_mut(&deliveries[0])
            .and_then(|q| q.pop_front())
            .unwrap_or(Step {
                take: Duration::ZERO,
                verdict: TurnVerdict::Done,
            });
        if !step.take.is_zero() {
            tokio::time::sleep(step.take).await;
        }
        *self
            .running
            .lock()
            .unwrap()
            .get_mut(&equipped.seat)
            .unwrap() -= 1;
        self.record(Call::RunEnd {
            seat: equipped.seat.clone(),
            deliveries,
        });
        step.verdict
    }
}

/// Polls `f` until it answers true, or fails the test (for store state,
/// which has no event to await).
pub async fn until<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if f().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
