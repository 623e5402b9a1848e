//! What `PUT /config` and `GET /config` ask of the config plane (the routes
//! themselves are `crewlet-api`'s, answering 503 with Retry-After until the
//! engine is up): a document the node accepted is stored, then activated;
//! the active revision is read back with every node's word on what it
//! applied. An unreadable pointer is unknown (an error), never "unset".

use crewlet_company::{ActiveCompany, Company};
use crewlet_coord::{ConfigPointer, Pointer};
use crewlet_observe::Publisher;
use crewlet_os::ConfigEpoch;
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::activation::{Activation, ConfigError, activate, announce, fetch};

/// The config plane as the operator's requests reach it. Cheap to clone.
#[derive(Clone)]
pub struct Plane {
    node_id: String,
    pointer: ConfigPointer,
    publisher: Publisher,
    active: ActiveCompany,
    /// Where a move is told to every node's reconciler; `None`: they apply
    /// it on their next poll.
    hints: Option<async_nats::Client>,
}

impl Plane {
    pub fn new(
        node_id: String,
        pointer: ConfigPointer,
        publisher: Publisher,
        active: ActiveCompany,
    ) -> Plane {
        Plane {
            node_id,
            pointer,
            publisher,
            active,
            hints: None,
        }
    }

    /// Tells every node's reconciler through `client` when a `put` moved the
    /// pointer, so the fleet applies it at once instead of a poll later.
    pub fn with_hints(mut self, client: async_nats::Client) -> Plane {
        self.hints = Some(client);
        self
    }

    /// Stores `document` (already accepted as `company`) and activates it
    /// through the pointer; a move is announced (`config_activated`).
    pub async fn put(&self, company: &Company, document: &str) -> Result<Activation, ConfigError> {
        let source = format!("PUT /config on node {}", self.node_id);
        match activate(&self.pointer, company, document, &source).await {
            Ok(a) => {
                if a.moved {
                    info!(subsystem = "configplane", epoch = a.epoch.get(), digest = %a.digest,
                        org = %company.org, "company revision activated");
                    announce(
                        &self.publisher,
                        "config_activated",
                        a.epoch,
                        &a.digest,
                        company,
                    )
                    .await;
                    self.hint(a.epoch).await;
                }
                Ok(a)
            }
            Err(e) => {
                warn!(subsystem = "configplane", error = %e, "PUT /config not done");
                Err(e)
            }
        }
    }

    /// Every node's reconciler polls at once; a hint lost costs one poll.
    async fn hint(&self, epoch: ConfigEpoch) {
        let Some(client) = &self.hints else { return };
        let sent = client
            .publish(
                crewlet_bus::CONFIG_ACTIVATED_SUBJECT,
                epoch.to_string().into(),
            )
            .await;
        if let Err(e) = sent {
            warn!(subsystem = "configplane", error = %e, epoch = epoch.get(),
                "could not tell the fleet the pointer moved; nodes apply it on their next poll");
        }
    }

    /// The active revision (epoch, digest, org, source, document), whether
    /// this node applied it, and every node's own word on what it applied
    /// (`fleet`; unreadable is `null` with `fleet_error`, never empty).
    /// `None` when no revision was ever activated.
    pub async fn active(&self) -> Result<Option<Value>, ConfigError> {
        let (digest, epoch) = match self.pointer.active_config().await? {
            Pointer::Set { revision, epoch } => (revision, epoch),
            Pointer::Unset => return Ok(None),
        };
        let f = fetch(&self.pointer, &digest, epoch).await?;
        let applied_epoch = self.active.applied_epoch();
        // The status bucket ages a departed node out.
        let (fleet, fleet_error) = match self.pointer.statuses().await {
            Ok(all) => (
                Some(
                    all.iter()
                        .map(|(node, s)| {
                            json!({
                                "node": node,
                                "applied_epoch": s["applied_epoch"],
                                "posture": s["posture"],
                                "error": s["error"],
                            })
                        })
                        .collect::<Vec<_>>(),
                ),
                None,
            ),
            Err(e) => (None, Some(e.to_string())),
        };
        Ok(Some(json!({
            "fleet": fleet,
            "fleet_error": fleet_error,
            "epoch": epoch,
            "digest": digest,
            "org": f.company.org,
            "source": f.source,
            "document": f.document,
            "applied": applied_epoch == Some(epoch),
            "applied_epoch": applied_epoch,
        })))
    }
}
