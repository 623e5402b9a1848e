//! The company's secrets as the node administers them: what `GET /secrets`
//! lists ([`listing`]; the routes are `crewlet-api`'s, the node's adapter
//! only translates), the one precedence rule ([`PRECEDENCE`]), and moving
//! what `crewlet secrets set --data-dir` sealed into a stopped node's store
//! onto the fleet at the next start ([`adopt_pending`], through the
//! [`PendingStore`] port the node implements over its SQLite store, so this
//! crate stays free of SQLite; the `crewlet secrets` CLI and its HTTP
//! client stay in the node).
//!
//! Rules: a value is never logged, never echoed and never listed — the API
//! answers names and update times only; a name follows the company
//! document's rule for secret names (400 otherwise); a value is UTF-8 text
//! of at most 64 KiB (413 above it). An unreachable bucket is 503 with
//! Retry-After and changes nothing.

use serde_json::json;
use tracing::{info, warn};

use crate::{Record, Secrets, SecretsError};

/// One secret sealed into a stopped node's store: its name and its sealed
/// record, as the secrets bucket will hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub name: String,
    pub record: String,
}

/// The node store's table of secrets set while the node was stopped.
pub trait PendingStore {
    /// The store's own error, logged with what could not be done.
    type Error: std::fmt::Display;
    /// Every pending secret.
    fn pending(&self) -> Result<Vec<Pending>, Self::Error>;
    /// Deletes `name`'s row if it still holds `record` (a newer set stays).
    fn delete(&self, name: &str, record: &str) -> Result<(), Self::Error>;
}

/// Moves the secrets set while this node was stopped onto the fleet's
/// bucket, then deletes them locally. A row the fleet already holds a newer
/// value for is dropped; one that cannot be moved now (bucket unreachable)
/// stays for the next start. Answers how many moved.
pub async fn adopt_pending(store: &impl PendingStore, secrets: &Secrets) -> usize {
    let rows = match store.pending() {
        Ok(rows) => rows,
        Err(e) => {
            warn!(subsystem = "secrets", error = %e, "cannot read the secrets set while this node was stopped");
            return 0;
        }
    };
    let mut moved = 0;
    for row in rows {
        let name = row.name.as_str();
        let record = match Record::from_bytes(name, row.record.as_bytes()) {
            Ok(r) => r,
            Err(e) => {
                warn!(subsystem = "secrets", secret = name, error = %e,
                    "a secret set while this node was stopped is unreadable and was dropped; set it again");
                let _ = store.delete(name, &row.record);
                continue;
            }
        };
        let newer = match secrets.record(name).await {
            Ok(Some((held, _))) => held.updated_ms > record.updated_ms,
            Ok(None) => false,
            Err(e) => {
                warn!(subsystem = "secrets", secret = name, error = %e,
                    "a secret set while this node was stopped stays local until the next start");
                continue;
            }
        };
        if newer {
            info!(
                subsystem = "secrets",
                secret = name,
                "the fleet holds a newer value than the one set while this node was stopped; keeping the fleet's"
            );
        } else if let Err(e) = secrets
            .put_record(name, &record, crewlet_coord::kv::Expect::Any)
            .await
        {
            warn!(subsystem = "secrets", secret = name, error = %e,
                "a secret set while this node was stopped stays local until the next start");
            continue;
        } else {
            info!(
                subsystem = "secrets",
                secret = name,
                "secret set while stopped moved onto the fleet"
            );
            moved += 1;
        }
        if let Err(e) = store.delete(name, &row.record) {
            warn!(subsystem = "secrets", secret = name, error = %e, "moved, but its local row could not be deleted");
        }
    }
    moved
}

/// The one precedence rule, as `GET /secrets` and `crewlet doctor` state it.
pub const PRECEDENCE: &str = "a name the fleet's secrets bucket holds answers from the bucket, even when this node's environment has it too; else from this node's environment variable of that name; else it is unset";

/// `GET /secrets`: the bucket's names (`source: bucket`, and whether this
/// node's environment has the name too, which the bucket overrides), then
/// every name `company` (the active one, if any) uses that the bucket
/// lacks, answered from this node's environment or unset. An error while
/// the bucket does not answer (503): then no name's source is known.
pub async fn listing(
    secrets: &Secrets,
    company: Option<&crewlet_company::Company>,
) -> Result<serde_json::Value, SecretsError> {
    let listed = secrets.list().await?;
    let in_env = |name: &str| std::env::var_os(name).is_some();
    let rows: Vec<serde_json::Value> = listed
        .iter()
        .map(|l| {
            let mut row = serde_json::to_value(l).unwrap_or_default();
            row["source"] = json!("bucket");
            row["environment_too"] = json!(in_env(&l.name));
            row
        })
        .collect();
    let outside: Vec<serde_json::Value> = company
        .map(secret_names)
        .unwrap_or_default()
        .into_iter()
        .filter(|name| !listed.iter().any(|l| &l.name == name))
        .map(|name| {
            let source = if in_env(&name) {
                "environment"
            } else {
                "unset"
            };
            json!({ "name": name, "source": source })
        })
        .collect();
    Ok(json!({ "secrets": rows, "outside_bucket": outside, "precedence": PRECEDENCE }))
}

/// Every secret the company names: integrations' signing secrets, model
/// credentials (the embedding model's too), seats' own credentials; each
/// once, sorted.
pub fn secret_names(company: &crewlet_company::Company) -> Vec<String> {
    let mut names = std::collections::BTreeSet::new();
    for i in company.integrations.values() {
        names.insert(i.secret.name_str().to_string());
    }
    for role in company.roles.values() {
        for m in role.executor.iter().chain(std::iter::once(&role.reviewer)) {
            names.extend(m.credentials.iter().map(|c| c.name_str().to_string()));
        }
    }
    if let Some(m) = &company.embedding {
        names.extend(m.credentials.iter().map(|c| c.name_str().to_string()));
    }
    for seat in company.seats.values() {
        names.extend(seat.credentials.values().map(|c| c.name_str().to_string()));
        names.extend(
            seat.signing_secrets
                .values()
                .map(|c| c.name_str().to_string()),
        );
    }
    names.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::mirror::tests::{Ring, kv};

    /// The node store's table as the port sees it: rows kept in order.
    #[derive(Default)]
    struct Rows(Mutex<Vec<Pending>>);

    impl Rows {
        fn with(rows: Vec<Pending>) -> Rows {
            Rows(Mutex::new(rows))
        }
        fn names(&self) -> Vec<String> {
            self.0
                .lock()
                .unwrap()
                .iter()
                .map(|r| r.name.clone())
                .collect()
        }
    }

    impl PendingStore for Rows {
        type Error = std::convert::Infallible;
        fn pending(&self) -> Result<Vec<Pending>, Self::Error> {
            Ok(self.0.lock().unwrap().clone())
        }
        fn delete(&self, name: &str, record: &str) -> Result<(), Self::Error> {
            self.0
                .lock()
                .unwrap()
                .retain(|r| !(r.name == name && r.record == record));
            Ok(())
        }
    }

    fn sealed(ring: &Ring, name: &str, value: &str, updated_ms: u64) -> Pending {
        let mut record = Record::seal(&ring.open(), name, value).unwrap();
        record.updated_ms = updated_ms;
        Pending {
            name: name.to_owned(),
            record: String::from_utf8_lossy(&record.to_bytes()).into_owned(),
        }
    }

    #[tokio::test]
    async fn a_secret_set_while_stopped_moves_unless_the_fleet_holds_a_newer_one() {
        let (_f, kv) = kv();
        let ring = Ring::new();
        let secrets = Secrets::start(kv, ring.open()).await;
        secrets.set("CREWLET_ADMIN_KEPT", "fleet's").await.unwrap();
        let rows = Rows::with(vec![
            sealed(&ring, "CREWLET_ADMIN_KEPT", "older", 1),
            sealed(&ring, "CREWLET_ADMIN_MOVED", "offline", 1),
            Pending {
                name: "CREWLET_ADMIN_TORN".into(),
                record: "not a record".into(),
            },
        ]);
        assert_eq!(adopt_pending(&rows, &secrets).await, 1);
        assert!(
            rows.names().is_empty(),
            "every row is settled: {:?}",
            rows.names()
        );
        let value = |name: &str| secrets.get(name).found();
        assert_eq!(value("CREWLET_ADMIN_MOVED").as_deref(), Some("offline"));
        assert_eq!(value("CREWLET_ADMIN_KEPT").as_deref(), Some("fleet's"));
        assert!(
            secrets
                .record("CREWLET_ADMIN_TORN")
                .await
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn a_secret_set_while_stopped_stays_local_while_the_bucket_cannot_answer() {
        let (faulty, kv) = kv();
        let ring = Ring::new();
        let secrets = Secrets::start(kv, ring.open()).await;
        let rows = Rows::with(vec![sealed(&ring, "CREWLET_ADMIN_LATER", "v", 1)]);
        faulty.break_store();
        assert_eq!(adopt_pending(&rows, &secrets).await, 0);
        assert_eq!(rows.names(), ["CREWLET_ADMIN_LATER"]);
        faulty.heal();
        assert_eq!(adopt_pending(&rows, &secrets).await, 1);
        assert!(rows.names().is_empty());
        assert_eq!(
            secrets.get("CREWLET_ADMIN_LATER").found().as_deref(),
            Some("v")
        );
    }

    #[tokio::test]
    async fn the_listing_names_the_bucket_and_never_a_value_and_is_unknown_while_it_is_down() {
        let (faulty, kv) = kv();
        let ring = Ring::new();
        let secrets = Secrets::start(kv, ring.open()).await;
        secrets
            .set("CREWLET_ADMIN_LISTED", "hidden-value")
            .await
            .unwrap();
        let answer = listing(&secrets, None).await.unwrap();
        let rows = answer["secrets"].as_array().unwrap();
        assert_eq!(rows.len(), 1, "{answer}");
        assert_eq!(rows[0]["name"], "CREWLET_ADMIN_LISTED");
        assert_eq!(rows[0]["source"], "bucket");
        assert_eq!(rows[0]["environment_too"], false);
        assert_eq!(answer["outside_bucket"], json!([]));
        assert_eq!(answer["precedence"], PRECEDENCE);
        assert!(!answer.to_string().contains("hidden-value"), "{answer}");
        faulty.break_store();
        assert!(listing(&secrets, None).await.is_err());
    }
}
