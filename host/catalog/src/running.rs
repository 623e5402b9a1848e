//! The catalogue at work on a node once the engine is up: every loaded
//! module's subscriptions consumed ([`crate::modules`]) and, with
//! `[plugins] reload`, the folders watched ([`crate::reload`]).
//!
//! [`Running::stop`] ends them in the one safe order: the reload loop first
//! (no swap can start a consumer after it), then every consumer (an event in
//! hand is offered again by its durable), then each module's watches —
//! all before the broker they read stops, which is the caller's to order.

use std::sync::Arc;

use tokio::sync::watch;
use tracing::info;

use crate::Loaded;
use crate::modules::Consumers;

/// What [`start`] needs: the plugins loaded at start, the stream's
/// JetStream context, and whether to watch the folders.
pub struct Parts {
    pub loaded: Arc<Loaded>,
    pub js: async_nats::jetstream::Context,
    pub reload: bool,
}

/// The consumers and the reload loop, until [`Running::stop`].
pub struct Running {
    loaded: Arc<Loaded>,
    consumers: Arc<Consumers>,
    reload: Option<(watch::Sender<bool>, tokio::task::JoinHandle<()>)>,
}

/// Starts a consumer for every subscription of every loaded module, then
/// (with `reload`) the reload loop.
pub async fn start(parts: Parts) -> Running {
    let Parts { loaded, js, reload } = parts;
    let consumers = Consumers::new(js, loaded.board.clone());
    for module in loaded.installed.modules() {
        consumers.start(&module).await;
    }
    let reload = match reload {
        true => {
            let (stop, stopped) = watch::channel(false);
            let task = tokio::spawn(crate::watch(
                loaded.clone(),
                Some(consumers.clone()),
                stopped,
            ));
            Some((stop, task))
        }
        false => {
            info!(
                subsystem = "plugins",
                "[plugins] reload = false: plugin files are read at start only"
            );
            None
        }
    };
    Running {
        loaded,
        consumers,
        reload,
    }
}

impl Running {
    /// Whether the plugin folders are watched.
    pub fn reloading(&self) -> bool {
        self.reload.is_some()
    }

    /// Stops the reload loop, then every consumer, then every module's
    /// watches, waiting for each.
    pub async fn stop(self) {
        if let Some((stop, task)) = self.reload {
            let _ = stop.send(true);
            let _ = task.await;
        }
        self.consumers.stop_all().await;
        for module in self.loaded.installed.modules() {
            module.stop().await;
        }
    }
}
