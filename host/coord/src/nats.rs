//! The JetStream KV backend.
//!
//! Rules, each from an incident:
//! - Every single-key read is the stream leader's (`STREAM.MSG.GET` with
//!   `last_by_subj`), never the bucket's direct get, which any replica
//!   answers and which, right after a write, returned the old value 5–8 % of
//!   the time on a 3-node cluster. No leader is unavailable, never "absent".
//! - A listing is one ordered pass carrying keys and values, certified
//!   against the stream's per-subject index (`STREAM.INFO` with
//!   `subjects_filter`, requested beside the pass). Every key the index
//!   names that the pass missed, or delivered as a removal marker, is read
//!   from the leader. Once the index has answered, a pass quiet for
//!   [`QUIET`] is ended and the rest read from the leader. An index page
//!   answered while the stream has no leader is refused (a member behind
//!   would name fewer keys). Any failed step is unavailable, never a short
//!   list.
//! - Bound: the broker pages the index at 100,000 subjects per filter. Past
//!   that the index is read page by page by offset into a list the server
//!   re-sorts per page, so a key removed before a page boundary between two
//!   page reads can shift a later key across it and leave it uncertified —
//!   which loses that key only if the pass lost it too. Keep classes under
//!   100,000 keys to keep the certification exact.
//! - Writes are predicated with `Nats-Expected-Last-Subject-Sequence`; a
//!   stale one is a conflict, any other failure is unavailable. What a
//!   refused write means is read from the ack's JetStream error code, never
//!   from its text.
//! - Buckets that exist are adopted, never reconfigured — except a named
//!   bucket whose spec says so ([`crate::named`]), served by the same
//!   primitives as the coordination buckets.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer, kv, stream};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use crate::bucket::{Bucket, Retentions};
use crate::kv::{Change, Conflict, Entry, Expect, Kv, KvResult, Unavailable, Watch, WriteResult};
use crate::named::{
    BucketName, Existing, NamedError, NamedKv, NamedResult, NamedSpec, NamedWrite, Refused,
};

/// A pass that goes this long without a delivery, after the index answered,
/// is ended (the broker's own idle interval for this kind of consumer).
pub const QUIET: Duration = Duration::from_secs(5);

/// What [`PASS_STARTED`] runs.
#[doc(hidden)]
pub type PassHook = Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

tokio::task_local! {
    /// Test seam, not an interface: a certified listing polled inside
    /// `PASS_STARTED.scope(hook, ..)` awaits `hook()` once its index has
    /// answered and its pass is subscribed, before it reads any delivery, so
    /// a test can change the bucket under a pass it knows has started.
    /// Outside a scope it costs one task-local lookup per listing.
    #[doc(hidden)]
    pub static PASS_STARTED: PassHook;
}

/// The key the opening probe writes to (and is refused: nothing is stored).
/// No name encodes to it: an encoded `_` is always followed by two hex digits.
const REACH_PROBE_KEY: &str = "_reach";

/// How many leader reads a listing runs at once for keys its pass lost.
const READ_FANOUT: usize = 32;

const KV_OPERATION: &str = "KV-Operation";
const EXPECTED_LAST_SUBJECT_SEQ: &str = "Nats-Expected-Last-Subject-Sequence";
/// A stale expected sequence (10071), and the constant form a clustered
/// stream answers when another expected-sequence write on the same subject
/// is still in flight (10164). Both mean "someone else wrote first".
const WRONG_LAST_SEQUENCE: [jetstream::ErrorCode; 2] = [
    jetstream::ErrorCode::STREAM_WRONG_LAST_SEQUENCE,
    jetstream::ErrorCode(10164),
];
/// A write the bucket has no room for. Every bucket discards new writes at
/// its limits, and the only limit a bucket has that a write can hit is its
/// `max_bytes`, which the broker answers with "stream store failed" (10077,
/// described "maximum bytes exceeded", seen on one server and on a cluster);
/// an account or server out of storage answers 10002 / 10047. A store that
/// failed the write for another reason answered no as well (nothing was
/// stored), so it is a refusal, never the unknown.
const FULL: [jetstream::ErrorCode; 3] = [
    jetstream::ErrorCode::STREAM_STORE_FAILED,
    jetstream::ErrorCode::ACCOUNT_RESOURCES_EXCEEDED,
    jetstream::ErrorCode::STORAGE_RESOURCES_EXCEEDED,
];

/// Why opening the NATS backend failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(
        "bucket {bucket} has {has} replica(s) but this node is configured for {want}; raise it (`nats stream update KV_{bucket} --replicas={want}`) or lower stream.replicas — refusing to start on fewer copies than configured"
    )]
    TooFewReplicas {
        bucket: String,
        has: usize,
        want: usize,
    },
    #[error(
        "cannot open bucket {bucket} ({why}); check that the broker has JetStream enabled and is reachable on this node's connection"
    )]
    Bucket { bucket: String, why: String },
    #[error(transparent)]
    Unreachable(Box<crate::reach::Unreachable>),
}

/// A listing pass's consumer.
struct Pass {
    msgs: consumer::push::Ordered,
    consumer_name: String,
}

/// One opened bucket.
struct Opened {
    name: String,
    stream: stream::Stream,
    prefix: String,
    age: Option<Duration>,
}

/// The JetStream KV backend, on the node's one connection.
pub struct NatsKv {
    js: jetstream::Context,
    buckets: HashMap<Bucket, Arc<Opened>>,
    /// Buckets opened (or adopted on first use) by name.
    named: Mutex<HashMap<BucketName, Arc<Opened>>>,
}

#[derive(Serialize)]
struct InfoRequest<'a> {
    subjects_filter: &'a str,
    offset: usize,
}

#[derive(Deserialize)]
struct InfoPage {
    state: InfoState,
    #[serde(default)]
    cluster: Option<InfoCluster>,
    #[serde(default)]
    total: usize,
    #[serde(default)]
    limit: usize,
}

impl InfoPage {
    /// Whether the page was answered while the stream had a leader. During
    /// an election any member answers from its own store, and one that is
    /// behind names fewer keys than the quorum holds.
    fn led(&self) -> bool {
        self.cluster
            .as_ref()
            .and_then(|c| c.leader.as_deref())
            .is_some_and(|l| !l.is_empty())
    }
}

#[derive(Deserialize)]
struct InfoState {
    #[serde(default)]
    subjects: Option<HashMap<String, u64>>,
}

#[derive(Deserialize)]
struct InfoCluster {
    #[serde(default)]
    leader: Option<String>,
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> Unavailable {
    Unavailable(format!("{what}: {e}"))
}

/// The JetStream error code a refused publish was answered with.
fn ack_code(e: &jetstream::context::PublishError) -> Option<jetstream::ErrorCode> {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<jetstream::Error>())
        .map(|j| j.error_code())
}

fn is_stream_not_found(e: &jetstream::context::GetStreamError) -> bool {
    matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(ref j)
        if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND)
}

impl Opened {
    fn new(name: String, stream: stream::Stream) -> Opened {
        let max_age = stream.cached_info().config.max_age;
        Opened {
            prefix: format!("$KV.{name}."),
            name,
            stream,
            age: (!max_age.is_zero()).then_some(max_age),
        }
    }
}

impl NatsKv {
    /// Opens (adopting or creating) every bucket in `buckets`.
    pub async fn open(
        client: async_nats::Client,
        namespace: &str,
        buckets: &[Bucket],
        retentions: &Retentions,
        replicas: usize,
        request_timeout: Duration,
    ) -> Result<NatsKv, OpenError> {
        let mut js = jetstream::new(client);
        js.set_timeout(request_timeout);
        // Buckets are opened side by side: each creation is a stream
        // created (and fsynced) by the server, and one after another they
        // cost a node's start seconds.
        let streams = futures::future::try_join_all(buckets.iter().map(|&b| {
            let js = &js;
            async move {
                let name = format!("{namespace}_{}", b.short());
                let spec = retentions.spec(b);
                let config = kv::Config {
                    bucket: name.clone(),
                    history: 1,
                    max_age: spec.age.unwrap_or_default(),
                    num_replicas: replicas,
                    storage: stream::StorageType::File,
                    ..Default::default()
                };
                let stream = open_reachable(js, config, Existing::Adopt).await?;
                Ok::<_, OpenError>((b, name, spec, stream))
            }
        }))
        .await?;
        let mut opened_all = HashMap::new();
        for (b, name, spec, stream) in streams {
            let cfg = &stream.cached_info().config;
            let has = cfg.num_replicas.max(1);
            if has < replicas {
                return Err(OpenError::TooFewReplicas {
                    bucket: name,
                    has,
                    want: replicas,
                });
            }
            let opened = Opened::new(name, stream);
            let (name, age) = (&opened.name, opened.age);
            if b == Bucket::Leases && age != spec.age {
                tracing::warn!(
                    event = "coord_kv_lease_ttl_differs",
                    bucket = %name,
                    in_force = ?age,
                    configured = ?spec.age,
                    "the leases bucket already exists with another lease TTL; running at the TTL in force"
                );
            }
            opened_all.insert(b, Arc::new(opened));
        }
        Ok(NatsKv {
            js,
            buckets: opened_all,
            named: Mutex::default(),
        })
    }

    /// A backend on the node's connection that opens no coordination
    /// bucket: for buckets opened by name ([`NamedKv`], module state).
    pub fn named_only(client: async_nats::Client, request_timeout: Duration) -> NatsKv {
        let mut js = jetstream::new(client);
        js.set_timeout(request_timeout);
        NatsKv {
            js,
            buckets: HashMap::new(),
            named: Mutex::default(),
        }
    }

    fn bucket(&self, b: Bucket) -> KvResult<&Arc<Opened>> {
        self.buckets.get(&b).ok_or_else(|| {
            Unavailable(format!(
                "bucket {} is not opened on this backend",
                b.short()
            ))
        })
    }

    /// The stream behind a bucket (for benchmarks and tests).
    pub fn stream_name(&self, b: Bucket) -> Option<String> {
        self.buckets.get(&b).map(|o| format!("KV_{}", o.name))
    }

    /// The bucket's full name.
    pub fn bucket_name(&self, b: Bucket) -> Option<String> {
        self.buckets.get(&b).map(|o| o.name.clone())
    }

    /// A coordination write: a refusal other than a conflict (no
    /// coordination bucket has caps) is not a yes or a no.
    async fn publish(
        &self,
        b: Bucket,
        key: &str,
        value: Bytes,
        removed: bool,
        expect: Expect,
    ) -> WriteResult {
        let o = self.bucket(b)?;
        match self.publish_to(o, key, value, removed, expect).await? {
            Ok(rev) => Ok(Ok(rev)),
            Err(Refused::Conflict) => Ok(Err(Conflict)),
            Err(other) => Err(Unavailable(format!(
                "bucket {} refused the write ({other:?}); coordination buckets have no caps — check the stream's limits",
                o.name
            ))),
        }
    }

    /// One write, predicated on `expect`; the refusal read from the ack's
    /// error code.
    async fn publish_to(
        &self,
        o: &Opened,
        key: &str,
        value: Bytes,
        removed: bool,
        expect: Expect,
    ) -> KvResult<Result<u64, Refused>> {
        let mut headers = HeaderMap::new();
        if removed {
            headers.insert(KV_OPERATION, "DEL");
        }
        if let Expect::Revision(r) = expect {
            headers.insert(EXPECTED_LAST_SUBJECT_SEQ, r.to_string().as_str());
        }
        let subject = format!("{}{key}", o.prefix);
        let ack = self
            .js
            .publish_with_headers(subject, headers, value)
            .await
            .map_err(|e| unavailable("publish", e))?;
        match ack.await {
            Ok(a) => Ok(Ok(a.sequence)),
            Err(e) => match ack_code(&e) {
                _ if e.kind() == jetstream::context::PublishErrorKind::WrongLastSequence => {
                    Ok(Err(Refused::Conflict))
                }
                Some(c) if WRONG_LAST_SEQUENCE.contains(&c) => Ok(Err(Refused::Conflict)),
                Some(c) if FULL.contains(&c) => Ok(Err(Refused::Full)),
                Some(jetstream::ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM) => {
                    Ok(Err(Refused::TooLarge))
                }
                _ => Err(unavailable("publish ack", e)),
            },
        }
    }

    /// The leader's per-subject index under `filter`: the keys it names.
    /// Refused (unavailable) when any page comes from a stream with no leader.
    async fn index(&self, o: &Opened, filter: &str) -> KvResult<HashSet<String>> {
        let mut keys = HashSet::new();
        let mut offset = 0usize;
        loop {
            let req = InfoRequest {
                subjects_filter: filter,
                offset,
            };
            let resp: jetstream::response::Response<InfoPage> = self
                .js
                .request(format!("STREAM.INFO.KV_{}", o.name), &req)
                .await
                .map_err(|e| unavailable("stream index", e))?;
            let page = match resp {
                jetstream::response::Response::Ok(p) => p,
                jetstream::response::Response::Err { error } => {
                    return Err(unavailable("stream index", error));
                }
            };
            if !page.led() {
                return Err(Unavailable(format!(
                    "bucket {} has no stream leader; its index is not trusted during an election",
                    o.name
                )));
            }
            let subjects = page.state.subjects.unwrap_or_default();
            let n = subjects.len();
            for s in subjects.into_keys() {
                if let Some(k) = s.strip_prefix(&o.prefix) {
                    keys.insert(k.to_owned());
                }
            }
            offset += n;
            if n == 0 || page.limit == 0 || offset >= page.total {
                return Ok(keys);
            }
        }
    }

    async fn leader_get(&self, o: &Opened, key: &str) -> KvResult<Option<Entry>> {
        let subject = format!("{}{key}", o.prefix);
        match o.stream.get_last_raw_message_by_subject(&subject).await {
            Ok(m) => Ok(Some(Entry {
                key: key.to_owned(),
                removed: is_marker(&m.headers),
                value: m.payload,
                revision: m.sequence,
                written_at: SystemTime::from(m.time),
            })),
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(unavailable("leader read", e)),
        }
    }

    async fn ordered_pass(
        &self,
        o: &Opened,
        filter_subject: &str,
        headers_only: bool,
    ) -> KvResult<(consumer::push::Ordered, u64, String)> {
        let c = o
            .stream
            .create_consumer(consumer::push::OrderedConfig {
                deliver_subject: self.js.client().new_inbox(),
                filter_subject: filter_subject.to_owned(),
                headers_only,
                replay_policy: consumer::ReplayPolicy::Instant,
                deliver_policy: consumer::DeliverPolicy::LastPerSubject,
                ..Default::default()
            })
            .await
            .map_err(|e| unavailable("listing consumer", e))?;
        let pending = c.cached_info().num_pending;
        let name = c.cached_info().name.clone();
        let msgs = c
            .messages()
            .await
            .map_err(|e| unavailable("listing consumer", e))?;
        Ok((msgs, pending, name))
    }

    /// The certified listing. Returns every key it answered with (live
    /// records and markers, at the newest revision read) and the consumer,
    /// for a watch to go on with.
    async fn certified(
        &self,
        o: Arc<Opened>,
        filter: Option<&str>,
    ) -> KvResult<(HashMap<String, Entry>, Pass, Arc<Opened>)> {
        let filter_subject = match filter {
            Some(f) => format!("{}{f}.>", o.prefix),
            None => format!("{}>", o.prefix),
        };
        // The index request runs beside the pass so their round trips overlap.
        let index_fut = self.index(&o, &filter_subject);
        let pass_fut = self.ordered_pass(&o, &filter_subject, false);
        // The consumer is asked for first, so its deliveries start while the
        // broker builds the index answer.
        let (pass, index) = futures::join!(pass_fut, index_fut);
        let index = index?;
        let (mut msgs, pending, consumer_name) = pass?;
        if let Ok(hook) = PASS_STARTED.try_with(Arc::clone) {
            hook().await;
        }
        let mut delivered: HashMap<String, Entry> = HashMap::new();
        let mut pass_done = pending == 0;
        // Index keys the pass has not delivered yet: once none is left the
        // pass has nothing more to certify and ends without waiting for the
        // client's end-of-pass guess (which keys renewed in a tight loop can
        // postpone for ever).
        let mut undelivered = index.len();
        while !pass_done && undelivered > 0 {
            match tokio::time::timeout(QUIET, msgs.next()).await {
                Err(_quiet) => pass_done = true,
                Ok(None) => return Err(Unavailable("listing pass ended early".into())),
                Ok(Some(Err(e))) => return Err(unavailable("listing pass", e)),
                Ok(Some(Ok(m))) => {
                    let info = m.info().map_err(|e| unavailable("listing pass", e))?;
                    let (rev, pending, at) = (info.stream_sequence, info.pending, info.published);
                    if let Some(key) = m.subject.strip_prefix(&o.prefix) {
                        let entry = Entry {
                            key: key.to_owned(),
                            removed: m.headers.as_ref().is_some_and(is_marker),
                            value: m.payload.clone(),
                            revision: rev,
                            written_at: SystemTime::from(at),
                        };
                        match delivered.get(key) {
                            Some(prev) if prev.revision >= rev => {}
                            Some(_) => {
                                delivered.insert(key.to_owned(), entry);
                            }
                            None => {
                                if index.contains(key) {
                                    undelivered -= 1;
                                }
                                delivered.insert(key.to_owned(), entry);
                            }
                        }
                    }
                    if pending == 0 {
                        pass_done = true;
                    }
                }
            }
        }
        // Every key the index names that the pass lost or delivered as a
        // marker is the leader's to answer.
        let reread: Vec<String> = index
            .iter()
            .filter(|k| delivered.get(*k).is_none_or(|e| e.removed))
            .cloned()
            .collect();
        let read: Vec<(String, Option<Entry>)> = futures::stream::iter(reread)
            .map(|k| {
                let o = o.clone();
                async move {
                    let e = self.leader_get(&o, &k).await?;
                    Ok::<_, Unavailable>((k, e))
                }
            })
            .buffer_unordered(READ_FANOUT)
            .try_collect()
            .await?;
        for (k, e) in read {
            match e {
                Some(e) => {
                    delivered.insert(k, e);
                }
                None => {
                    delivered.remove(&k);
                }
            }
        }
        Ok((
            delivered,
            Pass {
                msgs,
                consumer_name,
            },
            o,
        ))
    }

    /// The certified listing's live records.
    async fn list_in(&self, o: Arc<Opened>, filter: Option<&str>) -> KvResult<Vec<Entry>> {
        let (answered, pass, o) = self.certified(o, filter).await?;
        self.retire(&o, pass);
        Ok(answered.into_values().filter(|e| !e.removed).collect())
    }

    /// The certified listing, then the changes after it from the same consumer.
    async fn watch_in(&self, o: Arc<Opened>, filter: Option<&str>) -> KvResult<Watch> {
        let (answered, pass, o) = self.certified(o, filter).await?;
        let msgs = pass.msgs;
        let seen: HashMap<String, u64> = answered
            .iter()
            .map(|(k, e)| (k.clone(), e.revision))
            .collect();
        let mut initial: Vec<Entry> = answered.into_values().filter(|e| !e.removed).collect();
        initial.sort_by(|a, b| a.key.cmp(&b.key));
        // Changes come from the same consumer, so none falls between the
        // answer and the first change; a revision no newer than the one
        // the answer holds is not passed on.
        let changes = msgs.filter_map(move |m| {
            let out = match m {
                Err(e) => Some(Err(unavailable("watch", e))),
                Ok(m) => match m.info() {
                    Err(e) => Some(Err(unavailable("watch", e))),
                    Ok(info) => {
                        let rev = info.stream_sequence;
                        let at = SystemTime::from(info.published);
                        m.subject.strip_prefix(&o.prefix).and_then(|key| {
                            if seen.get(key).is_some_and(|r| rev <= *r) {
                                return None;
                            }
                            Some(Ok(if m.headers.as_ref().is_some_and(is_marker) {
                                Change::Removed {
                                    key: key.to_owned(),
                                    revision: rev,
                                }
                            } else {
                                Change::Put(Entry {
                                    key: key.to_owned(),
                                    value: m.payload.clone(),
                                    revision: rev,
                                    written_at: at,
                                    removed: false,
                                })
                            }))
                        })
                    }
                },
            };
            futures::future::ready(out)
        });
        Ok(Watch {
            initial,
            changes: changes.boxed(),
        })
    }

    /// Deletes a pass's consumer without waiting (the broker would reap it
    /// after its inactivity threshold, but thousands of listings a second
    /// would hit the consumer limit first).
    fn retire(&self, o: &Arc<Opened>, pass: Pass) {
        drop(pass.msgs);
        let stream = o.stream.clone();
        tokio::spawn(async move {
            let _ = stream.delete_consumer(&pass.consumer_name).await;
        });
    }
}

fn is_marker(h: &HeaderMap) -> bool {
    matches!(
        h.get(KV_OPERATION).map(|v| v.as_str()),
        Some("DEL") | Some("PURGE")
    )
}

/// Adopts the bucket `config` names, or creates it with `config` if absent.
async fn open_bucket(
    js: &jetstream::Context,
    config: &kv::Config,
) -> Result<stream::Stream, OpenError> {
    let name = config.bucket.as_str();
    let err = |why: String| OpenError::Bucket {
        bucket: name.to_owned(),
        why,
    };
    let stream_name = format!("KV_{name}");
    let mut last_create_error = String::new();
    for attempt in 0..5u32 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
        }
        match js.get_stream(&stream_name).await {
            Ok(s) => return Ok(s),
            Err(e) if is_stream_not_found(&e) => {}
            // Unreachable or timed out: the broker may still be electing
            // its meta leader at boot; ask again shortly.
            Err(e) => {
                last_create_error = e.to_string();
                continue;
            }
        }
        match js.create_key_value(config.clone()).await {
            // Read it back through get_stream: adopt what is there.
            Ok(_) => {}
            // Another node may have created it first (adopt theirs), or the
            // meta group is still settling (try again shortly).
            Err(e) => {
                last_create_error = format!(
                    "{e}: {:?}",
                    std::error::Error::source(&e).map(|s| s.to_string())
                );
                tracing::debug!(bucket = name, error = %last_create_error, "bucket create failed; reading it back");
            }
        }
    }
    js.get_stream(&stream_name)
        .await
        .map_err(|e| err(format!("{e} (last create attempt: {last_create_error})")))
}

/// Opens the bucket (adopting it, or applying `config` to it when
/// `existing` says so), then waits until a write through this connection
/// reaches it (see [`crate::reach`]).
async fn open_reachable(
    js: &jetstream::Context,
    config: kv::Config,
    existing: Existing,
) -> Result<stream::Stream, OpenError> {
    let name = config.bucket.clone();
    let stream = match existing {
        Existing::Adopt => open_bucket(js, &config).await?,
        Existing::Reconfigure => {
            js.create_or_update_key_value(config)
                .await
                .map_err(|e| OpenError::Bucket {
                    bucket: name.clone(),
                    why: format!(
                        "{e}: {:?}",
                        std::error::Error::source(&e).map(|s| s.to_string())
                    ),
                })?
                .stream
        }
    };
    crate::reach::until_writable(
        js,
        &format!("KV_{name}"),
        &format!("$KV.{name}.{REACH_PROBE_KEY}"),
        crate::reach::REACH_WITHIN,
    )
    .await
    .map_err(|e| OpenError::Unreachable(Box::new(e)))?;
    Ok(stream)
}

impl Kv for NatsKv {
    fn get<'a>(&'a self, bucket: Bucket, key: &'a str) -> BoxFuture<'a, KvResult<Option<Entry>>> {
        Box::pin(async move {
            let o = self.bucket(bucket)?;
            self.leader_get(o, key).await
        })
    }

    fn put<'a>(
        &'a self,
        bucket: Bucket,
        key: &'a str,
        value: Bytes,
        expect: Expect,
    ) -> BoxFuture<'a, WriteResult> {
        Box::pin(self.publish(bucket, key, value, false, expect))
    }

    fn remove<'a>(
        &'a self,
        bucket: Bucket,
        key: &'a str,
        expect: Expect,
    ) -> BoxFuture<'a, WriteResult> {
        Box::pin(self.publish(bucket, key, Bytes::new(), true, expect))
    }

    fn purge_through<'a>(
        &'a self,
        bucket: Bucket,
        key: &'a str,
        revision: u64,
    ) -> BoxFuture<'a, KvResult<()>> {
        Box::pin(async move {
            let o = self.bucket(bucket)?;
            // STREAM.PURGE with a filter and `seq` removes the subject's
            // messages *below* seq: so seq = revision + 1 takes the marker
            // and nothing the key was given after it.
            o.stream
                .purge()
                .filter(format!("{}{key}", o.prefix))
                .sequence(revision + 1)
                .await
                .map_err(|e| unavailable("purge", e))?;
            Ok(())
        })
    }

    fn list<'a>(
        &'a self,
        bucket: Bucket,
        filter: Option<&'a str>,
    ) -> BoxFuture<'a, KvResult<Vec<Entry>>> {
        Box::pin(async move { self.list_in(self.bucket(bucket)?.clone(), filter).await })
    }

    fn markers<'a>(
        &'a self,
        bucket: Bucket,
        before: SystemTime,
    ) -> BoxFuture<'a, KvResult<Vec<Entry>>> {
        Box::pin(async move {
            let o = self.bucket(bucket)?.clone();
            let (mut msgs, pending, consumer_name) = self
                .ordered_pass(&o, &format!("{}>", o.prefix), true)
                .await?;
            let mut out = Vec::new();
            let mut done = pending == 0;
            while !done {
                match tokio::time::timeout(QUIET, msgs.next()).await {
                    // The sweep owes nobody a complete answer: a quiet pass
                    // ends and the rest is swept on the next tick.
                    Err(_) | Ok(None) => done = true,
                    Ok(Some(Err(e))) => return Err(unavailable("marker pass", e)),
                    Ok(Some(Ok(m))) => {
                        let info = m.info().map_err(|e| unavailable("marker pass", e))?;
                        let at = SystemTime::from(info.published);
                        let (rev, pending) = (info.stream_sequence, info.pending);
                        if m.headers.as_ref().is_some_and(is_marker)
                            && at <= before
                            && let Some(key) = m.subject.strip_prefix(&o.prefix)
                        {
                            out.push(Entry {
                                key: key.to_owned(),
                                value: Bytes::new(),
                                revision: rev,
                                written_at: at,
                                removed: true,
                            });
                        }
                        done = pending == 0;
                    }
                }
            }
            self.retire(
                &o,
                Pass {
                    msgs,
                    consumer_name,
                },
            );
            Ok(out)
        })
    }

    fn watch<'a>(
        &'a self,
        bucket: Bucket,
        filter: Option<&'a str>,
    ) -> BoxFuture<'a, KvResult<Watch>> {
        Box::pin(async move { self.watch_in(self.bucket(bucket)?.clone(), filter).await })
    }

    fn age(&self, bucket: Bucket) -> Option<Duration> {
        self.buckets.get(&bucket).and_then(|o| o.age)
    }

    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

impl NatsKv {
    /// A named bucket opened here, or adopted as it is on first use: a
    /// bucket another node (or an older catalogue) created is served
    /// without being rewritten.
    async fn named(&self, name: &BucketName) -> NamedResult<Arc<Opened>> {
        if let Some(o) = self.named.lock().expect("named lock").get(name) {
            return Ok(o.clone());
        }
        let stream = match self.js.get_stream(format!("KV_{name}")).await {
            Ok(s) => s,
            Err(e) if is_stream_not_found(&e) => return Err(NamedError::NoBucket(name.clone())),
            Err(e) => return Err(unavailable("open bucket", e).into()),
        };
        let o = Arc::new(Opened::new(name.to_string(), stream));
        self.named
            .lock()
            .expect("named lock")
            .insert(name.clone(), o.clone());
        Ok(o)
    }

    async fn named_write(
        &self,
        bucket: &BucketName,
        key: &str,
        value: Bytes,
        removed: bool,
        expect: Expect,
    ) -> NamedWrite {
        let o = self.named(bucket).await?;
        Ok(self.publish_to(&o, key, value, removed, expect).await?)
    }
}

impl NamedKv for NatsKv {
    fn open<'a>(&'a self, spec: &'a NamedSpec) -> BoxFuture<'a, Result<(), OpenError>> {
        Box::pin(async move {
            let config = kv::Config {
                bucket: spec.name.to_string(),
                description: spec.description.clone(),
                history: i64::from(spec.history.max(1)),
                max_age: spec.age.unwrap_or_default(),
                max_bytes: i64::try_from(spec.max_bytes).unwrap_or(i64::MAX),
                max_value_size: i32::try_from(spec.max_value_size).unwrap_or(i32::MAX),
                num_replicas: spec.replicas,
                storage: stream::StorageType::File,
                ..Default::default()
            };
            let stream = open_reachable(&self.js, config, spec.existing).await?;
            self.named.lock().expect("named lock").insert(
                spec.name.clone(),
                Arc::new(Opened::new(spec.name.to_string(), stream)),
            );
            Ok(())
        })
    }

    fn names(&self) -> BoxFuture<'_, NamedResult<Vec<BucketName>>> {
        Box::pin(async move {
            let mut names = self.js.stream_names();
            let mut out = Vec::new();
            while let Some(name) = names.next().await {
                let name = name.map_err(|e| unavailable("stream names", e))?;
                if let Some(b) = name
                    .strip_prefix("KV_")
                    .and_then(|b| BucketName::new(b).ok())
                {
                    out.push(b);
                }
            }
            out.sort();
            Ok(out)
        })
    }

    fn get<'a>(
        &'a self,
        bucket: &'a BucketName,
        key: &'a str,
    ) -> BoxFuture<'a, NamedResult<Option<Entry>>> {
        Box::pin(async move {
            let o = self.named(bucket).await?;
            Ok(self.leader_get(&o, key).await?)
        })
    }

    fn put<'a>(
        &'a self,
        bucket: &'a BucketName,
        key: &'a str,
        value: Bytes,
        expect: Expect,
    ) -> BoxFuture<'a, NamedWrite> {
        Box::pin(self.named_write(bucket, key, value, false, expect))
    }

    fn remove<'a>(
        &'a self,
        bucket: &'a BucketName,
        key: &'a str,
        expect: Expect,
    ) -> BoxFuture<'a, NamedWrite> {
        Box::pin(self.named_write(bucket, key, Bytes::new(), true, expect))
    }

    fn list<'a>(
        &'a self,
        bucket: &'a BucketName,
        filter: Option<&'a str>,
    ) -> BoxFuture<'a, NamedResult<Vec<Entry>>> {
        Box::pin(async move {
            let o = self.named(bucket).await?;
            Ok(self.list_in(o, filter).await?)
        })
    }

    fn watch<'a>(
        &'a self,
        bucket: &'a BucketName,
        filter: Option<&'a str>,
    ) -> BoxFuture<'a, NamedResult<Watch>> {
        Box::pin(async move {
            let o = self.named(bucket).await?;
            Ok(self.watch_in(o, filter).await?)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_page_without_a_stream_leader_is_not_trusted() {
        let page = |cluster: &str| -> InfoPage {
            serde_json::from_str(&format!(
                r#"{{"state":{{"subjects":{{"$KV.b.seat.a":1}}}},{cluster}"total":1,"offset":0,"limit":100000}}"#
            ))
            .unwrap()
        };
        assert!(page(r#""cluster":{"name":"c","leader":"n1"},"#).led());
        assert!(!page(r#""cluster":{"name":"c"},"#).led());
        assert!(!page(r#""cluster":{"name":"c","leader":""},"#).led());
        assert!(!page("").led());
    }
}
