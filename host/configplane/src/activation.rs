//! The activation protocol: a document becomes active only by a
//! compare-and-set on the fleet's config pointer, whose revision is the
//! epoch (the rules are in the crate's docs).

use crewlet_company::Company;
use crewlet_coord::{Answer, ConfigPointer, CoordError, Pointer};
use crewlet_os::ConfigEpoch;
use serde_json::json;
use tracing::warn;

/// Record class of a stored revision in the config bucket.
const REVISION_CLASS: &str = "company_revision";
/// Compare-and-set rounds before an activation gives up as contended.
const ACTIVATE_ATTEMPTS: u32 = 8;

/// Why the config plane could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "the config pointer cannot be read or moved right now ({0}); nothing changed — retry in a few seconds"
    )]
    Unavailable(CoordError),
    #[error("coordination refused the request: {0}")]
    Coord(CoordError),
    #[error(
        "the pointer names revision {digest} (epoch {epoch}) but the config bucket holds no document for it; PUT /config the document again to activate it"
    )]
    Missing { digest: String, epoch: ConfigEpoch },
    #[error(
        "the stored revision {digest} has no readable document ({why}); PUT /config the document again"
    )]
    Malformed { digest: String, why: &'static str },
    #[error(
        "revision {digest} (epoch {epoch}) is refused by this build: {source}; upgrade this node or activate a document it accepts"
    )]
    Invalid {
        digest: String,
        epoch: ConfigEpoch,
        #[source]
        source: crewlet_company::Invalid,
    },
    #[error(
        "the pointer moved on every one of {0} attempts to activate; another operator is activating at the same time — retry"
    )]
    Contended(u32),
}

impl From<CoordError> for ConfigError {
    fn from(e: CoordError) -> ConfigError {
        if e.is_unavailable() {
            ConfigError::Unavailable(e)
        } else {
            ConfigError::Coord(e)
        }
    }
}

/// A revision activated through the pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Activation {
    pub epoch: ConfigEpoch,
    pub digest: String,
    /// False when the pointer already named this document.
    pub moved: bool,
}

/// Stores `document` in the config bucket and activates it by
/// compare-and-set on the pointer. A pointer that moves under us is re-read
/// and tried again: the caller asked for this document to be active, and a
/// concurrent activation is ordered before it, never overwritten.
pub async fn activate(
    pointer: &ConfigPointer,
    company: &Company,
    document: &str,
    source: &str,
) -> Result<Activation, ConfigError> {
    let digest = company.digest.clone();
    let record = json!({
        "digest": digest,
        "document": document,
        "source": source,
        "stored_ms": crewlet_os::now_ms(),
    });
    pointer.put_record(REVISION_CLASS, &digest, &record).await?;
    for _ in 0..ACTIVATE_ATTEMPTS {
        let expected = match pointer.active_config().await? {
            Pointer::Set { revision, epoch } if revision == digest => {
                return Ok(Activation {
                    epoch,
                    digest,
                    moved: false,
                });
            }
            Pointer::Set { epoch, .. } => Some(epoch),
            Pointer::Unset => None,
        };
        match pointer.activate(&digest, expected).await? {
            Answer::Yes(epoch) => {
                return Ok(Activation {
                    epoch,
                    digest,
                    moved: true,
                });
            }
            Answer::No(_moved) => continue,
        }
    }
    Err(ConfigError::Contended(ACTIVATE_ATTEMPTS))
}

/// A stored revision, read back from the config bucket and validated.
pub(crate) struct Fetched {
    pub document: String,
    pub company: Company,
    pub source: Option<String>,
}

pub(crate) async fn fetch(
    pointer: &ConfigPointer,
    digest: &str,
    epoch: ConfigEpoch,
) -> Result<Fetched, ConfigError> {
    let (value, _) = match pointer.get_record(REVISION_CLASS, digest).await? {
        Answer::Yes(found) => found,
        Answer::No(()) => {
            return Err(ConfigError::Missing {
                digest: digest.to_owned(),
                epoch,
            });
        }
    };
    let malformed = |why| ConfigError::Malformed {
        digest: digest.to_owned(),
        why,
    };
    let document = value["document"]
        .as_str()
        .ok_or_else(|| malformed("no `document` string"))?
        .to_owned();
    let company = Company::parse(&document).map_err(|source| ConfigError::Invalid {
        digest: digest.to_owned(),
        epoch,
        source,
    })?;
    if company.digest != digest {
        return Err(malformed("its document does not hash to its digest"));
    }
    Ok(Fetched {
        document,
        company,
        source: value["source"].as_str().map(str::to_owned),
    })
}

/// Publishes a config event; a failure is logged, never fatal.
pub(crate) async fn announce(
    publisher: &crewlet_observe::Publisher,
    kind: &str,
    epoch: ConfigEpoch,
    digest: &str,
    company: &Company,
) {
    let event = publisher.event(
        kind,
        json!({
            "epoch": epoch,
            "digest": digest,
            "org": company.org,
            "seats": company.seats.len(),
        }),
    );
    if let Err(e) = publisher.publish(event).await {
        warn!(subsystem = "configplane", error = %e, event = kind, "could not publish a config event");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crewlet_coord::bucket::Retentions;
    use crewlet_coord::{Coord, CoordOptions, Faulty, Kv, MemoryKv, Owner, SystemClock};

    use super::*;

    const EXAMPLE: &str = include_str!("../../../examples/company.toml");

    fn doc(org: &str) -> (String, Company) {
        let text = EXAMPLE.replace("name = \"Acme Robotics\"", &format!("name = \"{org}\""));
        let company = Company::parse(&text).unwrap();
        (text, company)
    }

    fn coord() -> (Arc<Faulty>, Coord) {
        let ret = Retentions {
            lease_ttl: Duration::from_secs(45),
            status: Duration::from_secs(60),
            rate: Duration::from_secs(60),
        };
        let kv: Arc<dyn Kv> = Arc::new(MemoryKv::new(Arc::new(SystemClock), &ret));
        let faulty = Faulty::new(kv);
        let as_kv: Arc<dyn Kv> = faulty.clone();
        let opts = CoordOptions::new(Owner::incarnation("test"));
        (faulty, Coord::with_backends(as_kv.clone(), as_kv, opts))
    }

    #[tokio::test]
    async fn activations_are_ordered_and_a_repeat_moves_nothing() {
        let (_f, c) = coord();
        let (a_text, a) = doc("A");
        let (b_text, b) = doc("B");
        let first = activate(&c.config_pointer(), &a, &a_text, "t")
            .await
            .unwrap();
        assert!(first.moved);
        let second = activate(&c.config_pointer(), &b, &b_text, "t")
            .await
            .unwrap();
        assert!(second.moved && second.epoch > first.epoch, "{second:?}");
        let repeat = activate(&c.config_pointer(), &b, &b_text, "t")
            .await
            .unwrap();
        assert_eq!((repeat.epoch, repeat.moved), (second.epoch, false));
        assert_eq!(
            c.active_config().await.unwrap(),
            Pointer::Set {
                revision: b.digest.clone(),
                epoch: second.epoch
            }
        );
        // What the pointer names is readable back, validated.
        let f = fetch(&c.config_pointer(), &b.digest, second.epoch)
            .await
            .unwrap();
        assert_eq!(f.document, b_text);
        assert_eq!(f.company.org, "B");
    }

    #[tokio::test]
    async fn a_revision_without_its_document_is_missing_not_empty() {
        let (_f, c) = coord();
        let err = fetch(&c.config_pointer(), "0".repeat(64).as_str(), ConfigEpoch(3))
            .await
            .err()
            .unwrap();
        assert!(
            matches!(
                err,
                ConfigError::Missing {
                    epoch: ConfigEpoch(3),
                    ..
                }
            ),
            "{err}"
        );
    }

    #[tokio::test]
    async fn an_unreachable_store_is_unavailable_and_moves_nothing() {
        let (f, c) = coord();
        let (a_text, a) = doc("A");
        let first = activate(&c.config_pointer(), &a, &a_text, "t")
            .await
            .unwrap();
        f.break_store();
        let (b_text, b) = doc("B");
        let err = activate(&c.config_pointer(), &b, &b_text, "t")
            .await
            .err()
            .unwrap();
        assert!(matches!(err, ConfigError::Unavailable(_)), "{err}");
        let err = fetch(&c.config_pointer(), &a.digest, first.epoch)
            .await
            .err()
            .unwrap();
        assert!(matches!(err, ConfigError::Unavailable(_)), "{err}");
        f.heal();
        assert_eq!(
            c.active_config().await.unwrap(),
            Pointer::Set {
                revision: a.digest,
                epoch: first.epoch
            }
        );
    }
}
