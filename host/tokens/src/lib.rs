//! Operator tokens on this node (`crewlet-tokens`): the mirror the API
//! guard reads, the first-start admin token, what `GET`/`POST /tokens` and
//! `DELETE /tokens/{id}` do (the routes are `crewlet-api`'s), and the TTLs
//! `crewlet tokens create` takes.
//!
//! Rules, and why:
//! - **The fleet's tokens bucket is the source; this node holds a mirror**
//!   fed by a watch (certified listing first, then changes; a watch that
//!   fails is opened again and its fresh listing replaces the mirror), so a
//!   check costs a map lookup and a token revoked through any node is
//!   refused here as soon as the change arrives (well under a second on one
//!   NATS).
//! - **Fail closed.** Until the first listing lands, and whenever the
//!   watch is down, a token the mirror does not hold is *unknown* (503 with
//!   Retry-After), never accepted. A token it does hold keeps its last
//!   known standing while the store is cut off: the operator who is fixing
//!   the outage keeps their access, and a revocation made meanwhile takes
//!   effect when the watch's next listing lands.
//! - **Only SHA-256 of a value is stored.** A token is 32 bytes from the
//!   OS's CSPRNG: 2^256 guesses are out of reach whatever the hash costs,
//!   so a slow password hash (meant for low-entropy secrets) buys nothing
//!   and would cost every request.
//! - **First start**: with no live admin token in the fleet, the node
//!   creates one, prints a dashboard login URL once (the token in the URL
//!   fragment, which a browser never sends, so no server log sees it) and
//!   writes the value to `<data_dir>/operator.token` (0600). The CLI reads
//!   that file when it knows the data dir, so the node's own operator needs
//!   no copy-paste; anyone else passes `CREWLET_TOKEN`.
//!   `CREWLET_BOOTSTRAP_TOKEN` (Tier A: the node's environment) seeds that
//!   first token's value instead, for provisioning and tests.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use crewlet_coord::{Answer, TokenRecord, TokenRecords};
use futures::StreamExt;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tracing::{Instrument, info, warn};

/// The file the first-start admin token is written to, in the data dir.
pub const TOKEN_FILE: &str = "operator.token";
/// The environment variable the CLI reads a token from.
pub const TOKEN_ENV: &str = "CREWLET_TOKEN";
/// The environment variable that seeds the first-start admin token.
pub const BOOTSTRAP_ENV: &str = "CREWLET_BOOTSTRAP_TOKEN";
/// A seeded token's least length (a generated one is 47 characters).
const MIN_SEEDED: usize = 32;
/// Backoff between watch attempts: doubles from the first to the last.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(8));

fn now_ms() -> u64 {
    u64::try_from(crewlet_os::now_ms()).unwrap_or(0)
}

/// Lowercase hex SHA-256 of a token's value.
pub fn digest(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A fresh token value: `crw_` and 32 CSPRNG bytes as 43 base64url
/// characters — and a fresh id (8 bytes, hex).
fn fresh() -> Result<(String, String), TokensError> {
    let mut value = [0u8; 32];
    let mut id = [0u8; 8];
    getrandom::fill(&mut value).map_err(|e| TokensError::Random(e.to_string()))?;
    getrandom::fill(&mut id).map_err(|e| TokensError::Random(e.to_string()))?;
    Ok((
        id.iter().map(|b| format!("{b:02x}")).collect(),
        format!("crw_{}", URL_SAFE_NO_PAD.encode(value)),
    ))
}

/// Why a token operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    #[error("the OS random source failed ({0}); no token was made")]
    Random(String),
    #[error("the tokens bucket cannot be reached ({0}); nothing changed — retry in a few seconds")]
    Unavailable(String),
    #[error(
        "{BOOTSTRAP_ENV} holds {0} characters; a seeded token needs at least {MIN_SEEDED} visible ASCII characters without spaces"
    )]
    WeakSeed(usize),
    #[error("cannot write the first-start token to {path}: {source}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Default)]
struct Mirror {
    /// hash → (id, record)
    by_hash: HashMap<String, (String, TokenRecord)>,
    /// A certified listing has landed at least once.
    listed: bool,
    /// The watch is up now.
    watching: bool,
}

impl Mirror {
    fn replace(&mut self, all: impl IntoIterator<Item = (String, TokenRecord)>) {
        self.by_hash = all
            .into_iter()
            .map(|(id, r)| (r.hash.clone(), (id, r)))
            .collect();
        self.listed = true;
        self.watching = true;
    }

    fn apply(&mut self, id: String, rec: Option<TokenRecord>) {
        self.by_hash.retain(|_, (held, _)| *held != id);
        if let Some(r) = rec {
            self.by_hash.insert(r.hash.clone(), (id, r));
        }
    }
}

/// This node's operator tokens. Shared behind an `Arc`; the guard reads it
/// from the moment the HTTP surface binds.
#[derive(Default)]
pub struct Tokens {
    mirror: RwLock<Mirror>,
    coord: OnceLock<TokenRecords>,
}

/// What the mirror says of one presented token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// A live token: its id and its scope as stored (`read`, `write`,
    /// `admin`; the guard refuses a scope it does not know).
    Live {
        id: String,
        scope: String,
    },
    Expired,
    Revoked,
    /// No token with this value exists in the fleet.
    NotHeld,
    /// The mirror cannot say (why, for the 503's detail): fail closed.
    Unknown(String),
}

impl Tokens {
    /// Judges a presented token from memory (a map lookup per request).
    pub fn check(&self, token: &str) -> Standing {
        let m = self.mirror.read().unwrap_or_else(|p| p.into_inner());
        match m.by_hash.get(&digest(token)) {
            Some((id, r)) => {
                if r.revoked_ms.is_some() {
                    Standing::Revoked
                } else if !r.live_at(now_ms()) {
                    Standing::Expired
                } else {
                    Standing::Live {
                        id: id.clone(),
                        scope: r.scope.clone(),
                    }
                }
            }
            None if !m.listed => {
                Standing::Unknown("the fleet's tokens have not been read yet".into())
            }
            None if !m.watching => Standing::Unknown(
                "the tokens bucket is unreachable and this node has not seen that token".into(),
            ),
            None => Standing::NotHeld,
        }
    }

    /// The name the operator gave token `id` (what a chat post made with
    /// it is authored as); `None` for a token this node does not hold.
    pub fn name_of(&self, id: &str) -> Option<String> {
        let m = self.mirror.read().unwrap_or_else(|p| p.into_inner());
        m.by_hash
            .values()
            .find(|(held, _)| held == id)
            .map(|(_, r)| r.name.clone())
    }

    /// Starts mirroring the fleet's tokens on `coord` until `stop`; waits
    /// up to `first` for the first listing.
    pub async fn start(
        self: &Arc<Self>,
        coord: TokenRecords,
        stop: watch::Receiver<bool>,
        first: Duration,
    ) {
        let _ = self.coord.set(coord.clone());
        let (first_tx, mut first_rx) = watch::channel(false);
        tokio::spawn(
            mirror(self.clone(), coord, stop, first_tx)
                .instrument(tracing::info_span!("tokens", subsystem = "tokens")),
        );
        if tokio::time::timeout(first, first_rx.wait_for(|l| *l))
            .await
            .is_err()
        {
            warn!(
                subsystem = "tokens",
                "the tokens bucket did not answer at start; every guarded route answers 503 until it does"
            );
        }
    }

    /// Creates the first-start admin token when the fleet has no live
    /// admin token. Answers the value, and whether it was seeded, when this
    /// node made it.
    pub async fn bootstrap(&self, data_dir: &Path) -> Result<Option<(String, bool)>, TokensError> {
        let coord = self.coord()?;
        let now = now_ms();
        let all = coord
            .tokens()
            .await
            .map_err(|e| TokensError::Unavailable(e.to_string()))?;
        if all.values().any(|r| r.scope == "admin" && r.live_at(now)) {
            return Ok(None);
        }
        let (id, generated) = fresh()?;
        let (value, seeded) = match seed()? {
            Some(seed) => (seed, true),
            None => (generated, false),
        };
        let rec = TokenRecord {
            hash: digest(&value),
            scope: "admin".into(),
            name: "first start".into(),
            created_ms: now,
            expires_ms: None,
            revoked_ms: None,
        };
        // The file first: a token the fleet holds but nobody can read would
        // lock the operator out, while a file whose token never reached the
        // fleet is simply replaced at the next start.
        write_token_file(&data_dir.join(TOKEN_FILE), &value)?;
        self.create(&id, rec).await?;
        Ok(Some((value, seeded)))
    }

    fn coord(&self) -> Result<&TokenRecords, TokensError> {
        self.coord
            .get()
            .ok_or_else(|| TokensError::Unavailable("coordination is not open yet".into()))
    }

    async fn create(&self, id: &str, rec: TokenRecord) -> Result<(), TokensError> {
        match self.coord()?.create_token(id, &rec).await {
            Ok(Answer::Yes(_)) => {
                self.apply(id.to_owned(), Some(rec));
                Ok(())
            }
            Ok(Answer::No(_)) => Err(TokensError::Unavailable(format!(
                "token id {id} is taken; ask again for a fresh one"
            ))),
            Err(e) => Err(TokensError::Unavailable(e.to_string())),
        }
    }

    /// This node's own writes land in the mirror at once, so a token made
    /// here works in the next instant.
    fn apply(&self, id: String, rec: Option<TokenRecord>) {
        self.mirror
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .apply(id, rec);
    }
}

/// The first-start token's seed from [`BOOTSTRAP_ENV`], if one is set;
/// checked at start, before the disk is touched, so a weak seed exits 2.
pub fn seed() -> Result<Option<String>, TokensError> {
    match std::env::var(BOOTSTRAP_ENV) {
        Ok(seed) if !seed.is_empty() => {
            if seed.len() < MIN_SEEDED || !seed.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(TokensError::WeakSeed(seed.len()));
            }
            Ok(Some(seed))
        }
        _ => Ok(None),
    }
}

fn write_token_file(path: &Path, value: &str) -> Result<(), TokensError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let file_err = |source| TokensError::File {
        path: path.display().to_string(),
        source,
    };
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(file_err)?;
    f.write_all(format!("{value}\n").as_bytes())
        .map_err(file_err)
}

async fn mirror(
    tokens: Arc<Tokens>,
    coord: TokenRecords,
    mut stop: watch::Receiver<bool>,
    first: watch::Sender<bool>,
) {
    let mut backoff = BACKOFF.0;
    loop {
        let opened = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            w = coord.watch_tokens() => w,
        };
        match opened {
            Ok(mut w) => {
                backoff = BACKOFF.0;
                let n = w.initial.len();
                tokens
                    .mirror
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .replace(std::mem::take(&mut w.initial));
                let _ = first.send(true);
                info!(subsystem = "tokens", tokens = n, "token mirror listed");
                loop {
                    let next = tokio::select! {
                        _ = stop.wait_for(|s| *s) => return,
                        n = w.changes.next() => n,
                    };
                    match next {
                        Some(Ok((id, rec))) => tokens.apply(id, rec),
                        Some(Err(e)) => {
                            warn!(subsystem = "tokens", error = %e, "token watch failed; reopening");
                            break;
                        }
                        None => {
                            warn!(subsystem = "tokens", "token watch ended; reopening");
                            break;
                        }
                    }
                }
            }
            Err(e) => warn!(subsystem = "tokens", error = %e, ?backoff, "token watch not opened"),
        }
        tokens
            .mirror
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .watching = false;
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(BACKOFF.1);
    }
}

// ---- what the operator's requests do --------------------------------------

/// A token as listed: never its value, never its hash.
pub fn shown(id: &str, r: &TokenRecord) -> serde_json::Value {
    json!({
        "id": id,
        "name": r.name,
        "scope": r.scope,
        "created_ms": r.created_ms,
        "expires_ms": r.expires_ms,
        "revoked_ms": r.revoked_ms,
    })
}

impl Tokens {
    /// Every token in the fleet, as [`shown`].
    pub async fn list(&self) -> Result<Vec<serde_json::Value>, TokensError> {
        let all = self
            .coord()?
            .tokens()
            .await
            .map_err(|e| TokensError::Unavailable(e.to_string()))?;
        Ok(all.iter().map(|(id, r)| shown(id, r)).collect())
    }

    /// Makes a token of `scope` (already checked by the caller), live for
    /// `ttl_seconds` if given; answers it [`shown`], with its value under
    /// `token` — the only time the value is ever told.
    pub async fn issue(
        &self,
        scope: &str,
        name: String,
        ttl_seconds: Option<u64>,
    ) -> Result<serde_json::Value, TokensError> {
        let (id, value) = fresh()?;
        let now = now_ms();
        let rec = TokenRecord {
            hash: digest(&value),
            scope: scope.into(),
            name,
            created_ms: now,
            expires_ms: ttl_seconds.map(|s| now.saturating_add(s.saturating_mul(1000))),
            revoked_ms: None,
        };
        self.create(&id, rec.clone()).await?;
        info!(subsystem = "tokens", token = %id, scope, "operator token created");
        let mut out = shown(&id, &rec);
        out["token"] = json!(value);
        Ok(out)
    }

    /// Revokes token `id`; answers it [`shown`], or `None` when no token
    /// has that id.
    pub async fn revoke(&self, id: &str) -> Result<Option<serde_json::Value>, TokensError> {
        match self.coord()?.revoke_token(id, now_ms()).await {
            Ok(Answer::Yes(rec)) => {
                info!(subsystem = "tokens", token = %id, "operator token revoked");
                self.apply(id.to_owned(), Some(rec.clone()));
                Ok(Some(shown(id, &rec)))
            }
            Ok(Answer::No(())) => Ok(None),
            Err(e) => Err(TokensError::Unavailable(e.to_string())),
        }
    }
}

// ---- the command line ----------------------------------------------------

/// A TTL the CLI cannot read; the text says what it takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--ttl {0:?}: expected a positive count with s, m, h or d (e.g. 30d)")]
pub struct BadTtl(pub String);

/// Parses a TTL: `90s`, `15m`, `12h`, `30d`, or plain seconds.
pub fn parse_ttl(s: &str) -> Result<u64, BadTtl> {
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => 0,
    };
    match num.parse::<u64>() {
        Ok(n) if n > 0 && mult > 0 => Ok(n.saturating_mul(mult)),
        _ => Err(BadTtl(s.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_tokens_are_long_random_and_hash_to_hex() {
        let (id, a) = fresh().unwrap();
        let (_, b) = fresh().unwrap();
        assert_ne!(a, b);
        assert_eq!(id.len(), 16);
        assert_eq!(a.len(), 4 + 43, "{a}");
        assert!(
            a[4..]
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        );
        assert_eq!(
            digest("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn the_mirror_is_unknown_until_listed_and_after_the_watch_drops() {
        let t = Tokens::default();
        assert!(matches!(t.check("x"), Standing::Unknown(_)));
        let rec = |scope: &str, revoked| TokenRecord {
            hash: digest(scope),
            scope: scope.into(),
            name: String::new(),
            created_ms: 0,
            expires_ms: None,
            revoked_ms: revoked,
        };
        t.mirror.write().unwrap().replace([
            ("a".to_owned(), rec("write", None)),
            ("b".to_owned(), rec("admin", Some(1))),
        ]);
        assert_eq!(
            t.check("write"),
            Standing::Live {
                id: "a".into(),
                scope: "write".into()
            }
        );
        assert_eq!(t.check("admin"), Standing::Revoked);
        assert_eq!(t.check("other"), Standing::NotHeld);
        t.mirror.write().unwrap().watching = false;
        assert!(
            matches!(t.check("other"), Standing::Unknown(_)),
            "fail closed"
        );
        assert!(
            matches!(t.check("write"), Standing::Live { .. }),
            "a known token keeps its standing while cut off"
        );
    }

    #[test]
    fn ttls_parse_with_units_and_refuse_nonsense() {
        assert_eq!(parse_ttl("90"), Ok(90));
        assert_eq!(parse_ttl("15m"), Ok(900));
        assert_eq!(parse_ttl("30d"), Ok(30 * 86_400));
        for bad in ["", "0", "5w", "h", "-1d"] {
            assert!(parse_ttl(bad).is_err(), "{bad}");
        }
    }
}
