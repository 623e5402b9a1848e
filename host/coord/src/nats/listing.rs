//! The certified listing and the watch that goes on from it (the rules are
//! in [`super`]'s docs): one ordered pass, certified against the stream
//! leader's per-subject index, the leader asked for every key the pass
//! missed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_nats::jetstream::consumer;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use super::*;

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
    /// The stream's newest sequence when the page was answered.
    #[serde(default)]
    last_seq: u64,
}

#[derive(Deserialize)]
struct InfoCluster {
    /// Absent on a server that is not part of a cluster.
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    leader: Option<String>,
}

/// Who answered an index: the stream leader, if the stream is replicated
/// across a cluster (a lone server is the only member, so any pass is on
/// its leader).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Led {
    Alone,
    By(String),
}

impl Led {
    fn serves(&self, started: &Started) -> bool {
        match self {
            Led::Alone => true,
            Led::By(leader) => started.member.as_deref() == Some(leader.as_str()),
        }
    }
}

/// The leader's per-subject index of a listing.
struct Index {
    keys: HashSet<String>,
    led: Led,
    /// The stream's newest sequence when its first page was answered.
    at: u64,
}

/// A certified listing: every key it answered with (live records and
/// markers, at the newest revision read), the pass that read it, and the
/// sequence after which a watch going on from it must read every change.
struct Certified {
    answered: HashMap<String, Entry>,
    pass: Pass,
    o: Arc<Opened>,
    changed_after: u64,
}

impl NatsKv {
    /// The leader's per-subject index under `filter`: the keys it names,
    /// the leader that answered its first page and the stream's newest
    /// sequence then. Refused (unavailable) when any page comes from a
    /// stream with no leader.
    async fn index(&self, o: &Opened, filter: &str) -> KvResult<Index> {
        let mut keys = HashSet::new();
        let mut leader: Option<(Led, u64)> = None;
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
            if leader.is_none() {
                let led = match page.cluster.as_ref() {
                    Some(InfoCluster {
                        name: Some(_),
                        leader: Some(l),
                    }) => Led::By(l.clone()),
                    _ => Led::Alone,
                };
                leader = Some((led, page.state.last_seq));
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
                let (led, at) = leader.unwrap_or((Led::Alone, page.state.last_seq));
                return Ok(Index { keys, led, at });
            }
        }
    }

    pub(super) async fn leader_get(&self, o: &Opened, key: &str) -> KvResult<Option<Entry>> {
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

    pub(super) async fn ordered_pass(
        &self,
        o: &Opened,
        filter_subject: &str,
        headers_only: bool,
    ) -> KvResult<Started> {
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
        let info = c.cached_info();
        let (pending, consumer_name) = (info.num_pending, info.name.clone());
        let member = info.cluster.as_ref().and_then(|c| c.leader.clone());
        let msgs = c
            .messages()
            .await
            .map_err(|e| unavailable("listing consumer", e))?;
        Ok(Started {
            pass: Pass {
                msgs,
                consumer_name,
            },
            pending,
            member,
        })
    }

    /// A pass on the stream leader, if one of [`PLACEMENT_ATTEMPTS`] asks
    /// lands there; answers whether it did.
    async fn pass_on_leader(
        &self,
        o: &Arc<Opened>,
        filter_subject: &str,
        first: Started,
        led: &Led,
    ) -> KvResult<(Started, PassSeen)> {
        let mut started = first;
        let mut placements = 1;
        while !led.serves(&started) && placements < PLACEMENT_ATTEMPTS {
            self.retire(o, started.pass);
            started = self.ordered_pass(o, filter_subject, false).await?;
            placements += 1;
        }
        let seen = PassSeen {
            consumer: started.pass.consumer_name.clone(),
            on_leader: led.serves(&started),
            placements,
        };
        Ok((started, seen))
    }

    /// The certified listing.
    async fn certified(&self, o: Arc<Opened>, filter: Option<&str>) -> KvResult<Certified> {
        let filter_subject = filter_subject(&o, filter);
        // The index request runs beside the pass so their round trips overlap.
        let index_fut = self.index(&o, &filter_subject);
        let pass_fut = self.ordered_pass(&o, &filter_subject, false);
        // The consumer is asked for first, so its deliveries start while the
        // broker builds the index answer.
        let (pass, index) = futures::join!(pass_fut, index_fut);
        let Index {
            keys: index,
            led,
            at: indexed_at,
        } = index?;
        let (started, seen) = self
            .pass_on_leader(&o, &filter_subject, pass?, &led)
            .await?;
        let on_leader = seen.on_leader;
        let Started {
            pass: Pass {
                mut msgs,
                consumer_name,
            },
            pending,
            ..
        } = started;
        if let Ok(hook) = PASS_STARTED.try_with(Arc::clone) {
            hook(seen).await;
        }
        let mut delivered: HashMap<String, Entry> = HashMap::new();
        // The newest sequence the pass delivered; it delivers in order.
        let mut passed: Option<u64> = None;
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
                    passed = Some(rev);
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
        // marker is the leader's to answer; every key, if a follower served
        // the pass.
        let reread: Vec<String> = index
            .iter()
            .filter(|k| !on_leader || delivered.get(*k).is_none_or(|e| e.removed))
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
        // Every change after the pass's last delivery, or after the index,
        // whichever came first, is one the answer may not hold: a key the
        // pass delivered holds every revision up to `passed`, a key only
        // the index named was read from the leader after `indexed_at`, and
        // a key neither named had no revision up to `indexed_at`.
        let changed_after = passed.map_or(indexed_at, |p| p.min(indexed_at));
        Ok(Certified {
            answered: delivered,
            pass: Pass {
                msgs,
                consumer_name,
            },
            o,
            changed_after,
        })
    }

    /// The certified listing's live records.
    pub(super) async fn list_in(
        &self,
        o: Arc<Opened>,
        filter: Option<&str>,
    ) -> KvResult<Vec<Entry>> {
        let Certified {
            answered, pass, o, ..
        } = self.certified(o, filter).await?;
        self.retire(&o, pass);
        Ok(answered.into_values().filter(|e| !e.removed).collect())
    }

    /// The certified listing, then the changes after it from a pull
    /// consumer that starts where the answer may be behind.
    ///
    /// The changes are pulled a bounded batch at a time ([`watch_batch`]):
    /// a watcher slower than the bucket's writes keeps its backlog on the
    /// broker. The listing's pass is a flow-controlled push consumer, which
    /// lets 32 MiB sit in this process per consumer — fine for one listing
    /// at a time, not for a watch that lives as long as its reader (a
    /// module's eight slow watches held 170 MiB of a 48 MiB burst).
    pub(super) async fn watch_in(&self, o: Arc<Opened>, filter: Option<&str>) -> KvResult<Watch> {
        let Certified {
            answered,
            pass,
            o,
            changed_after,
        } = self.certified(o, filter).await?;
        self.retire(&o, pass);
        let msgs = self
            .changes_after(&o, &filter_subject(&o, filter), changed_after)
            .await?;
        let seen: HashMap<String, u64> = answered
            .iter()
            .map(|(k, e)| (k.clone(), e.revision))
            .collect();
        let mut initial: Vec<Entry> = answered.into_values().filter(|e| !e.removed).collect();
        initial.sort_by(|a, b| a.key.cmp(&b.key));
        // The changes start no later than the answer may be behind, so none
        // falls between the two; a revision no newer than the one the
        // answer holds is not passed on.
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

    /// Every change under `filter_subject` after stream sequence `after`,
    /// from an ordered pull consumer a task keeps pulling from as a push
    /// consumer would deliver — so a change is read while it is stored,
    /// not coalesced away by a later one — but never more than a window
    /// ahead of the reader. The task ends with the reader.
    ///
    /// Handed back only once the broker holds one of the consumer's pull
    /// requests (or the consumer has read something): a pull consumer reads
    /// the stream only while a request stands, and a bucket keeps one
    /// revision per key, so a key written twice before the first request
    /// arrived lost its first revision for good. The first request leaves
    /// from the task, two task hops after the consumer exists; a fresh-clone
    /// CI run wrote `put alice, put bob, remove alice` in that gap and the
    /// watch delivered only the last two. A consumer whose first request
    /// does not stand within [`WATCH_PULL_EXPIRES`] (lost on a cluster) is
    /// replaced, up to [`STAND_ATTEMPTS`] times; then the watch is
    /// unavailable.
    async fn changes_after(
        &self,
        o: &Opened,
        filter_subject: &str,
        after: u64,
    ) -> KvResult<Changes> {
        let mut why = String::new();
        for _ in 0..STAND_ATTEMPTS {
            let (name, changes) = self.changes_consumer(o, filter_subject, after).await?;
            match pull_stands(o, &name).await {
                Ok(()) => return Ok(changes),
                Err(e) => {
                    why = e;
                    drop(changes);
                    let stream = o.stream.clone();
                    tokio::spawn(async move {
                        let _ = stream.delete_consumer(&name).await;
                    });
                }
            }
        }
        Err(Unavailable(format!(
            "watch consumer: none of {STAND_ATTEMPTS} consumers had a pull request standing at the broker within {WATCH_PULL_EXPIRES:?} ({why})"
        )))
    }

    /// The changes consumer, the task that pulls from it, and its name.
    async fn changes_consumer(
        &self,
        o: &Opened,
        filter_subject: &str,
        after: u64,
    ) -> KvResult<(String, Changes)> {
        let max_value = o.stream.cached_info().config.max_message_size;
        let created = o
            .stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subject: filter_subject.to_owned(),
                deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: after + 1,
                },
                replay_policy: consumer::ReplayPolicy::Instant,
                max_batch: watch_batch(max_value),
                max_expires: WATCH_PULL_EXPIRES,
                ..Default::default()
            })
            .await
            .map_err(|e| unavailable("watch consumer", e))?;
        let name = created.cached_info().name.clone();
        let mut pulled = created
            .messages()
            .await
            .map_err(|e| unavailable("watch consumer", e))?;
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    next = pulled.next() => next,
                    () = tx.closed() => return,
                };
                let Some(next) = next else { return };
                if tx.send(next).await.is_err() {
                    return;
                }
            }
        });
        let changes =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) })
                .boxed();
        Ok((name, changes))
    }

    /// Deletes a pass's consumer without waiting (the broker would reap it
    /// after its inactivity threshold, but thousands of listings a second
    /// would hit the consumer limit first).
    pub(super) fn retire(&self, o: &Arc<Opened>, pass: Pass) {
        drop(pass.msgs);
        let stream = o.stream.clone();
        tokio::spawn(async move {
            let _ = stream.delete_consumer(&pass.consumer_name).await;
        });
    }
}

/// The subject a listing or watch of `filter` reads.
fn filter_subject(o: &Opened, filter: Option<&str>) -> String {
    match filter {
        Some(f) => format!("{}{f}.>", o.prefix),
        None => format!("{}>", o.prefix),
    }
}

/// What a watch's changes consumer delivers, as its task forwards it.
type Changes = BoxStream<'static, Result<jetstream::Message, consumer::pull::OrderedError>>;

/// How many changes consumers a watch asks for before one has a pull
/// request standing at the broker.
const STAND_ATTEMPTS: u32 = 3;

/// Returns once the broker holds a pull request of `consumer` or the
/// consumer has delivered something; the failure says what was seen.
async fn pull_stands(o: &Opened, consumer: &str) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + WATCH_PULL_EXPIRES;
    let mut pause = Duration::from_millis(1);
    loop {
        let info = o
            .stream
            .consumer_info(consumer)
            .await
            .map_err(|e| format!("consumer {consumer}: {e}"))?;
        if info.num_waiting > 0 || info.delivered.consumer_sequence > 0 {
            return Ok(());
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Err(format!("consumer {consumer}: no pull request standing"));
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// How many records a watch asks for at once: what fits [`WATCH_WINDOW`]
/// at the bucket's largest value, between 2 and 256 (a bucket without a
/// value bound holds small records by design: coordination's).
fn watch_batch(max_value: i32) -> i64 {
    match u64::try_from(max_value) {
        Ok(v) if v > 0 => (WATCH_WINDOW / v).clamp(2, 256) as i64,
        _ => 256,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_batch_fits_its_window() {
        assert_eq!(watch_batch(-1), 256);
        assert_eq!(watch_batch(0), 256);
        assert_eq!(watch_batch(256 * 1024), 8);
        assert_eq!(watch_batch(64 * 1024 * 1024), 2);
        assert_eq!(watch_batch(100), 256);
    }

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
