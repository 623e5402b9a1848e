//! Modules on the bus: every loaded module's subscriptions consumed on
//! this node ([`consumer`]), its publications recorded as events of the
//! company's log ([`bus`]), and what an operator sees of both.
//!
//! Every node runs an instance of every loaded module (`crate`);
//! this part starts one consumer per subscription once the engine is up.
//! A drain stops it after the seats (a turn's tool call may still reach a
//! module) and before the stream: pulls stop, and an event in hand is left
//! unacknowledged, so the fleet's durable offers it again (delivery is at
//! least once, as every consumer of the stream's is).

pub mod bus;
mod consumer;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::info;

use crewlet_plugins::manifest::Delivery;
use crewlet_plugins::module::ModulePlugin;

use consumer::Subscription;

/// How one subscription is doing on this node.
#[derive(Default)]
pub struct Stats {
    handled: AtomicU64,
    refused: AtomicU64,
    waited: AtomicU64,
    dead_lettered: AtomicU64,
    state: Mutex<(&'static str, Option<String>)>,
}

impl Stats {
    fn handled(&self) {
        self.handled.fetch_add(1, Ordering::Relaxed);
    }
    fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }
    fn waited(&self, why: &str) {
        self.waited.fetch_add(1, Ordering::Relaxed);
        self.state.lock().unwrap_or_else(|p| p.into_inner()).1 = Some(why.to_string());
    }
    fn dead_lettered(&self) {
        self.dead_lettered.fetch_add(1, Ordering::Relaxed);
    }
    fn set_state(&self, state: &'static str, error: Option<String>) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = (state, error);
    }

    fn view(&self) -> Value {
        let (state, last_error) = self.state.lock().unwrap_or_else(|p| p.into_inner()).clone();
        json!({
            "state": state,
            "handled": self.handled.load(Ordering::Relaxed),
            "refused": self.refused.load(Ordering::Relaxed),
            "waited": self.waited.load(Ordering::Relaxed),
            "dead_lettered": self.dead_lettered.load(Ordering::Relaxed),
            "last_error": last_error,
        })
    }
}

/// Every subscription's stats on this node, by module then event kind.
#[derive(Default)]
pub struct Board(Mutex<BTreeMap<String, BTreeMap<String, Arc<Stats>>>>);

impl Board {
    fn stats(&self, module: &str, kind: &str) -> Arc<Stats> {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        all.entry(module.to_string())
            .or_default()
            .entry(kind.to_string())
            .or_insert_with(|| {
                let s = Stats::default();
                s.set_state("starting", None);
                Arc::new(s)
            })
            .clone()
    }

    /// `module`'s subscriptions as `/plugins` shows them.
    pub fn view(&self, module: &str) -> BTreeMap<String, Value> {
        let all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        all.get(module)
            .map(|subs| subs.iter().map(|(k, s)| (k.clone(), s.view())).collect())
            .unwrap_or_default()
    }
}

/// What `/plugins` adds to a module's entry: each subscription (its
/// delivery and, on this node, how it is doing), each tool (as seats see
/// it), each publication (the event kind it is recorded as).
pub fn view(module: &ModulePlugin, board: &Board) -> Value {
    let name = &module.manifest().name;
    let stats = board.view(name);
    let subscriptions: BTreeMap<String, Value> = module
        .subscriptions()
        .iter()
        .map(|s| {
            let kind = s.source.subject_kind();
            let mut v = stats.get(&kind).cloned().unwrap_or_else(|| json!({}));
            v["delivery"] = json!(match s.delivery {
                Delivery::Once => "once",
                Delivery::EachNode => "each-node",
            });
            (kind, v)
        })
        .collect();
    let tools: Vec<Value> = module
        .tools()
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "description": t.description,
                "offered_as": format!("{name}__{}", t.name),
                "arguments": t.arguments,
            })
        })
        .collect();
    let publishes: Vec<String> = module
        .publishes()
        .iter()
        .map(|t| crewlet_bus::module_topic_kind(name, t))
        .collect();
    json!({
        "subscriptions": subscriptions,
        "tools": tools,
        "publishes": publishes,
    })
}

/// The consumers of one module's subscriptions, until [`Running::stop`].
struct Running {
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Stops pulling and waits for every consumer to end.
    async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Every module's consumers on this node, started and stopped module by
/// module (a reloaded module's consumers are replaced; the rest run on).
pub struct Consumers {
    js: async_nats::jetstream::Context,
    board: Arc<Board>,
    running: tokio::sync::Mutex<BTreeMap<String, Running>>,
}

impl Consumers {
    pub fn new(js: async_nats::jetstream::Context, board: Arc<Board>) -> Arc<Consumers> {
        Arc::new(Consumers {
            js,
            board,
            running: tokio::sync::Mutex::default(),
        })
    }

    /// Starts a consumer for each of `module`'s subscriptions, replacing
    /// (stopping first) any running under its name.
    pub async fn start(&self, module: &Arc<ModulePlugin>) {
        let name = module.manifest().name.clone();
        let mut running = self.running.lock().await;
        if let Some(old) = running.remove(&name) {
            old.stop().await;
        }
        let (stop, stopped) = watch::channel(false);
        let tasks: Vec<_> = module
            .subscriptions()
            .iter()
            .map(|sub| {
                let kind = sub.source.subject_kind();
                let subscription = Subscription {
                    module: module.clone(),
                    stats: self.board.stats(&name, &kind),
                    kind,
                    delivery: sub.delivery,
                };
                tokio::spawn(subscription.run(self.js.clone(), stopped.clone()))
            })
            .collect();
        if !tasks.is_empty() {
            info!(subsystem = "modules", module = %name, subscriptions = tasks.len(), "module subscriptions consuming");
        }
        running.insert(name, Running { stop, tasks });
    }

    /// Stops `name`'s consumers (an event in hand is left unacknowledged,
    /// so the durable offers it again).
    pub async fn stop(&self, name: &str) {
        let old = self.running.lock().await.remove(name);
        if let Some(old) = old {
            old.stop().await;
        }
    }

    /// Stops every module's consumers (the drain).
    pub async fn stop_all(&self) {
        let all = std::mem::take(&mut *self.running.lock().await);
        for (_, running) in all {
            running.stop().await;
        }
    }
}
