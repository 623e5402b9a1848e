//! The credential pool: which key a call uses, and which keys are cooling.
//!
//! Rules, and why:
//! - A key is leased, never handed out: the lease counts the call in flight
//!   and gives it back when dropped, so a cancelled call cannot leak a count.
//! - The key with the fewest calls in flight wins; ties go to the order the
//!   company document lists them, so a quiet pool always starts on the first.
//! - A benched key is not leased until its cooldown ends. Cooldowns are
//!   instants, scoped by provider entry and keyed by the key's hint, so the
//!   same record means the same thing on every node (Architecture: credential
//!   cooldowns). A pull from the fleet extends a local bench, never shortens
//!   it.
//! - Secrets are values resolved by the caller. One that does not resolve is
//!   skipped with a reason, and the rest of the pool still serves. One not
//!   known yet (the secrets store has not answered) is marked `unknown`: a
//!   model left with no usable key while one is unknown is not "no key".

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use crewlet_company::SecretRef;
use crewlet_coord::{Cooldown, CoordError, KeyHint, key_hint, merge_cooldowns};

use crewlet_secrets::Lookup;
/// Looks a secret up by its reference name (`OPENAI_API_KEY`): the node's
/// one secrets resolver.
pub use crewlet_secrets::Resolver as Resolve;

/// The scope of a cooldown: a provider entry — the plugin, its base URL and
/// the model (`openai:gpt-4o@https://api.openai.com/v1`). One key under a
/// fast entry and a smart entry is two rate-limit buckets at the vendor, so
/// one model's burst must not bench the key for the other.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProviderKey(String);

impl ProviderKey {
    pub fn new(plugin: &str, model: &str, base_url: &str) -> ProviderKey {
        ProviderKey(format!("{plugin}:{model}@{base_url}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ProviderKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A secret value. Its `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Secret {
        Secret(value)
    }

    /// The value, for the one place that sends it: the plugin call.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

/// One resolved credential of a model entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// The reference it came from (`OPENAI_API_KEY`), or `(none)` for a
    /// keyless entry.
    pub name: String,
    pub secret: Secret,
    pub hint: KeyHint,
}

impl Credential {
    pub fn new(name: &str, secret: String) -> Credential {
        Credential {
            name: name.to_owned(),
            hint: key_hint(&secret),
            secret: Secret(secret),
        }
    }

    /// The single credential of an entry that lists none (a local server, the
    /// scripted provider): an empty key, still benchable by its hint.
    pub fn keyless() -> Credential {
        Credential::new("(none)", String::new())
    }

    pub fn is_keyless(&self) -> bool {
        self.secret.0.is_empty()
    }
}

/// A credential reference that could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unresolved {
    pub name: String,
    pub reason: String,
    /// Not known yet, rather than unset or unopenable.
    pub unknown: bool,
}

/// Resolves an entry's credential references. An entry with none yields the
/// keyless credential.
pub fn resolve_all(refs: &[SecretRef], resolve: &Resolve) -> (Vec<Credential>, Vec<Unresolved>) {
    if refs.is_empty() {
        return (vec![Credential::keyless()], Vec::new());
    }
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for r in refs {
        let name = r.name_str();
        match resolve.lookup(name) {
            Lookup::Found(v) if !v.is_empty() => found.push(Credential::new(name, v)),
            Lookup::Found(_) => missing.push(Unresolved {
                name: name.to_owned(),
                reason: format!("secret {name} is empty; set it to the provider's API key"),
                unknown: false,
            }),
            Lookup::Unset => missing.push(Unresolved {
                name: name.to_owned(),
                reason: format!("secret {name} is not set; set it to the provider's API key"),
                unknown: false,
            }),
            Lookup::Unavailable(why) => missing.push(Unresolved {
                name: name.to_owned(),
                reason: why,
                unknown: false,
            }),
            Lookup::Unknown(why) => missing.push(Unresolved {
                name: name.to_owned(),
                reason: why,
                unknown: true,
            }),
        }
    }
    (found, missing)
}

type Slot = (String, KeyHint);

#[derive(Default)]
struct PoolState {
    in_flight: HashMap<Slot, usize>,
    bench: HashMap<Slot, SystemTime>,
}

/// Leases keys and keeps the local view of cooldowns. Cheap to clone.
#[derive(Clone, Default)]
pub struct CredentialPool {
    state: Arc<Mutex<PoolState>>,
}

/// A key leased for one call; dropping it ends the call's count.
pub struct PoolLease {
    state: Arc<Mutex<PoolState>>,
    slot: Slot,
    credential: Credential,
}

impl PoolLease {
    pub fn credential(&self) -> &Credential {
        &self.credential
    }
}

impl fmt::Debug for PoolLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolLease")
            .field("provider", &self.slot.0)
            .field("hint", &self.credential.hint)
            .finish()
    }
}

impl Drop for PoolLease {
    fn drop(&mut self) {
        let mut state = lock(&self.state);
        if let Some(n) = state.in_flight.get_mut(&self.slot) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                state.in_flight.remove(&self.slot);
            }
        }
    }
}

fn lock(state: &Mutex<PoolState>) -> MutexGuard<'_, PoolState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl CredentialPool {
    pub fn new() -> CredentialPool {
        CredentialPool::default()
    }

    /// The candidate with the fewest calls in flight among those not cooling
    /// at `now` (ties: the order given); `None` when every one is cooling.
    pub fn lease_at(
        &self,
        provider: &ProviderKey,
        candidates: &[Credential],
        now: SystemTime,
    ) -> Option<PoolLease> {
        let mut state = lock(&self.state);
        let mut best: Option<(usize, &Credential)> = None;
        for c in candidates {
            let slot = (provider.0.clone(), c.hint.clone());
            if state.bench.get(&slot).is_some_and(|until| *until > now) {
                continue;
            }
            let n = state.in_flight.get(&slot).copied().unwrap_or(0);
            if best.is_none_or(|(m, _)| n < m) {
                best = Some((n, c));
            }
        }
        let (_, chosen) = best?;
        let slot = (provider.0.clone(), chosen.hint.clone());
        *state.in_flight.entry(slot.clone()).or_default() += 1;
        Some(PoolLease {
            state: self.state.clone(),
            slot,
            credential: chosen.clone(),
        })
    }

    /// [`CredentialPool::lease_at`] now.
    pub fn lease(&self, provider: &ProviderKey, candidates: &[Credential]) -> Option<PoolLease> {
        self.lease_at(provider, candidates, SystemTime::now())
    }

    /// Calls in flight on a key.
    pub fn in_flight(&self, provider: &ProviderKey, hint: &KeyHint) -> usize {
        lock(&self.state)
            .in_flight
            .get(&(provider.0.clone(), hint.clone()))
            .copied()
            .unwrap_or(0)
    }

    /// Benches a key locally until `until` (never shortens); answers the
    /// instant now in force.
    pub fn bench(&self, provider: &ProviderKey, hint: &KeyHint, until: SystemTime) -> SystemTime {
        let mut state = lock(&self.state);
        let slot = state
            .bench
            .entry((provider.0.clone(), hint.clone()))
            .or_insert(SystemTime::UNIX_EPOCH);
        if until > *slot {
            *slot = until;
        }
        *slot
    }

    /// When the key stops cooling, if it is cooling at `now`.
    pub fn cooling_until(
        &self,
        provider: &ProviderKey,
        hint: &KeyHint,
        now: SystemTime,
    ) -> Option<SystemTime> {
        lock(&self.state)
            .bench
            .get(&(provider.0.clone(), hint.clone()))
            .copied()
            .filter(|u| *u > now)
    }

    /// Merges a pull from the fleet (extends, never shortens; an error
    /// changes nothing). Answers the entries a peer extended. Entries that
    /// already ended are dropped.
    pub fn merge(&self, pulled: &Result<Vec<Cooldown>, CoordError>) -> Vec<Cooldown> {
        let mut state = lock(&self.state);
        let now = SystemTime::now();
        state.bench.retain(|_, until| *until > now);
        merge_cooldowns(&mut state.bench, pulled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn creds() -> Vec<Credential> {
        vec![
            Credential::new("A", "sk-aaaa".into()),
            Credential::new("B", "sk-bbbb".into()),
            Credential::new("C", "sk-cccc".into()),
        ]
    }

    #[test]
    fn fewest_in_flight_wins_ties_go_to_document_order_and_drop_gives_back() {
        let pool = CredentialPool::new();
        let p = ProviderKey::new("openai", "gpt-4o", "https://api.openai.com/v1");
        let c = creds();
        let a = pool.lease(&p, &c).unwrap();
        assert_eq!(a.credential().name, "A");
        let b = pool.lease(&p, &c).unwrap();
        assert_eq!(b.credential().name, "B");
        let c1 = pool.lease(&p, &c).unwrap();
        assert_eq!(c1.credential().name, "C");
        let a2 = pool.lease(&p, &c).unwrap();
        assert_eq!(a2.credential().name, "A", "all at one: first in order");
        assert_eq!(pool.in_flight(&p, &c[0].hint), 2);
        drop(b);
        assert_eq!(pool.lease(&p, &c).unwrap().credential().name, "B");
        drop((a, a2, c1));
        assert_eq!(pool.in_flight(&p, &c[0].hint), 0);
    }

    #[test]
    fn a_benched_key_is_skipped_until_its_instant_and_only_under_its_entry() {
        let pool = CredentialPool::new();
        let fast = ProviderKey::new("openai", "gpt-4o-mini", "https://api.openai.com/v1");
        let smart = ProviderKey::new("openai", "gpt-4o", "https://api.openai.com/v1");
        let c = creds();
        let now = SystemTime::now();
        let until = now + Duration::from_secs(30);
        pool.bench(&fast, &c[0].hint, until);
        assert_eq!(
            pool.lease_at(&fast, &c, now).unwrap().credential().name,
            "B"
        );
        assert_eq!(
            pool.lease_at(&smart, &c, now).unwrap().credential().name,
            "A"
        );
        let later = until + Duration::from_millis(1);
        assert_eq!(
            pool.lease_at(&fast, &c, later).unwrap().credential().name,
            "A"
        );
        // Never shortened.
        assert_eq!(pool.bench(&fast, &c[0].hint, now), until);
        for k in &c[1..] {
            pool.bench(&fast, &k.hint, until);
        }
        assert!(pool.lease_at(&fast, &c, now).is_none());
        assert!(pool.lease_at(&fast, &[], now).is_none());
    }

    #[test]
    fn unresolvable_secrets_are_skipped_with_a_reason_and_none_listed_is_keyless() {
        let resolve = Resolve::new(|n| match n {
            "GOOD" => Lookup::Found("sk-good".into()),
            "EMPTY" => Lookup::Found(String::new()),
            "SEALED" => Lookup::Unavailable("secret SEALED has a corrupt envelope".into()),
            "LATER" => Lookup::Unknown("the secrets bucket has not answered".into()),
            _ => Lookup::Unset,
        });
        let refs: Vec<SecretRef> = ["GOOD", "EMPTY", "GONE", "SEALED", "LATER"]
            .iter()
            .map(|n| SecretRef::name(n).unwrap())
            .collect();
        let (found, missing) = resolve_all(&refs, &resolve);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].hint, key_hint("sk-good"));
        assert_eq!(missing.len(), 4);
        assert!(missing[0].reason.contains("EMPTY is empty"), "{missing:?}");
        assert!(missing[1].reason.contains("GONE is not set"), "{missing:?}");
        assert!(
            missing[2].reason.contains("SEALED has a corrupt envelope"),
            "{missing:?}"
        );
        assert_eq!(
            missing.iter().map(|m| m.unknown).collect::<Vec<_>>(),
            [false, false, false, true],
            "only the one not known yet is unknown"
        );
        assert!(!format!("{found:?}").contains("sk-good"), "Debug hides it");
        let (found, missing) = resolve_all(&[], &resolve);
        assert!(found[0].is_keyless() && missing.is_empty());
    }
}
