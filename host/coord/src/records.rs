//! The records built on the primitives (delivery claims and the completion
//! ledger are in [`crate::claims`]): the rate valve, credential cooldowns, the config activation
//! pointer, per-node status, seat pauses, and plain records for the other
//! shared slots. Each contract states its safe direction on unknown.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use crewlet_os::ConfigEpoch;
use futures::StreamExt;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::answer::{Answer, CoordError, Reply};
use crate::bucket::Bucket;
use crate::kv::{Change, Expect};
use crate::names::{check_class, decode_token, encode_token};
use crate::{Contention, Coord, decode, encode};

/// The rate valve's count in the current window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateVerdict {
    pub count: u64,
    pub limit: u64,
}

/// A benched credential: an instant, never a duration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cooldown {
    pub provider: String,
    pub hint: KeyHint,
    pub until: SystemTime,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct CooldownRecord {
    until_ms: u64,
}

/// 12 hex characters of SHA-256 of a credential: enough to tell keys apart
/// in a log, not reversible.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyHint(String);

impl KeyHint {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The hint for a credential.
pub fn key_hint(secret: &str) -> KeyHint {
    let d = Sha256::digest(secret.as_bytes());
    KeyHint(d.iter().take(6).map(|b| format!("{b:02x}")).collect())
}

/// The config activation pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pointer {
    /// Nobody has activated a revision yet.
    Unset,
    /// The active revision; `epoch` is the pointer's own revision.
    Set {
        revision: String,
        epoch: ConfigEpoch,
    },
}

/// An activation refused because the pointer was not where the caller thought.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PointerMoved {
    pub current: Pointer,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PointerRecord {
    revision: String,
}

/// The records of one class, watched: every record (id → record) as of the
/// certified listing, then each change — `(id, Some(record))` written,
/// `(id, None)` removed — from the same consumer, so none falls between.
pub struct ClassWatch<T> {
    pub initial: BTreeMap<String, T>,
    pub changes: BoxStream<'static, Result<(String, Option<T>), CoordError>>,
}

/// Paused seats: handle → pause record.
pub type SeatPauses = ClassWatch<serde_json::Value>;

const POINTER_KEY: &str = "active";
const SEAT_PAUSE: &str = "seat_pause";

pub(crate) fn ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn from_ms(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

pub(crate) fn class_key(class: &str, id: &str) -> Result<String, CoordError> {
    check_class(class)?;
    if id.is_empty() {
        return Err(CoordError::InvalidName {
            name: format!("{class}:"),
            why: "an empty segment addresses no key",
        });
    }
    Ok(format!("{class}.{}", encode_token(id)))
}

impl Coord {
    // ---- rate valve --------------------------------------------------------

    /// Counts one event for `scope` in the current fixed window of length
    /// `window`, fleet-wide; Yes while the count is within `limit`.
    ///
    /// Safe direction: fails closed — on unknown (or contention), refuse.
    /// A valve that opens when it cannot be read is not a valve.
    pub async fn admit(
        &self,
        scope: &str,
        limit: u64,
        window: Duration,
    ) -> Reply<RateVerdict, RateVerdict> {
        let b = Bucket::Rate;
        let kv = self.kv(b);
        let age = kv.age(b).unwrap_or(Duration::MAX);
        if window.is_zero() || window.saturating_mul(2) > age {
            return Err(CoordError::Invalid(format!(
                "a valve window of {window:?} must be above zero and at most half the rate bucket's age {age:?}, so a closed window ages out before its successor does"
            )));
        }
        let idx = ms(kv.now()) / window.as_millis().max(1) as u64;
        let key = format!("{}.{idx}", encode_token(scope));
        let mut tries = Contention::new();
        loop {
            if !tries.again().await {
                break;
            }
            let (count, expect) = match kv.get(b, &key).await? {
                Some(e) if !e.removed => (decode::<u64>(b, &e)?, e.revision),
                Some(e) => (0, e.revision),
                None => (0, 0),
            };
            if count >= limit {
                // Already full: refusing writes nothing.
                return Ok(Answer::No(RateVerdict { count, limit }));
            }
            if kv
                .put(b, &key, encode(&(count + 1)), Expect::Revision(expect))
                .await?
                .is_ok()
            {
                return Ok(Answer::Yes(RateVerdict {
                    count: count + 1,
                    limit,
                }));
            }
        }
        Err(CoordError::Contended {
            key,
            attempts: tries.made(),
        })
    }

    // ---- credential cooldowns ---------------------------------------------

    /// Publishes that a credential (`hint`) under provider entry `provider`
    /// is cooling until `until`. Extends a record, never shortens it.
    pub async fn bench(
        &self,
        provider: &str,
        hint: &KeyHint,
        until: SystemTime,
    ) -> Result<(), CoordError> {
        let b = Bucket::Cooldowns;
        let kv = self.kv(b);
        let key = format!("{}.{}", encode_token(provider), hint.0);
        let mut tries = Contention::new();
        loop {
            if !tries.again().await {
                break;
            }
            let (cur, expect) = match kv.get(b, &key).await? {
                Some(e) if !e.removed => (decode::<CooldownRecord>(b, &e)?.until_ms, e.revision),
                Some(e) => (0, e.revision),
                None => (0, 0),
            };
            if cur >= ms(until) {
                return Ok(());
            }
            let rec = CooldownRecord {
                until_ms: ms(until),
            };
            if kv
                .put(b, &key, encode(&rec), Expect::Revision(expect))
                .await?
                .is_ok()
            {
                return Ok(());
            }
        }
        Err(CoordError::Contended {
            key,
            attempts: tries.made(),
        })
    }

    /// Every cooldown still running. Safe direction: an unreadable store is
    /// a no-op for the caller's bench (see [`merge_cooldowns`]).
    pub async fn cooldowns(&self) -> Result<Vec<Cooldown>, CoordError> {
        let b = Bucket::Cooldowns;
        let kv = self.kv(b);
        let now = kv.now();
        let mut out = Vec::new();
        for e in kv.list(b, None).await? {
            let r: CooldownRecord = decode(b, &e)?;
            let Some((p, h)) = e.key.split_once('.') else {
                continue;
            };
            let (Some(provider), until) = (decode_token(p), from_ms(r.until_ms)) else {
                continue;
            };
            if until > now {
                out.push(Cooldown {
                    provider,
                    hint: KeyHint(h.to_owned()),
                    until,
                });
            }
        }
        Ok(out)
    }

    // ---- config activation pointer ----------------------------------------

    /// The active company revision; unset reads as [`Pointer::Unset`].
    pub async fn active_config(&self) -> Result<Pointer, CoordError> {
        let b = Bucket::Config;
        Ok(match self.kv(b).get(b, POINTER_KEY).await? {
            Some(e) if !e.removed => Pointer::Set {
                revision: decode::<PointerRecord>(b, &e)?.revision,
                epoch: ConfigEpoch(e.revision),
            },
            _ => Pointer::Unset,
        })
    }

    /// Activates `revision` by compare-and-swap on the pointer: `expected`
    /// is the epoch the caller saw (`None` for unset). Yes: the new epoch.
    /// Two operators activating at once get two revisions in order, never
    /// an overwrite.
    pub async fn activate(
        &self,
        revision: &str,
        expected: Option<ConfigEpoch>,
    ) -> Reply<ConfigEpoch, PointerMoved> {
        let b = Bucket::Config;
        let rec = PointerRecord {
            revision: revision.to_owned(),
        };
        let expect = Expect::Revision(expected.map_or(0, ConfigEpoch::get));
        match self.kv(b).put(b, POINTER_KEY, encode(&rec), expect).await? {
            Ok(epoch) => Ok(Answer::Yes(ConfigEpoch(epoch))),
            Err(_) => Ok(Answer::No(PointerMoved {
                current: self.active_config().await?,
            })),
        }
    }

    // ---- per-node status ---------------------------------------------------

    /// Publishes what this node applied (ages out with the status bucket).
    pub async fn publish_status(
        &self,
        node_id: &str,
        status: &serde_json::Value,
    ) -> Result<(), CoordError> {
        let b = Bucket::Status;
        self.kv(b)
            .put(b, &encode_token(node_id), encode(status), Expect::Any)
            .await?
            .map(|_| ())
            .map_err(|_| CoordError::Contended {
                key: node_id.to_owned(),
                attempts: 1,
            })
    }

    /// One node's status: Yes with it, No if it said nothing recently.
    pub async fn node_status(&self, node_id: &str) -> Reply<serde_json::Value, ()> {
        let b = Bucket::Status;
        Ok(match self.kv(b).get(b, &encode_token(node_id)).await? {
            Some(e) if !e.removed => Answer::Yes(decode(b, &e)?),
            _ => Answer::No(()),
        })
    }

    /// Every node's status (certified listing).
    pub async fn statuses(&self) -> Result<BTreeMap<String, serde_json::Value>, CoordError> {
        let b = Bucket::Status;
        let mut out = BTreeMap::new();
        for e in self.kv(b).list(b, None).await? {
            if let Some(id) = decode_token(&e.key) {
                out.insert(id, decode(b, &e)?);
            }
        }
        Ok(out)
    }

    // ---- seat pauses ---------------------------------------------------------

    /// Pauses a seat (a record in the ageless positions bucket).
    pub async fn pause_seat(
        &self,
        handle: &str,
        record: &serde_json::Value,
    ) -> Result<(), CoordError> {
        self.put_record(Bucket::Positions, SEAT_PAUSE, handle, record)
            .await
            .map(|_| ())
    }

    /// Resumes a seat. Yes if it was paused.
    pub async fn resume_seat(&self, handle: &str) -> Reply<(), ()> {
        self.remove_record(Bucket::Positions, SEAT_PAUSE, handle)
            .await
    }

    /// The one watch: seat pauses, starting with the certified listing.
    pub async fn watch_seat_pauses(&self) -> Result<SeatPauses, CoordError> {
        self.watch_class(Bucket::Positions, SEAT_PAUSE).await
    }

    /// The one watch on a class of records (keys `CLASS.ID`), starting
    /// with the certified listing; a record that does not decode is an
    /// error naming its key, never skipped.
    pub(crate) async fn watch_class<T>(
        &self,
        b: Bucket,
        class: &'static str,
    ) -> Result<ClassWatch<T>, CoordError>
    where
        T: serde::de::DeserializeOwned + Send + 'static,
    {
        let w = self.kv(b).watch(b, Some(class)).await?;
        let mut initial = BTreeMap::new();
        for e in &w.initial {
            if let Some(id) = record_id(class, &e.key) {
                initial.insert(id, decode(b, e)?);
            }
        }
        let changes = w
            .changes
            .filter_map(move |c| {
                futures::future::ready(match c {
                    Err(u) => Some(Err(CoordError::from(u))),
                    Ok(Change::Put(e)) => {
                        record_id(class, &e.key).map(|id| decode(b, &e).map(|v| (id, Some(v))))
                    }
                    Ok(Change::Removed { key, .. }) => {
                        record_id(class, &key).map(|id| Ok((id, None)))
                    }
                })
            })
            .boxed();
        Ok(ClassWatch { initial, changes })
    }

    // ---- plain records (fires, secrets, mailboxes, positions, ...) -----------

    /// Writes `class:id` in `bucket` (blind). Returns the revision.
    pub async fn put_record(
        &self,
        bucket: Bucket,
        class: &str,
        id: &str,
        value: &serde_json::Value,
    ) -> Result<u64, CoordError> {
        self.claims(bucket, class).put(id, value).await
    }

    /// Creates `class:id` only if it holds nothing live. Yes: the revision;
    /// No: the value already there.
    pub async fn create_record(
        &self,
        bucket: Bucket,
        class: &str,
        id: &str,
        value: &serde_json::Value,
    ) -> Reply<u64, serde_json::Value> {
        Ok(match self.claims(bucket, class).claim(id, value).await? {
            Answer::Yes(rev) => Answer::Yes(rev),
            Answer::No((there, _)) => Answer::No(there),
        })
    }

    /// Replaces `class:id` by compare-and-set: only while its latest
    /// revision is still `revision` (one a read answered). Yes: the new
    /// revision; No: the record moved since, or is gone. Safe direction: on
    /// unknown nothing is assumed written — read again before deciding.
    pub async fn replace_record(
        &self,
        bucket: Bucket,
        class: &str,
        id: &str,
        value: &serde_json::Value,
        revision: u64,
    ) -> Reply<u64, ()> {
        self.claims(bucket, class)
            .replace(id, value, revision)
            .await
    }

    /// Reads `class:id`: Yes with (value, revision), or No.
    pub async fn get_record(
        &self,
        bucket: Bucket,
        class: &str,
        id: &str,
    ) -> Reply<(serde_json::Value, u64), ()> {
        self.claims(bucket, class).get(id).await
    }

    /// Removes `class:id` (a marker, swept later). Yes if it was live.
    pub async fn remove_record(&self, bucket: Bucket, class: &str, id: &str) -> Reply<(), ()> {
        self.claims::<serde_json::Value>(bucket, class)
            .remove(id)
            .await
    }

    /// Every live record of one class (certified listing): id → value.
    pub async fn list_records(
        &self,
        bucket: Bucket,
        class: &str,
    ) -> Result<BTreeMap<String, serde_json::Value>, CoordError> {
        Ok(self
            .list_records_with_revisions(bucket, class)
            .await?
            .into_iter()
            .map(|(id, (value, _))| (id, value))
            .collect())
    }

    /// Every live record of one class (certified listing): id → (value,
    /// revision), the revision to [`Coord::replace_record`] it at.
    pub async fn list_records_with_revisions(
        &self,
        bucket: Bucket,
        class: &str,
    ) -> Result<BTreeMap<String, (serde_json::Value, u64)>, CoordError> {
        check_class(class)?;
        let mut out = BTreeMap::new();
        for e in self.kv(bucket).list(bucket, Some(class)).await? {
            if let Some(id) = e.key.split_once('.').and_then(|(_, id)| decode_token(id)) {
                out.insert(id, (decode(bucket, &e)?, e.revision));
            }
        }
        Ok(out)
    }
}

/// The id of a record of `class` from its key (`CLASS.ID`, the id
/// token-encoded).
fn record_id(class: &str, key: &str) -> Option<String> {
    key.strip_prefix(class)?
        .strip_prefix('.')
        .and_then(decode_token)
}

/// Merges a pull into a local bench: extends, never shortens; an
/// unreadable store (an `Err`) changes nothing. Returns the entries a peer
/// extended (for `credential_cooled_by_peer`).
pub fn merge_cooldowns(
    bench: &mut HashMap<(String, KeyHint), SystemTime>,
    pulled: &Result<Vec<Cooldown>, CoordError>,
) -> Vec<Cooldown> {
    let Ok(pulled) = pulled else {
        return Vec::new();
    };
    let mut extended = Vec::new();
    for c in pulled {
        let slot = bench
            .entry((c.provider.clone(), c.hint.clone()))
            .or_insert(SystemTime::UNIX_EPOCH);
        if c.until > *slot {
            *slot = c.until;
            extended.push(c.clone());
        }
    }
    extended
}
