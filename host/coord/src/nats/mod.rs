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
//! - The pass runs on the stream leader. The broker places a pass's
//!   consumer on any replica (measured: 18 of 30 on followers), and a
//!   follower that has not applied an acknowledged write yet delivers the
//!   key's previous revision, which the index, naming keys and not
//!   revisions, cannot catch (a fresh-clone CI run listed a record one
//!   write behind a replace it had just seen acknowledged). A consumer
//!   placed elsewhere is retired and asked for again, up to
//!   [`PLACEMENT_ATTEMPTS`]; a pass that still runs on a follower has
//!   every key it delivered read again from the leader.
//! - A watch is the certified listing, then an ordered *pull* consumer of
//!   every change after the point the answer may be behind, a bounded
//!   batch at a time ([`WATCH_WINDOW`]). A push consumer lets the broker
//!   run 32 MiB ahead of its reader; a module's eight slow watches held
//!   170 MiB of a burst in the node (a fresh-clone CI run). Its pulls are
//!   short ([`WATCH_PULL_EXPIRES`]) so a lost one is noticed in seconds.
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
//! - A lease's liveness is judged on the broker's clock ([`clock`]), never
//!   this node's: [`Kv::broker_now`]. [`Kv::now`] is the node's wall clock,
//!   for what the design judges on the reader's own clock.
//! - Buckets that exist are adopted, never reconfigured — except a named
//!   bucket whose owner's spec differs from it ([`crate::named`]), served
//!   by the same primitives as the coordination buckets.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer, kv, stream};
use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;

use crate::bucket::{Bucket, Retentions};
use crate::kv::{Change, Conflict, Entry, Expect, Kv, KvResult, Unavailable, Watch, WriteResult};
use crate::memory::{Clock, SystemClock};
use crate::named::{
    BucketName, Existing, NamedError, NamedKv, NamedOpened, NamedResult, NamedSpec, NamedUsage,
    NamedWrite, Refused,
};
use crate::open::OpenError;

pub mod clock;
mod listing;
mod named;

/// A pass that goes this long without a delivery, after the index answered,
/// is ended (the broker's own idle interval for this kind of consumer).
pub const QUIET: Duration = Duration::from_secs(5);

/// The bytes of changes a watch asks the broker for at once. The client
/// asks again when half a batch is left, so a watch holds at most one and
/// a half windows in this process however far its reader falls behind.
pub const WATCH_WINDOW: u64 = 2 * 1024 * 1024;

/// How long one of a watch's pull requests stands; the broker's idle
/// heartbeat on it is half this, and the client recreates the consumer
/// (from the last sequence it read) after two heartbeats missed. A pull
/// request can be lost: on a cluster, the first one sent right after the
/// consumer is created can reach a server that does not yet know where the
/// consumer lives, and nothing answers it. With the client's default (30 s
/// pulls, 15 s heartbeats) such a watch heard nothing for 30 s (a
/// fresh-clone CI run: no change within 10 s on the 3-node cluster); with
/// this, ~2 s. An idle watch costs one pull request and two heartbeats
/// every two seconds.
pub const WATCH_PULL_EXPIRES: Duration = Duration::from_secs(2);

/// What [`PASS_STARTED`] runs, given what the listing knows of its pass.
#[doc(hidden)]
pub type PassHook = Arc<dyn Fn(PassSeen) -> BoxFuture<'static, ()> + Send + Sync>;

/// A started pass, as [`PASS_STARTED`] sees it.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct PassSeen {
    /// The pass's consumer.
    pub consumer: String,
    /// Whether the listing found it on the stream leader.
    pub on_leader: bool,
    /// Consumers asked for, this one included.
    pub placements: u32,
}

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

/// How many times a listing asks for its pass's consumer before it takes
/// one on a follower (and reads what it delivered again from the leader).
/// Each try lands on the leader with a chance of one in the replica count.
pub const PLACEMENT_ATTEMPTS: u32 = 6;

/// A listing pass's consumer.
struct Pass {
    msgs: consumer::push::Ordered,
    consumer_name: String,
}

/// A pass just started: its consumer, what it has to deliver, and the
/// member serving it.
struct Started {
    pass: Pass,
    pending: u64,
    member: Option<String>,
}

/// One opened bucket.
struct Opened {
    name: String,
    stream: stream::Stream,
    prefix: String,
    age: Option<Duration>,
    /// The clock of the server that stamps this bucket's writes.
    clock: clock::BrokerClock,
}

/// The JetStream KV backend, on the node's one connection.
pub struct NatsKv {
    js: jetstream::Context,
    /// This node's wall clock ([`Kv::now`]).
    wall: Arc<dyn Clock>,
    buckets: HashMap<Bucket, Arc<Opened>>,
    /// Buckets opened (or adopted on first use) by name.
    named: Mutex<HashMap<BucketName, Arc<Opened>>>,
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
            clock: clock::BrokerClock::default(),
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
                let stream = open_reachable(js, config).await?;
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
            wall: Arc::new(SystemClock),
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
            wall: Arc::new(SystemClock),
            buckets: HashMap::new(),
            named: Mutex::default(),
        }
    }

    /// The same backend with another wall clock for this node: tests stand
    /// in a node whose clock is wrong (the process-wide way is
    /// `crewlet_os::TEST_CLOCK_OFFSET_ENV`).
    pub fn with_wall_clock(mut self, wall: Arc<dyn Clock>) -> NatsKv {
        self.wall = wall;
        self
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
}

fn is_marker(h: &HeaderMap) -> bool {
    matches!(
        h.get(KV_OPERATION).map(|v| v.as_str()),
        Some("DEL") | Some("PURGE")
    )
}

/// Adopts the bucket `config` names, or creates it with `config` if absent;
/// true when this call created it.
async fn open_bucket(
    js: &jetstream::Context,
    config: &kv::Config,
) -> Result<(stream::Stream, bool), OpenError> {
    let name = config.bucket.as_str();
    let err = |why: String| OpenError::Bucket {
        bucket: name.to_owned(),
        why,
    };
    let stream_name = format!("KV_{name}");
    let mut last_create_error = String::new();
    let mut created = false;
    for attempt in 0..5u32 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
        }
        match js.get_stream(&stream_name).await {
            Ok(s) => return Ok((s, created)),
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
            Ok(_) => created = true,
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
    let stream = js
        .get_stream(&stream_name)
        .await
        .map_err(|e| err(format!("{e} (last create attempt: {last_create_error})")))?;
    Ok((stream, created))
}

/// Waits until a write through this connection reaches the bucket (see
/// [`crate::reach`]).
async fn until_reachable(js: &jetstream::Context, name: &str) -> Result<(), OpenError> {
    crate::reach::until_writable(
        js,
        &format!("KV_{name}"),
        &format!("$KV.{name}.{REACH_PROBE_KEY}"),
        crate::reach::REACH_WITHIN,
    )
    .await
    .map_err(|e| OpenError::Unreachable(Box::new(e)))
}

/// Adopts (or creates) the bucket, then waits until it is reachable.
async fn open_reachable(
    js: &jetstream::Context,
    config: kv::Config,
) -> Result<stream::Stream, OpenError> {
    let (stream, _) = open_bucket(js, &config).await?;
    until_reachable(js, &config.bucket).await?;
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
            let Started {
                pass:
                    Pass {
                        mut msgs,
                        consumer_name,
                    },
                pending,
                ..
            } = self
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
        self.wall.now()
    }

    fn broker_now<'a>(&'a self, bucket: Bucket) -> BoxFuture<'a, KvResult<SystemTime>> {
        Box::pin(async move { self.broker_now_in(self.bucket(bucket)?).await })
    }
}
