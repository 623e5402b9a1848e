//! `crewlet secrets rotate-key`: a new key seals, every value is re-sealed
//! under it, and an old key leaves the keyring only once no envelope in the
//! bucket names it.
//!
//! The keyring file is read again first (the operator may have copied a
//! newer one in), the new key is written to it before anything is re-sealed
//! (so a crash part-way leaves values that still open), and a value this
//! node cannot open is left as it is and keeps its key in the ring.

use std::collections::{BTreeMap, BTreeSet};

use crewlet_coord::Bucket;
use crewlet_coord::kv::Expect;
use serde::Serialize;
use tracing::{info, warn};

use crate::keyring::Keyring;
use crate::mirror::{Record, SECRET_CLASS, Secrets, SecretsError};

/// What a rotation did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rotation {
    /// The key that seals from now on.
    pub key: String,
    /// Secrets re-sealed under it.
    pub resealed: Vec<String>,
    /// Keys dropped from the keyring: nothing names them any more.
    pub retired: Vec<String>,
    /// Keys kept, with the secrets still sealed under them (not openable
    /// here, or changed by another node while this one re-sealed).
    pub kept: BTreeMap<String, Vec<String>>,
}

impl Secrets {
    /// Rotates the keyring and re-seals every value (see the module docs).
    pub async fn rotate_key(&self) -> Result<Rotation, SecretsError> {
        let ring = self
            .keyring
            .as_ref()
            .ok_or_else(|| SecretsError::NoKeyring("the secrets bucket".into()))?;
        let kv = self.kv()?.clone();
        let path = ring
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .path()
            .to_owned();
        let mut fresh = Keyring::open(&path)?;
        let key = fresh.add_key()?;
        *ring.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        info!(subsystem = "secrets", key = %key, "keyring rotated; re-sealing every secret");

        let unavailable = |u: crewlet_coord::kv::Unavailable| SecretsError::Unavailable(u.0);
        let entries = kv
            .list(Bucket::Secrets, Some(SECRET_CLASS))
            .await
            .map_err(unavailable)?;
        let mut resealed = Vec::new();
        for e in entries.iter().filter(|e| !e.removed) {
            let Some(name) = crate::mirror::name_of(&e.key) else {
                continue;
            };
            let Ok(old) = Record::from_bytes(&name, &e.value) else {
                continue;
            };
            if old.envelope.key == key {
                continue;
            }
            let sealed = {
                let ring = ring.read().unwrap_or_else(|p| p.into_inner());
                match ring.open_envelope(&name, &old.envelope) {
                    Ok(value) => Record {
                        envelope: ring.seal(&name, &value),
                        updated_ms: old.updated_ms,
                    },
                    Err(why) => {
                        warn!(subsystem = "secrets", error = %why, "secret not re-sealed");
                        continue;
                    }
                }
            };
            match self
                .put_record(&name, &sealed, Expect::Revision(e.revision))
                .await
            {
                Ok(_) => resealed.push(name),
                // Set again meanwhile: the new value was sealed by whichever
                // key that node holds, which the second listing accounts for.
                Err(SecretsError::Unavailable(why)) if why.contains("changed while") => {}
                Err(other) => return Err(other),
            }
        }

        let mut kept: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for e in kv
            .list(Bucket::Secrets, Some(SECRET_CLASS))
            .await
            .map_err(unavailable)?
            .iter()
            .filter(|e| !e.removed)
        {
            let Some(name) = crate::mirror::name_of(&e.key) else {
                continue;
            };
            if let Ok(r) = Record::from_bytes(&name, &e.value)
                && r.envelope.key != key
            {
                kept.entry(r.envelope.key).or_default().push(name);
            }
        }
        let in_use: BTreeSet<String> = kept.keys().cloned().collect();
        let retired = ring
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retire_unused(&in_use)?;
        info!(subsystem = "secrets", key = %key, resealed = resealed.len(),
            retired = ?retired, kept = ?kept.keys().collect::<Vec<_>>(), "re-sealing done");
        Ok(Rotation {
            key,
            resealed,
            retired,
            kept,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::Lookup;
    use crate::mirror::tests::{Ring, kv};

    use super::*;

    #[tokio::test]
    async fn rotation_reseals_every_value_under_the_new_key_and_retires_the_old() {
        let (_f, kv) = kv();
        let fleet = Ring::new();
        let s = Secrets::start(kv.clone(), fleet.open()).await;
        s.set("ONE", "first-value").await.unwrap();
        s.set("TWO", "second-value").await.unwrap();
        let old = s.record("ONE").await.unwrap().unwrap().0.envelope.key;

        let done = s.rotate_key().await.unwrap();
        assert_ne!(done.key, old);
        assert_eq!(done.resealed, ["ONE", "TWO"]);
        assert_eq!(done.retired, vec![old]);
        assert!(done.kept.is_empty(), "{done:?}");
        for (name, value) in [("ONE", "first-value"), ("TWO", "second-value")] {
            let (rec, _) = s.record(name).await.unwrap().unwrap();
            assert_eq!(rec.envelope.key, done.key);
            assert_eq!(s.get(name).found().as_deref(), Some(value));
        }
        // The file on disk holds the new key alone: a node opening it later
        // opens every value.
        let later = Secrets::start(kv.clone(), fleet.open()).await;
        assert_eq!(fleet.open().ids(), vec![done.key.clone()]);
        assert_eq!(later.get("TWO").found().as_deref(), Some("second-value"));
        later.stop().await;
        s.stop().await;
    }

    #[tokio::test]
    async fn a_value_this_node_cannot_open_keeps_its_key_in_the_ring() {
        let (_f, kv) = kv();
        let other = Ring::new();
        let elsewhere = Secrets::start(kv.clone(), other.open()).await;
        elsewhere.set("FOREIGN", "foreign-value").await.unwrap();
        let foreign_key = elsewhere
            .record("FOREIGN")
            .await
            .unwrap()
            .unwrap()
            .0
            .envelope
            .key;
        let mine = Ring::new();
        let s = Secrets::start(kv.clone(), mine.open()).await;
        s.set("LOCAL", "local-value").await.unwrap();
        let done = s.rotate_key().await.unwrap();
        assert_eq!(done.resealed, ["LOCAL"]);
        assert_eq!(
            done.kept.get(&foreign_key).map(Vec::as_slice),
            Some(&["FOREIGN".to_owned()][..])
        );
        assert!(matches!(s.get("FOREIGN"), Lookup::Unavailable(_)));
        assert_eq!(
            elsewhere.get("FOREIGN").found().as_deref(),
            Some("foreign-value"),
            "left as it was"
        );
        s.stop().await;
        elsewhere.stop().await;
    }
}
