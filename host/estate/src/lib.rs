//! The estate's wiring on a node (`crewlet-statelog` is the estate itself):
//! the node only hands this crate plain handles ([`Parts`]) and translates
//! its answers to HTTP; it never reaches the statelog's parts itself.
//!
//! Every node publishes its own usage (the usage domain's objects, tallied
//! from the usage events its publisher keeps — [`tap`] — whether they go to
//! its log or onto custody) whatever its roles: a node that keeps no estate
//! or log still counts in history. A restarted node resumes its open days
//! from its log (with `data`; exact) or from the values it last published
//! (without), so a day republished replaces and never shrinks. A node with `data` also holds the estate: it
//! runs the usage domain's applier, answers peers' snapshot requests, and
//! answers `GET /usage` from its own file. `/health` `estate` shows where
//! each domain's applier stands, and a stopped (diverged) one with its fix.

use std::sync::Arc;
use std::time::Duration;

use crewlet_statelog::snapshot::{self, Adopter};
use crewlet_statelog::usage::{Tally, USAGE_EVENT_KINDS, Usage, UsageEvent, UsagePublisher};
use crewlet_statelog::{Applier, ApplierParts, Domain, Estate, Local, PositionBook};
use crewlet_store::EventRecord;
use tokio::sync::watch;
use tracing::{Instrument, info, info_span, warn};

pub mod backup;
mod slot;

pub use slot::{EstateSlot, NodeEstate, UsageAsk, render_usage, usage};

/// Why a usage read, an eviction or a readmission was refused; each text
/// says what to do (the HTTP crate maps it onto its answer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsageRefusal {
    /// The asker's query does not parse: theirs to fix.
    #[error("{0}")]
    BadQuery(String),
    /// This node holds no estate: ask a node with `data`.
    #[error("{0}")]
    NotHeld(String),
    /// The estate or the positions bucket did not answer: retry.
    #[error("{0}")]
    Unavailable(String),
    /// No such node on the state log: nothing was changed.
    #[error("{0}")]
    UnknownNode(String),
}

/// How often a node publishes the usage objects that moved.
const PUBLISH_EVERY: Duration = Duration::from_secs(2);
/// Events read per page while tallying.
const PAGE: usize = 2_000;

/// Where the usage events this node's publisher keeps arrive.
pub type UsageEvents = tokio::sync::mpsc::UnboundedReceiver<EventRecord>;

/// The tap the node's publisher hands its usage events to, and where they
/// arrive (given to [`start`]).
pub fn tap() -> (crewlet_observe::Tap, UsageEvents) {
    crewlet_observe::Tap::new(&USAGE_EVENT_KINDS)
}

/// What the estate is started with (from the engine's context).
pub struct Parts<'a> {
    pub usage_events: UsageEvents,
    pub node_id: &'a str,
    pub client: &'a async_nats::Client,
    pub coord: &'a crewlet_coord::Coord,
    pub store: &'a Arc<crewlet_store::Store>,
    pub active: &'a crewlet_company::ActiveCompany,
    pub config: &'a crewlet_config::NodeConfig,
}

/// The started estate; [`Running::stop`] stops the applier, the snapshot
/// donor and the usage publisher.
pub struct Running {
    stop: watch::Sender<bool>,
    publisher: tokio::task::JoinHandle<()>,
    donor: Option<tokio::task::JoinHandle<()>>,
    held: Option<Arc<NodeEstate>>,
}

impl Running {
    pub async fn stop(self) {
        if let Some(held) = &self.held {
            held.applier.stop().await;
        }
        if let Some(donor) = self.donor {
            donor.abort();
        }
        let _ = self.stop.send(true);
        let _ = self.publisher.await;
    }
}

/// Starts the usage publisher, and with `data` the estate (set in `slot`),
/// its applier and the snapshot donor.
pub async fn start(p: Parts<'_>, slot: &EstateSlot) -> Running {
    let js = async_nats::jetstream::new(p.client.clone());
    let replicas = p.config.stream.replicas;
    if let Err(e) = crewlet_statelog::ensure_stream(&js, &Usage, replicas).await {
        warn!(subsystem = "statelog", error = %e, "usage log not opened; the publisher and applier retry");
    }
    let (stop_tx, stop) = watch::channel(false);
    let data = p.config.roles.contains(&crewlet_config::Role::Data);
    let publisher = tokio::spawn(
        publish_usage(
            Tallier {
                node: p.node_id.to_owned(),
                js: js.clone(),
                past: data.then(|| p.store.clone()),
                active: p.active.clone(),
            },
            p.usage_events,
            stop,
        )
        .instrument(info_span!("usage", subsystem = "statelog")),
    );
    let mut running = Running {
        stop: stop_tx,
        publisher,
        donor: None,
        held: None,
    };
    if !data {
        info!(
            subsystem = "statelog",
            "this node has no `data` role: it holds no replicated estate"
        );
        return running;
    }
    let dir = p.config.data_dir.clone();
    let opened = Estate::open_in(&dir).and_then(|e| Ok((e, Local::open_in(&dir)?)));
    let (estate, local) = match opened {
        Ok((e, l)) => (Arc::new(e), Arc::new(l)),
        Err(e) => {
            warn!(subsystem = "statelog", error = %e, "the replicated estate cannot be opened; this node answers no usage");
            return running;
        }
    };
    let book = PositionBook::new(p.coord.clone());
    let applier = Applier::start(ApplierParts {
        js: js.clone(),
        estate: estate.clone(),
        local,
        domain: Arc::new(Usage),
        book: Some(book.clone()),
        adopter: Some(Adopter {
            client: p.client.clone(),
            js: js.clone(),
            book: book.clone(),
            node: p.node_id.to_owned(),
            staging: dir.clone(),
        }),
        node: p.node_id.to_owned(),
        replicas,
    });
    // The donor offers a copy only while this applier applies.
    let donor = snapshot::Donor {
        client: p.client.clone(),
        js,
        estate: estate.clone(),
        node: p.node_id.to_owned(),
        staging: dir,
        book: Some(book),
        domains: vec![applier.watch()],
    };
    match snapshot::serve(donor).await {
        Ok(serving) => running.donor = Some(serving),
        Err(e) => {
            warn!(subsystem = "statelog", error = %e, "peers cannot adopt this node's estate")
        }
    }
    let held = Arc::new(NodeEstate { estate, applier });
    slot.set(held.clone());
    running.held = Some(held);
    info!(
        subsystem = "statelog",
        "replicated estate open; applying the usage log"
    );
    running
}

/// What the usage publisher tallies with: this node, the stream, where
/// its past is (its log with `data`; without, what it published before),
/// and the active company (whose zone makes the days).
struct Tallier {
    node: String,
    js: async_nats::jetstream::Context,
    past: Option<Arc<crewlet_store::Store>>,
    active: crewlet_company::ActiveCompany,
}

impl Tallier {
    /// The tally of this node's open days before now (from the start of
    /// yesterday, company days a zone away included), and the log position
    /// it read to (0 without a log): a tapped event at or below it was
    /// counted already.
    async fn resume(&self, zone: &jiff::tz::TimeZone) -> Result<(Tally, i64), String> {
        let since = crewlet_os::now_ms() - 2 * 24 * 3600 * 1000;
        let mut tally = Tally::default();
        let Some(store) = &self.past else {
            let day = crewlet_statelog::usage::company_day(since, zone);
            let objects = crewlet_statelog::usage::published(&self.js, &self.node, &day)
                .await
                .map_err(|e| e.to_string())?;
            tally.resume(objects);
            return Ok((tally, 0));
        };
        let mut after = 0i64;
        loop {
            let (s, node) = (store.clone(), self.node.clone());
            let page = tokio::task::spawn_blocking(move || {
                s.usage_events(&node, &USAGE_EVENT_KINDS, after, since, PAGE)
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("the event log could not be read: {e}"))?;
            let full = page.len() == PAGE;
            for e in page {
                after = e.seq;
                tally.add(&usage_event(e.kind, e.at_ms, e.seat, e.payload), zone);
            }
            if !full {
                return Ok((tally, after));
            }
        }
    }
}

/// An event as the tally reads it (a row of the log, or a tapped event).
fn usage_event(
    kind: String,
    at_ms: i64,
    seat: Option<String>,
    payload: serde_json::Value,
) -> UsageEvent {
    UsageEvent {
        kind,
        at_ms,
        seat,
        payload,
    }
}

/// Tallies the usage events this node's publisher keeps (`events`) and
/// publishes what moved, until `stop`. Starts once the company (its zone)
/// is known, from the node's open days ([`Tallier::resume`]).
async fn publish_usage(t: Tallier, mut events: UsageEvents, mut stop: watch::Receiver<bool>) {
    let mut publisher = UsagePublisher::new(t.js.clone());
    let mut resumed: Option<(Tally, i64)> = None;
    loop {
        if let Some(company) = t.active.current().map(|a| a.company) {
            let zone =
                jiff::tz::TimeZone::get(&company.timezone).unwrap_or(jiff::tz::TimeZone::UTC);
            if resumed.is_none() {
                match t.resume(&zone).await {
                    Ok(r) => resumed = Some(r),
                    Err(e) => {
                        warn!(error = %e, "usage not tallied yet: this node's open days could not be read back; retried next pass")
                    }
                }
            }
            if let Some((tally, read_to)) = &mut resumed {
                while let Ok(e) = events.try_recv() {
                    // Kept in the log the resume read: counted there.
                    if e.seq > 0 && e.seq <= *read_to {
                        continue;
                    }
                    tally.add(&usage_event(e.kind, e.at_ms, e.seat, e.payload), &zone);
                }
                let role_of = |seat: &str| {
                    company
                        .seat(seat)
                        .map(|s| s.role.clone())
                        .unwrap_or_default()
                };
                if let Err(e) = publisher.publish(tally.objects(&t.node, role_of)).await {
                    warn!(error = %e, "usage not published this pass; published next pass");
                }
                let yesterday = crewlet_statelog::usage::company_day(
                    crewlet_os::now_ms() - 24 * 3600 * 1000,
                    &zone,
                );
                tally.forget_before(&yesterday);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(PUBLISH_EVERY) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// An operator's audited eviction or readmission: which node, and why.
#[derive(Debug, Clone)]
pub struct Audited {
    pub node: String,
    pub reason: String,
}

/// An operator's audited readmission of an evicted node: the eviction is
/// ended (the node applies again — adopting a peer's snapshot first if
/// the log was trimmed past it — and its position counts in the trim once
/// it publishes one) and a `node_readmitted` event records who and why.
pub async fn readmit(
    coord: &crewlet_coord::Coord,
    publisher: &crewlet_observe::Publisher,
    ask: Audited,
) -> Result<serde_json::Value, UsageRefusal> {
    let book = PositionBook::new(coord.clone());
    let ended = book.readmit(&ask.node).await.map_err(|e| {
        UsageRefusal::Unavailable(format!(
            "the positions bucket did not answer: {e}; whether `{}` was readmitted is unknown, retry",
            ask.node
        ))
    })?;
    let Some(eviction) = ended else {
        return Err(UsageRefusal::UnknownNode(format!(
            "node `{}` is not evicted; nothing was readmitted",
            ask.node
        )));
    };
    let payload = serde_json::json!({"node": ask.node, "reason": ask.reason,
        "evicted_at_ms": eviction.at_ms, "evicted_for": eviction.reason});
    let ev = publisher.event("node_readmitted", payload.clone());
    let _ = publisher.record(ev).await;
    info!(subsystem = "statelog", node = %ask.node, reason = %ask.reason, "node readmitted to the state log");
    Ok(serde_json::json!({"readmitted": payload}))
}

/// An operator's audited eviction of a data node gone for good: recorded in
/// the positions bucket (the trim stops counting the node; its position row
/// stays, a readmission is judged by it) and as a `node_evicted` event.
pub async fn evict(
    coord: &crewlet_coord::Coord,
    publisher: &crewlet_observe::Publisher,
    ask: Audited,
) -> Result<serde_json::Value, UsageRefusal> {
    let book = PositionBook::new(coord.clone());
    let unknown = |e: crewlet_coord::CoordError| {
        UsageRefusal::Unavailable(format!(
            "the positions bucket did not answer: {e}; nothing was evicted, retry"
        ))
    };
    let positions = book.positions(Usage.name()).await.map_err(unknown)?;
    let Some(position) = positions.get(&ask.node).copied() else {
        return Err(UsageRefusal::UnknownNode(format!(
            "no data node `{}` has a position on the state log (known: {}); nothing was evicted",
            ask.node,
            positions.keys().cloned().collect::<Vec<_>>().join(", ")
        )));
    };
    let eviction = crewlet_statelog::Eviction {
        node: ask.node.clone(),
        by: "operator".into(),
        reason: ask.reason.clone(),
        at_ms: crewlet_os::now_ms(),
    };
    book.evict(&eviction).await.map_err(unknown)?;
    let payload = serde_json::json!({"node": ask.node, "reason": ask.reason, "position": position});
    let ev = publisher.event("node_evicted", payload.clone());
    let _ = publisher.record(ev).await;
    warn!(subsystem = "statelog", node = %ask.node, reason = %ask.reason, "node evicted from the state log's trim");
    Ok(serde_json::json!({"evicted": payload}))
}
