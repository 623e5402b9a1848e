//! Model calls: one call through three layers of failure handling, each
//! owning exactly one decision (Architecture §2).
//!
//! 1. The provider plugin classifies the vendor's answer and never retries.
//! 2. The credential pool ([`pool`]) decides whether the key is at fault: a
//!    `rate-limited` or `auth` answer benches that key — locally at once, and
//!    for the fleet through [`Cooldowns::bench`] before the next attempt — and
//!    the same model is tried again with the least-busy key left.
//! 3. The fallback chain decides whether the model is worth abandoning: any
//!    other failure, a plugin fault, or no usable key moves to the next model
//!    and publishes `provider_fallback`; running out of models publishes
//!    `llm_unavailable` and answers [`Exhausted`].
//!
//! A model left with no usable key while one of its keys is not known yet
//! (the secrets store has not answered this node) is not a model failure:
//! the call stops there, with no fallback and no `llm_unavailable`, and
//! answers [`Exhausted`] with `unknown` set — the caller retries later. A key
//! refused mid-call is looked up again before the model is left, so a key
//! rotated while a turn held the old one serves that same call.
//!
//! Cooldowns are fleet state because a limit belongs to the key at the
//! vendor: a node pulls [`Cooldowns::cooldowns`] when it starts (before its first
//! call) and every [`ModelsOptions::pull_every`] after, extending its local
//! bench and never shortening it. A model call never waits on a coordination
//! read.
//!
//! Types: [`Models`] is the turn engine's [`Brain`] itself, and speaks its
//! port's words ([`Prompt`], [`Thought`], [`CallSite`]); the provider
//! world's WIT types are converted in one private module (`wire.rs`) and
//! are not this crate's API. A model entry's `options` go to the plugin as
//! `options-json`.
//!
//! [`Embeddings`] (`embed.rs`) is the turn engine's `Embedder`: the
//! company's one embedding model through the same key pool, cooldowns and
//! budgets.

mod embed;
pub mod failure;
pub mod pool;
mod wire;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crewlet_company::ModelRef;
use crewlet_coord::{Cooldown, Cooldowns, KeyHint};
use crewlet_observe::Publisher;
use crewlet_plugins::Installed;
use crewlet_plugins::manifest::Permissions;
use crewlet_plugins::provider::ProviderPlugin;
use crewlet_turns::{Brain, CallSite, Prompt, Thought, Unavailable};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

pub use embed::Embeddings;
pub use failure::{CooldownPolicy, DEFAULT_COOLDOWN_FLOOR, Decision, Failure};
pub use pool::{
    Credential, CredentialPool, PoolLease, ProviderKey, Resolve, Secret, Unresolved, resolve_all,
};

/// How the model layer runs.
#[derive(Debug, Clone)]
pub struct ModelsOptions {
    /// How often the fleet's cooldowns are pulled. Default 15 s.
    pub pull_every: Duration,
    /// How long a pull may take before it counts as unreadable. Default 10 s.
    pub pull_timeout: Duration,
    /// How long a bench's fleet write may hold up the retry. Default 2 s.
    pub bench_publish_timeout: Duration,
    pub cooldowns: CooldownPolicy,
}

impl Default for ModelsOptions {
    fn default() -> ModelsOptions {
        ModelsOptions {
            pull_every: Duration::from_secs(15),
            pull_timeout: Duration::from_secs(10),
            bench_publish_timeout: Duration::from_secs(2),
            cooldowns: CooldownPolicy::default(),
        }
    }
}

/// How one attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Answered,
    Failed { failure: Failure, line: String },
}

/// One attempt of a call: a model, a key, and what happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub provider: String,
    pub model: String,
    /// `None` when no key was leased (none usable) or the entry is keyless.
    pub key_hint: Option<KeyHint>,
    pub outcome: Outcome,
    pub elapsed: Duration,
}

/// A successful call.
#[derive(Debug, Clone)]
pub struct ModelAnswer {
    /// The answer, as the turn engine takes it.
    pub thought: Thought,
    /// Why the model stopped, in the vendor's words (`stop`, `tool_calls`).
    pub stop_reason: String,
    /// The vendor's id for the answering request.
    pub request_id: Option<String>,
    /// The chain entry that answered.
    pub model: ModelRef,
    /// The key that answered (`None` for a keyless entry).
    pub key_hint: Option<KeyHint>,
    /// Every attempt, the answering one last.
    pub attempts: Vec<Attempt>,
}

/// Every model in the chain failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "no model answered (chain: {}); last error: {last_error}. Check the provider keys and cooldowns, or add a model to the role's chain",
    chain.join(" → ")
)]
pub struct Exhausted {
    /// `provider/model` for each chain entry, in order.
    pub chain: Vec<String>,
    /// The last attempt's redacted line.
    pub last_error: String,
    pub attempts: Vec<Attempt>,
    /// Stopped because a model's key is not known yet: not an answer about
    /// the models — retry once the secrets store answers.
    pub unknown: bool,
}

/// A chain that stopped on a key not known yet is our outage (the turn runs
/// again later); any other exhausted chain is the models' answer.
impl From<Exhausted> for Unavailable {
    fn from(e: Exhausted) -> Unavailable {
        if e.unknown {
            Unavailable::KeyUnknown(e.last_error)
        } else {
            Unavailable::Chain(e.last_error)
        }
    }
}

/// The model layer of one node. Dropping it stops its cooldown puller;
/// [`Models::shutdown`] stops it and waits.
pub struct Models {
    inner: Arc<Inner>,
    stop: watch::Sender<bool>,
    puller: Mutex<Option<JoinHandle<()>>>,
}

struct Inner {
    /// The node's plugins: a provider is looked up for each call, so a
    /// reloaded one serves the next call.
    providers: Arc<Installed>,
    cooldowns: Cooldowns,
    publisher: Option<Publisher>,
    resolve: Resolve,
    opts: ModelsOptions,
    pool: CredentialPool,
}

/// The base URL a provider plugin calls (its cooldown scope).
fn base_url(p: &ProviderPlugin) -> String {
    match &p.manifest().permissions {
        Permissions::Provider { base_url, .. } => base_url.clone(),
        _ => String::new(),
    }
}

fn label(m: &ModelRef) -> String {
    format!("{}/{}", m.provider, m.model)
}

/// The provider slot that served a call: the chain's entry and the key of
/// its pool (by hint, never the key), `#keyless` for an entry without one.
pub(crate) fn slot(m: &ModelRef, hint: Option<&KeyHint>) -> String {
    match hint {
        Some(h) => format!("{}#{}", label(m), h.as_str()),
        None => format!("{}#keyless", label(m)),
    }
}

fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Models {
    /// Starts the model layer: pulls the fleet's cooldowns once (so the first
    /// call already skips keys a peer benched), then every
    /// `opts.pull_every` until shut down. Must run inside a tokio runtime.
    pub async fn new(
        providers: Arc<Installed>,
        cooldowns: Cooldowns,
        publisher: Option<Publisher>,
        resolve: Resolve,
        opts: ModelsOptions,
    ) -> Models {
        let inner = Arc::new(Inner {
            providers,
            cooldowns,
            publisher,
            resolve,
            opts,
            pool: CredentialPool::new(),
        });
        inner.pull().await;
        let (stop, mut stopped) = watch::channel(false);
        let every = inner.opts.pull_every;
        let puller = tokio::spawn({
            let inner = inner.clone();
            async move {
                loop {
                    tokio::select! {
                        _ = stopped.changed() => break,
                        _ = tokio::time::sleep(every) => { inner.pull().await; }
                    }
                }
            }
        });
        Models {
            inner,
            stop,
            puller: Mutex::new(Some(puller)),
        }
    }

    /// The local pool (in-flight counts and cooldowns).
    pub fn pool(&self) -> &CredentialPool {
        &self.inner.pool
    }

    /// The cooldown scope of a chain entry; `None` when its provider plugin
    /// is not loaded.
    pub fn provider_key(&self, entry: &ModelRef) -> Option<ProviderKey> {
        self.inner
            .providers
            .provider(&entry.provider)
            .map(|p| ProviderKey::new(&entry.provider, &entry.model, &base_url(&p)))
    }

    /// Pulls the fleet's cooldowns now; answers the entries a peer extended.
    pub async fn pull_now(&self) -> Vec<Cooldown> {
        self.inner.pull().await
    }

    /// Stops the cooldown puller and waits for it.
    pub async fn shutdown(&self) {
        let _ = self.stop.send(true);
        let handle = self.puller.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.await;
        }
    }

    /// Calls the chain in order until a model answers. See the module docs
    /// for what each failure decides.
    pub async fn call(
        &self,
        chain: &[ModelRef],
        prompt: Prompt,
        site: &CallSite,
    ) -> Result<ModelAnswer, Exhausted> {
        self.inner
            .call(chain, &wire::Outgoing::of(prompt), site)
            .await
    }
}

impl Brain for Models {
    async fn think(
        &self,
        chain: &[ModelRef],
        prompt: Prompt,
        site: &CallSite,
    ) -> Result<Thought, Unavailable> {
        Ok(self.call(chain, prompt, site).await?.thought)
    }
}

impl Drop for Models {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// Why an attempt on one key failed, before it is classed.
pub(crate) enum Miss {
    /// The plugin classified the vendor's failure.
    Provider(crewlet_plugins::provider::ProviderError),
    /// The plugin faulted.
    Fault(crewlet_plugins::CallError),
    /// The plugin cannot do what was asked (a provider that does not
    /// embed); carries why.
    Unsupported(String),
}

/// Whom a call's events are addressed to: a turn's model call, or an
/// embedding (which may belong to no turn).
pub(crate) struct Whom {
    seat: String,
    turn_id: Option<String>,
    phase: &'static str,
    iteration: Option<u32>,
    trace_id: Option<String>,
}

impl Whom {
    fn call(site: &CallSite) -> Whom {
        Whom {
            seat: site.seat.clone(),
            turn_id: Some(site.turn_id.clone()),
            phase: site.phase.as_str(),
            iteration: Some(site.iteration),
            trace_id: site.trace_id.clone(),
        }
    }
}

/// A model entry's `options`, as the plugin reads them.
fn options_json(entry: &ModelRef) -> String {
    serde_json::to_string(&entry.options).unwrap_or_else(|_| "{}".to_owned())
}

/// Why the chain left a model.
pub(crate) struct Leave {
    pub(crate) failure: Failure,
    pub(crate) line: String,
    /// No usable key while one is not known yet: the chain stops here.
    pub(crate) unknown: bool,
}

impl Inner {
    async fn call(
        &self,
        chain: &[ModelRef],
        req: &wire::Outgoing,
        site: &CallSite,
    ) -> Result<ModelAnswer, Exhausted> {
        let mut attempts = Vec::new();
        let mut last_error = "the chain is empty: give the role at least one model".to_owned();
        for (i, entry) in chain.iter().enumerate() {
            let leave = match self.try_model(entry, req, site, &mut attempts).await {
                Ok((mut thought, receipt, key_hint)) => {
                    thought.slot = Some(slot(entry, key_hint.as_ref()));
                    return Ok(ModelAnswer {
                        thought,
                        stop_reason: receipt.stop_reason,
                        request_id: receipt.request_id,
                        model: entry.clone(),
                        key_hint,
                        attempts,
                    });
                }
                Err(leave) => leave,
            };
            last_error = format!("{}: {}", label(entry), leave.line);
            if leave.unknown {
                warn!(model = %label(entry), reason = %leave.line, turn_id = %site.turn_id,
                    "a model key is not known yet on this node; the call stops here, to be retried");
                return Err(Exhausted {
                    chain: chain.iter().map(label).collect(),
                    last_error,
                    attempts,
                    unknown: true,
                });
            }
            if let Some(next) = chain.get(i + 1) {
                warn!(
                    from = %label(entry), to = %label(next), reason = %leave.line,
                    turn_id = %site.turn_id, "model fallback"
                );
                self.emit(
                    "provider_fallback",
                    Some(&Whom::call(site)),
                    json!({
                        "from": label(entry),
                        "to": label(next),
                        "reason": leave.line,
                        "failure": leave.failure.name(),
                    }),
                )
                .await;
            }
        }
        let chain_labels: Vec<String> = chain.iter().map(label).collect();
        warn!(chain = ?chain_labels, last_error = %last_error, turn_id = %site.turn_id, "no model answered");
        self.emit(
            "llm_unavailable",
            Some(&Whom::call(site)),
            json!({ "chain": chain_labels, "last_error": last_error }),
        )
        .await;
        Err(Exhausted {
            chain: chain_labels,
            last_error,
            attempts,
            unknown: false,
        })
    }

    /// Tries one model with each usable key in turn; `Err` says why the
    /// chain leaves it.
    async fn try_model(
        &self,
        entry: &ModelRef,
        req: &wire::Outgoing,
        site: &CallSite,
        attempts: &mut Vec<Attempt>,
    ) -> Result<(Thought, wire::Receipt, Option<KeyHint>), Leave> {
        let options_json = options_json(entry);
        let (completion, hint) = self
            .with_keys(entry, &Whom::call(site), attempts, |plugin, key| {
                let request = req.request(&entry.model, key, &options_json);
                async move {
                    match plugin.complete(request).await {
                        Ok(Ok(completion)) => Ok(completion),
                        Ok(Err(e)) => Err(Miss::Provider(e)),
                        Err(fault) => Err(Miss::Fault(fault)),
                    }
                }
            })
            .await?;
        let (thought, receipt) = wire::thought(completion, entry);
        Ok((thought, receipt, hint))
    }

    /// Runs `attempt` on one model with each usable key in turn, the least
    /// busy first: a key's fault (rate-limited, refused) benches it and the
    /// next is tried; any other failure leaves the model. `Err` says why.
    pub(crate) async fn with_keys<T, F, Fut>(
        &self,
        entry: &ModelRef,
        whom: &Whom,
        attempts: &mut Vec<Attempt>,
        mut attempt: F,
    ) -> Result<(T, Option<KeyHint>), Leave>
    where
        F: FnMut(Arc<ProviderPlugin>, &str) -> Fut,
        Fut: std::future::Future<Output = Result<T, Miss>>,
    {
        let record = |attempts: &mut Vec<Attempt>, hint, failure: Failure, line: &str, t| {
            attempts.push(Attempt {
                provider: entry.provider.clone(),
                model: entry.model.clone(),
                key_hint: hint,
                outcome: Outcome::Failed {
                    failure,
                    line: line.to_owned(),
                },
                elapsed: t,
            });
        };
        let Some(plugin) = self.providers.provider(&entry.provider) else {
            let line = format!(
                "no-provider: no provider plugin named {:?} is loaded; check the plugins directory or the model entry's `provider`",
                entry.provider
            );
            record(attempts, None, Failure::NoProvider, &line, Duration::ZERO);
            return Err(Leave {
                failure: Failure::NoProvider,
                line,
                unknown: false,
            });
        };
        let pkey = &ProviderKey::new(&entry.provider, &entry.model, &base_url(&plugin));
        let (mut keys, mut unresolved) = resolve_all(&entry.credentials, &self.resolve);
        let mut all_keys = keys.clone();
        loop {
            let Some(lease) = self.pool.lease(pkey, &keys) else {
                let line = self.no_key_line(pkey, &all_keys, &unresolved);
                record(attempts, None, Failure::NoKey, &line, Duration::ZERO);
                return Err(Leave {
                    failure: Failure::NoKey,
                    line,
                    unknown: unresolved.iter().any(|u| u.unknown),
                });
            };
            let cred = lease.credential().clone();
            // A key is tried once per model per call, whatever its bench.
            keys.retain(|k| k.hint != cred.hint);
            let hint = (!cred.is_keyless()).then(|| cred.hint.clone());
            let started = Instant::now();
            let outcome = attempt(plugin.clone(), cred.secret.expose()).await;
            let elapsed = started.elapsed();
            drop(lease);
            let (failure, line) = match outcome {
                Ok(answer) => {
                    attempts.push(Attempt {
                        provider: entry.provider.clone(),
                        model: entry.model.clone(),
                        key_hint: hint.clone(),
                        outcome: Outcome::Answered,
                        elapsed,
                    });
                    return Ok((answer, hint));
                }
                Err(Miss::Provider(e)) => {
                    (Failure::of(&e.kind), failure::provider_line(&e, &all_keys))
                }
                Err(Miss::Fault(fault)) => {
                    (Failure::PluginFault, failure::fault_line(&fault, &all_keys))
                }
                Err(Miss::Unsupported(why)) => (
                    Failure::BadRequest,
                    failure::redact(&format!("unsupported: {why}"), &all_keys),
                ),
            };
            record(attempts, hint, failure.clone(), &line, elapsed);
            match failure.decide(&self.opts.cooldowns) {
                Decision::BenchKey(d) => {
                    self.bench(pkey, &cred, d, &line, whom).await;
                    // Looked up again: a key rotated since this call began
                    // (or one that became known) is tried before leaving.
                    let (fresh, still) = resolve_all(&entry.credentials, &self.resolve);
                    for k in fresh {
                        if !all_keys.iter().any(|a| a.hint == k.hint) {
                            all_keys.push(k.clone());
                            keys.push(k);
                        }
                    }
                    unresolved = still;
                }
                Decision::NextModel => {
                    return Err(Leave {
                        failure,
                        line,
                        unknown: false,
                    });
                }
            }
        }
    }

    fn no_key_line(
        &self,
        pkey: &ProviderKey,
        keys: &[Credential],
        unresolved: &[Unresolved],
    ) -> String {
        let now = SystemTime::now();
        let mut why: Vec<String> = keys
            .iter()
            .map(|k| match self.pool.cooling_until(pkey, &k.hint, now) {
                Some(u) => format!(
                    "key {} cooling for {} s more",
                    k.hint.as_str(),
                    u.duration_since(now).unwrap_or_default().as_secs() + 1
                ),
                None => format!("key {} already failed in this call", k.hint.as_str()),
            })
            .collect();
        why.extend(unresolved.iter().map(|u| u.reason.clone()));
        format!("no-key: no usable key: {}", why.join("; "))
    }

    /// Benches a key here at once and for the fleet before the next attempt.
    /// The fleet write runs detached (a cancelled call still publishes it)
    /// and is waited for at most `bench_publish_timeout`; if it fails, the
    /// local bench still applies.
    async fn bench(
        &self,
        pkey: &ProviderKey,
        cred: &Credential,
        d: Duration,
        line: &str,
        whom: &Whom,
    ) {
        let until = self.pool.bench(pkey, &cred.hint, SystemTime::now() + d);
        let write = tokio::spawn({
            let (cooldowns, p, h) = (self.cooldowns.clone(), pkey.clone(), cred.hint.clone());
            async move { cooldowns.bench(p.as_str(), &h, until).await }
        });
        match tokio::time::timeout(self.opts.bench_publish_timeout, write).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => {
                warn!(provider = %pkey, key_hint = cred.hint.as_str(), error = %e, "the fleet did not record a bench; it applies on this node only")
            }
            Ok(Err(e)) => {
                warn!(provider = %pkey, error = %e, "the bench write task failed; the bench applies on this node only")
            }
            Err(_) => {
                warn!(provider = %pkey, key_hint = cred.hint.as_str(), "the fleet bench write did not finish in time; it continues in the background")
            }
        }
        info!(provider = %pkey, key_hint = cred.hint.as_str(), until_ms = epoch_ms(until), reason = %line, "credential benched");
        self.emit(
            "credential_benched",
            Some(whom),
            json!({
                "provider": pkey.as_str(),
                "key_hint": cred.hint.as_str(),
                "until_ms": epoch_ms(until),
                "reason": line,
            }),
        )
        .await;
    }

    /// One pull of the fleet's cooldowns, merged into the local bench.
    async fn pull(&self) -> Vec<Cooldown> {
        let pulled =
            match tokio::time::timeout(self.opts.pull_timeout, self.cooldowns.cooldowns()).await {
                Ok(r) => r,
                Err(_) => Err(crewlet_coord::CoordError::Unavailable(format!(
                    "the cooldowns pull took over {:?}",
                    self.opts.pull_timeout
                ))),
            };
        if let Err(e) = &pulled {
            warn!(error = %e, "cannot read the fleet's cooldowns; keeping this node's bench as it is");
        }
        let extended = self.pool.merge(&pulled);
        let now = SystemTime::now();
        for c in &extended {
            let left = c.until.duration_since(now).unwrap_or_default();
            info!(provider = %c.provider, key_hint = c.hint.as_str(), left_s = left.as_secs(), "credential cooled by a peer");
            self.emit(
                "credential_cooled_by_peer",
                None,
                json!({
                    "provider": c.provider,
                    "key_hint": c.hint.as_str(),
                    "until_ms": epoch_ms(c.until),
                    "remaining_ms": left.as_millis() as u64,
                }),
            )
            .await;
        }
        extended
    }

    /// Publishes an event addressed to `site`; a failure is logged, never
    /// fails the call.
    pub(crate) async fn emit(&self, kind: &str, site: Option<&Whom>, mut payload: Value) {
        let Some(p) = &self.publisher else {
            return;
        };
        if let (Some(s), Value::Object(map)) = (site, &mut payload) {
            map.insert("turn_id".into(), json!(s.turn_id));
            map.insert("seat".into(), json!(s.seat));
            map.insert("phase".into(), json!(s.phase));
            if let Some(i) = s.iteration {
                map.insert("iteration".into(), json!(i));
            }
            map.insert("trace_id".into(), json!(s.trace_id));
        }
        let mut event = p.event(kind, payload);
        if let Some(s) = site {
            event.trace_id = s.trace_id.clone();
            event.seat = Some(s.seat.clone());
        }
        if let Err(e) = p.publish(event).await {
            warn!(kind, error = %e, "a model event was not published");
        }
    }
}
