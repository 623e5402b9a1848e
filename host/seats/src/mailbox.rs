//! A held seat's attached mailbox: fetch wakes, group them, run turns, settle.
//!
//! Rules:
//! - An idle mailbox sends no pull request: a core subscription on its
//!   inbox subject (the doorbell) hears every wake published to it, and a
//!   fetch follows a ring, a turn retried after a delay, a return to
//!   admitting, a batch that brought work, a request that brought nothing
//!   while the consumer holds wakes delivered elsewhere (a previous
//!   holder's, redelivered when their ack wait lapses), and the node's
//!   sweep finding work in this mailbox that no ring announced
//!   ([`crate::sweep`]). A pull request per seat per second was most of
//!   what 2,000 idle seats cost (15 % of a core, node and nats-server
//!   together). Without a doorbell (its subscription refused) the mailbox
//!   pulls back to back as before.
//! - Fetch only while the lease holder is admitting. A wake that arrives
//!   when it is not (stale, or detaching) is handed back at once (nak), so
//!   it waits in the stream for whoever may act — never on a node that may
//!   not.
//! - Wakes of one conversation arriving within the batch window run as one
//!   turn; a lone wake (no conversation) runs alone. One conversation's
//!   turns run strictly in order; different conversations run side by side,
//!   all under the node-wide turn limit.
//! - A wake waiting for its turn, and every wake of a running turn, gets an
//!   in-progress ack at half the consumer's ack wait, so a long turn is not
//!   delivered a second time to somebody else; one conversation's wakes
//!   lapse together ([`crate::progress`]), so a dead holder's thread comes
//!   back to the next one as one batch.
//! - The verdict settles every wake of the turn: done → ack (confirmed by
//!   the server), retry → nak with delay, poison → term, park → nak, and
//!   the seat's park gate shuts ([`crate::park`]): nothing is fetched or
//!   launched until its budget has room. A message that is
//!   not a wake for this seat is terminated with a log line: a bad message
//!   never blocks the mailbox.
//! - Detach: stop fetching, drain the pull request already sent (naking what
//!   it brings), hand back what waits, let running turns finish within a
//!   bound, then cancel the rest and hand their wakes back.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::consumer::pull::Batch as PullBatch;
use async_nats::jetstream::{AckKind, Message};
use crewlet_bus::Wake;
use crewlet_company::{Active, ActiveCompany};
use crewlet_coord::{Admits, Fence, Standing};
use futures::StreamExt;
use tokio::sync::{Semaphore, watch};
use tokio::task::{Id, JoinSet};
use tokio::time::{Instant, sleep_until};
use tracing::{debug, info, warn};

use crate::host::{Batch, SeatHost, SeatSpec, TurnVerdict};
use crate::park::ParkGate;
use crate::progress::{self, Clock};

/// Most wakes one turn takes; the rest wait for the next turn of the
/// same conversation.
const MAX_WAKES_PER_TURN: usize = 64;
/// The server's ack wait when a consumer does not name one.
const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);

/// Everything a turn of one seat needs, shared by its turns.
pub(crate) struct SeatCtx<H: SeatHost> {
    pub host: Arc<H>,
    pub spec: Arc<SeatSpec>,
    pub equipped: Arc<H::Equipped>,
    pub fence: Fence,
    pub active: ActiveCompany,
    pub turns: Arc<Semaphore>,
    pub in_flight: Arc<AtomicUsize>,
    /// False while the node sheds: nothing new is taken off the mailbox.
    pub admission: watch::Receiver<bool>,
    /// The fleet's paused seats (see [`crate::SeatsConfig::pauses`]).
    pub pauses: watch::Receiver<Option<crate::Pauses>>,
    /// What the node's mailbox sweep found ([`crate::sweep`]).
    pub swept: watch::Receiver<Arc<crate::sweep::Swept>>,
}

impl<H: SeatHost> SeatCtx<H> {
    /// Whether this seat is paused now, or its pauses unknown.
    pub fn paused(&self) -> bool {
        !crate::admits(&self.pauses.borrow(), self.spec.handle.as_str())
    }
}

/// How the mailbox paces itself.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pace {
    pub batch_window: Duration,
    pub fetch_expiry: Duration,
    pub drain_bound: Duration,
    pub max_outstanding: usize,
    /// Delay of a wake handed back because no company is active.
    pub retry_without_company: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum ConvKey {
    Thread(String),
    Lone(u64),
}

struct Waiting {
    msg: Message,
    wake: Wake,
    seq: u64,
}

#[derive(Default)]
struct Conv {
    queue: Vec<Waiting>,
    /// When the queued wakes are due (the batch window of the first).
    due: Option<Instant>,
    running: bool,
}

struct Mailbox<H: SeatHost> {
    ctx: Arc<SeatCtx<H>>,
    pace: Pace,
    progress: Clock,
    convs: HashMap<ConvKey, Conv>,
    turns: JoinSet<Ended>,
    /// The messages of each running turn, to hand back if it is cancelled.
    running: HashMap<Id, (ConvKey, Vec<Message>)>,
    /// Shut while the seat's budget has no room.
    park: ParkGate,
}

/// Serves `consumer` until `detach` turns true (or its sender is dropped),
/// then detaches as the module doc says. Returns when nothing of this
/// seat's mailbox is running any more.
pub(crate) async fn serve<H: SeatHost>(
    ctx: Arc<SeatCtx<H>>,
    pace: Pace,
    consumer: PullConsumer,
    mut doorbell: Option<async_nats::Subscriber>,
    mut state: watch::Receiver<Standing>,
    mut detach: watch::Receiver<bool>,
) {
    let ack_wait = match consumer.cached_info().config.ack_wait {
        d if d.is_zero() => DEFAULT_ACK_WAIT,
        d => d,
    };
    let mut mb = Mailbox {
        ctx,
        pace,
        progress: Clock::new(ack_wait),
        convs: HashMap::new(),
        turns: JoinSet::new(),
        running: HashMap::new(),
        park: ParkGate::default(),
    };
    let handle = mb.ctx.spec.handle.clone();
    let mut batch: Option<PullBatch> = None;
    // When the current pull request was sent, and whether it brought anything.
    let mut pulled_at = Instant::now();
    let mut pulled_any = false;
    let mut fetch_paused_until: Option<Instant> = None;
    // When the next fetch is due: now at attach, after a ring, a sweep that
    // found work, a batch that brought work, an empty one while wakes are
    // held elsewhere, or a return to admitting; a retried turn's delay;
    // never otherwise (with a doorbell).
    let mut fetch_due = Some(Instant::now());
    let subject = consumer.cached_info().config.filter_subject.clone();
    let mut swept = mb.ctx.swept.clone();
    let mut detaching = *detach.borrow();
    let mut admission = mb.ctx.admission.clone();
    let mut pauses = mb.ctx.pauses.clone();
    let mut company = mb.ctx.active.subscribe();
    let mut progress = mb.progress.ticks();
    loop {
        let admitting = !detaching
            && state.borrow().admits == Admits::Yes
            && *admission.borrow()
            && !mb.ctx.paused()
            && !mb.park.is_shut();
        if admitting {
            mb.launch_due();
        }
        let now = Instant::now();
        let paused = fetch_paused_until.is_some_and(|t| t > now);
        let room = pace.max_outstanding.saturating_sub(mb.outstanding());
        let waiting_to_fetch = batch.is_none() && admitting && !paused && room > 0;
        if waiting_to_fetch && fetch_due.is_some_and(|t| t <= now) {
            match fetch(&consumer, room, pace.fetch_expiry).await {
                Ok(b) => {
                    batch = Some(b);
                    pulled_at = Instant::now();
                    pulled_any = false;
                    fetch_due = doorbell.is_none().then_some(pulled_at);
                }
                Err(why) => {
                    warn!(subsystem = "seats", seat = %handle, error = %why,
                        "cannot fetch from the mailbox; trying again shortly");
                    fetch_paused_until = Some(Instant::now() + pace.fetch_expiry);
                }
            }
        }
        if detaching && batch.is_none() {
            break;
        }
        let next_due = if admitting { mb.next_due() } else { None };
        let ask_park = mb.park.ask_at().filter(|_| !detaching);
        tokio::select! {
            r = detach.changed(), if !detaching => {
                if r.is_err() || *detach.borrow() {
                    detaching = true;
                }
            }
            r = state.changed(), if !detaching => {
                if r.is_err() {
                    detaching = true;
                }
                fetch_due = Some(Instant::now());
            }
            // A dropped gate leaves the last word standing.
            Ok(()) = admission.changed(), if !detaching => fetch_due = Some(Instant::now()),
            Ok(()) = pauses.changed(), if !detaching => fetch_due = Some(Instant::now()),
            Ok(()) = company.changed(), if !detaching => mb.park.company_changed(),
            () = sleep_until(ask_park.unwrap_or_else(Instant::now)), if ask_park.is_some() => {
                if mb.park.ask(&*mb.ctx.host, &mb.ctx.spec, &mb.ctx.active).await {
                    fetch_due = Some(Instant::now());
                }
            }
            Ok(()) = swept.changed(), if !detaching => {
                if swept.borrow_and_update().wants(&subject) {
                    fetch_due = Some(Instant::now());
                }
            }
            ring = ring(&mut doorbell), if !detaching => match ring {
                Some(()) => fetch_due = Some(Instant::now()),
                None => {
                    warn!(subsystem = "seats", seat = %handle,
                        "the mailbox's doorbell subscription ended; pulling back to back");
                    doorbell = None;
                    fetch_due = Some(Instant::now());
                }
            },
            item = next_message(&mut batch) => match item {
                Some(Ok(msg)) => {
                    let admitting = !detaching
                        && state.borrow().admits == Admits::Yes
                        && *admission.borrow()
                        && !mb.ctx.paused()
                        && !mb.park.is_shut();
                    pulled_any = true;
                    mb.on_message(msg, admitting).await;
                }
                Some(Err(e)) => {
                    warn!(subsystem = "seats", seat = %handle, error = %e,
                        "mailbox pull failed; trying again shortly");
                    batch = None;
                    fetch_paused_until = Some(Instant::now() + pace.fetch_expiry);
                }
                None => {
                    batch = None;
                    if pulled_any {
                        fetch_due = Some(Instant::now());
                    } else if fetch_due.is_none() {
                        fetch_due = held_elsewhere(&consumer, mb.outstanding(), pace.fetch_expiry).await;
                    }
                    // A request that ended empty long before its expiry is
                    // the server refusing it: pause rather than spin.
                    if !pulled_any && pulled_at.elapsed() < pace.fetch_expiry / 2 {
                        fetch_paused_until = Some(pulled_at + pace.fetch_expiry);
                    }
                }
            },
            Some(done) = mb.turns.join_next_with_id(), if !mb.turns.is_empty() => {
                if let Some(after) = mb.on_turn_end(done).await {
                    let again = Instant::now() + after;
                    fetch_due = Some(fetch_due.map_or(again, |t| t.min(again)));
                }
            }
            () = sleep_until(fetch_due.unwrap_or(now)),
                if waiting_to_fetch && fetch_due.is_some_and(|t| t > now) => {}
            () = sleep_until(next_due.unwrap_or_else(Instant::now)), if next_due.is_some() => {}
            () = sleep_until(fetch_paused_until.unwrap_or_else(Instant::now)),
                if paused && batch.is_none() => {}
            _ = progress.tick(), if !mb.convs.is_empty() => mb.progress_waiting().await,
        }
    }
    mb.detach().await;
}

async fn fetch(
    consumer: &PullConsumer,
    room: usize,
    expiry: Duration,
) -> Result<PullBatch, String> {
    let req = consumer
        .batch()
        .max_messages(room.min(256))
        .expires(expiry)
        .messages();
    match tokio::time::timeout(expiry.max(Duration::from_secs(5)), req).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the pull request was not sent in time".into()),
    }
}

/// When to fetch again after a request that brought nothing: at once while
/// the consumer holds work this mailbox was not given — delivered to a
/// previous holder (a frozen or dead node) and not acknowledged, or handed
/// back with a delay — since its redelivery rings no doorbell; never (the
/// doorbell and the sweep will say) when it holds nothing else. A consumer
/// that cannot be read is asked again after `expiry`.
async fn held_elsewhere(
    consumer: &PullConsumer,
    outstanding: usize,
    expiry: Duration,
) -> Option<Instant> {
    let info = tokio::time::timeout(expiry.max(Duration::from_secs(5)), consumer.get_info()).await;
    match info {
        Ok(Ok(i)) => (i.num_pending > 0 || i.num_ack_pending > outstanding).then(Instant::now),
        _ => Some(Instant::now() + expiry),
    }
}

/// The next ring of `doorbell`; `None` once its subscription ended.
async fn ring(doorbell: &mut Option<async_nats::Subscriber>) -> Option<()> {
    match doorbell {
        Some(d) => d.next().await.map(|_| ()),
        None => std::future::pending().await,
    }
}

async fn next_message(batch: &mut Option<PullBatch>) -> Option<Result<Message, async_nats::Error>> {
    match batch {
        Some(b) => b.next().await,
        None => std::future::pending().await,
    }
}

impl<H: SeatHost> Mailbox<H> {
    fn handle(&self) -> &str {
        self.ctx.spec.handle.as_str()
    }

    /// Wakes fetched and not yet settled.
    fn outstanding(&self) -> usize {
        self.convs.values().map(|c| c.queue.len()).sum::<usize>()
            + self.running.values().map(|(_, m)| m.len()).sum::<usize>()
    }

    fn next_due(&self) -> Option<Instant> {
        self.convs
            .values()
            .filter(|c| !c.running && !c.queue.is_empty())
            .filter_map(|c| c.due)
            .min()
    }

    async fn on_message(&mut self, msg: Message, admitting: bool) {
        let seq = match msg.info() {
            Ok(i) => i.stream_sequence,
            Err(e) => {
                warn!(subsystem = "seats", seat = %self.handle(), error = %e,
                    "a mailbox message without JetStream metadata; ignored");
                return;
            }
        };
        if !admitting {
            debug!(subsystem = "seats", seat = %self.handle(), seq,
                "wake arrived while this node may not admit work; handed back");
            nak(&msg, None).await;
            return;
        }
        let wake = match serde_json::from_slice::<Wake>(&msg.payload) {
            Ok(w) if w.handle == self.handle() => w,
            Ok(w) => {
                warn!(subsystem = "seats", seat = %self.handle(), seq, wake_handle = %w.handle,
                    "a wake for another seat in this mailbox; terminated (check the publisher's subject)");
                settle_one(&msg, AckKind::Term).await;
                return;
            }
            Err(e) => {
                warn!(subsystem = "seats", seat = %self.handle(), seq, error = %e,
                    "a mailbox message that is not a wake; terminated");
                settle_one(&msg, AckKind::Term).await;
                return;
            }
        };
        let (key, window) = match &wake.conversation {
            Some(c) => (ConvKey::Thread(c.clone()), self.pace.batch_window),
            None => (ConvKey::Lone(seq), Duration::ZERO),
        };
        let conv = self.convs.entry(key.clone()).or_default();
        if let Some(w) = conv.queue.iter_mut().find(|w| w.seq == seq) {
            // Delivered again while still waiting: answer on the newer delivery.
            w.msg = msg;
            return;
        }
        conv.queue.push(Waiting { msg, wake, seq });
        if conv.due.is_none() {
            conv.due = Some(Instant::now() + window);
        }
        let (behind_a_turn, joined) = (conv.running, conv.queue.len() > 1);
        if let (true, ConvKey::Thread(conversation)) = (behind_a_turn, &key) {
            info!(subsystem = "seats", seat = %self.handle(), seq, %conversation,
                "a wake waits for its conversation's running turn");
        }
        if behind_a_turn || joined {
            self.align(&key).await;
        }
    }

    /// Starts a turn for every conversation whose window has passed and
    /// that has no turn running.
    fn launch_due(&mut self) {
        let now = Instant::now();
        let due: Vec<ConvKey> = self
            .convs
            .iter()
            .filter(|(_, c)| !c.running && !c.queue.is_empty() && c.due.is_some_and(|d| d <= now))
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            let conv = self.convs.get_mut(&key).expect("due conversation");
            conv.queue.sort_by_key(|w| w.seq);
            let take = conv.queue.len().min(MAX_WAKES_PER_TURN);
            let group: Vec<Waiting> = conv.queue.drain(..take).collect();
            conv.running = true;
            conv.due = if conv.queue.is_empty() {
                None
            } else {
                Some(now)
            };
            let conversation = match &key {
                ConvKey::Thread(c) => Some(c.clone()),
                ConvKey::Lone(_) => None,
            };
            let msgs: Vec<Message> = group.iter().map(|w| w.msg.clone()).collect();
            let wakes: Vec<Wake> = group.into_iter().map(|w| w.wake).collect();
            let turn = run_turn(
                self.ctx.clone(),
                conversation,
                msgs.clone(),
                wakes,
                self.progress,
                self.pace.retry_without_company,
            );
            let id = self.turns.spawn(turn).id();
            self.running.insert(id, (key, msgs));
        }
    }

    /// Settles the books of an ended turn; answers when its wakes are due
    /// again if it handed them back.
    async fn on_turn_end(
        &mut self,
        done: Result<(Id, Ended), tokio::task::JoinError>,
    ) -> Option<Duration> {
        let id = match &done {
            Ok((id, _)) => *id,
            Err(e) => e.id(),
        };
        let (key, msgs) = self.running.remove(&id)?;
        let again = match &done {
            Ok((_, ended)) => ended.again,
            Err(_) => Some(Duration::ZERO),
        };
        // The gate shuts before the wakes go back, so none of them (nor any
        // other) is taken again until the budget has room.
        if let Ok((
            _,
            Ended {
                park: Some((after, need)),
                under,
                ..
            },
        )) = &done
        {
            self.park.shut(*after, *need);
            // A change while the turn ran (a cap raised) met an open gate:
            // ask at once under the company now.
            if !same_company(under.as_ref(), self.ctx.active.current().as_ref()) {
                self.park.company_changed();
            }
            for m in &msgs {
                nak(m, None).await;
            }
            self.hand_back_waiting().await;
        }
        if let Err(e) = done {
            // The host panicked or the turn was cancelled: the wakes were
            // not settled, so hand them back.
            warn!(subsystem = "seats", seat = %self.handle(), error = %e, wakes = msgs.len(),
                "a turn ended without a verdict; its wakes are handed back");
            for m in &msgs {
                nak(m, None).await;
            }
        }
        if let Some(conv) = self.convs.get_mut(&key) {
            conv.running = false;
            if conv.queue.is_empty() {
                self.convs.remove(&key);
            }
        }
        again
    }

    /// Hands back every wake waiting for a turn (the seat parked: they
    /// stay in the mailbox).
    async fn hand_back_waiting(&mut self) {
        let mut handed_back = 0usize;
        for conv in self.convs.values_mut() {
            for w in conv.queue.drain(..) {
                nak(&w.msg, None).await;
                handed_back += 1;
            }
            conv.due = None;
        }
        self.convs.retain(|_, c| c.running);
        if handed_back > 0 {
            info!(subsystem = "seats", seat = %self.handle(), handed_back,
                "the seat is parked on its budget; the wakes waiting for a turn stay in its mailbox");
        }
    }

    async fn progress_waiting(&self) {
        let waiting: Vec<&Message> = self
            .convs
            .values()
            .flat_map(|c| c.queue.iter().map(|w| &w.msg))
            .collect();
        progress::refresh(&waiting).await;
    }

    /// Refreshes every wake `key` holds, waiting or running, so they lapse
    /// together.
    async fn align(&self, key: &ConvKey) {
        let waiting = self
            .convs
            .get(key)
            .into_iter()
            .flat_map(|c| c.queue.iter().map(|w| &w.msg));
        let running = self
            .running
            .values()
            .filter(|(k, _)| k == key)
            .flat_map(|(_, msgs)| msgs.iter());
        let held: Vec<&Message> = waiting.chain(running).collect();
        progress::refresh(&held).await;
    }

    async fn detach(mut self) {
        let handle = self.ctx.spec.handle.clone();
        let mut handed_back = 0usize;
        for conv in self.convs.values_mut() {
            for w in conv.queue.drain(..) {
                nak(&w.msg, None).await;
                handed_back += 1;
            }
        }
        let deadline = Instant::now() + self.pace.drain_bound;
        while !self.turns.is_empty() {
            match tokio::time::timeout_at(deadline, self.turns.join_next_with_id()).await {
                Ok(Some(done)) => {
                    self.on_turn_end(done).await;
                }
                Ok(None) => break,
                Err(_) => {
                    warn!(subsystem = "seats", seat = %handle, turns = self.turns.len(),
                        bound = ?self.pace.drain_bound,
                        "turns still running at the detach bound; cancelling them and handing their wakes back");
                    self.turns.abort_all();
                    while let Some(done) = self.turns.join_next_with_id().await {
                        self.on_turn_end(done).await;
                    }
                }
            }
        }
        info!(subsystem = "seats", seat = %handle, handed_back, "mailbox detached");
    }
}

/// Counts a turn as in flight while it lives.
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn enter(n: &'a AtomicUsize) -> InFlight<'a> {
        n.fetch_add(1, Ordering::AcqRel);
        InFlight(n)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

async fn run_turn<H: SeatHost>(
    ctx: Arc<SeatCtx<H>>,
    conversation: Option<String>,
    msgs: Vec<Message>,
    wakes: Vec<Wake>,
    progress: Clock,
    retry_without_company: Duration,
) -> Ended {
    let mut under = None;
    let work = async {
        let Ok(_permit) = ctx.turns.clone().acquire_owned().await else {
            return TurnVerdict::Retry {
                after: Duration::ZERO,
                reason: "the node is shutting its turns down".into(),
            };
        };
        // Waiting for the permit may have outlived admission.
        if ctx.fence.admits() != Admits::Yes {
            return TurnVerdict::Retry {
                after: Duration::ZERO,
                reason: "the seat stopped admitting before the turn started".into(),
            };
        }
        if ctx.paused() {
            return TurnVerdict::Retry {
                after: Duration::ZERO,
                reason: "the seat was paused before the turn started".into(),
            };
        }
        let Some(active) = ctx.active.current() else {
            return TurnVerdict::Retry {
                after: retry_without_company,
                reason: "no company is active on this node".into(),
            };
        };
        let _counted = InFlight::enter(&ctx.in_flight);
        under = Some(active.clone());
        let batch = Batch {
            conversation,
            wakes,
            active,
            fence: ctx.fence.clone(),
        };
        ctx.host.run(&ctx.spec, &ctx.equipped, batch).await
    };
    let verdict = tokio::select! {
        v = work => v,
        never = progress::keep(&msgs, progress) => match never {},
    };
    let park = match &verdict {
        TurnVerdict::Park { after, need, .. } => Some((*after, *need)),
        _ => None,
    };
    Ended {
        again: settle(ctx.spec.handle.as_str(), &msgs, verdict).await,
        park,
        under,
    }
}

/// Whether two reads of the active company are the same document at the
/// same epoch.
fn same_company(a: Option<&Active>, b: Option<&Active>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.epoch == b.epoch && Arc::ptr_eq(&a.company, &b.company),
        (None, None) => true,
        _ => false,
    }
}

/// How a turn ended, for its mailbox.
struct Ended {
    /// When its wakes are due again, if it handed them back.
    again: Option<Duration>,
    /// The turn parked: ask for room after this long, for this many tokens.
    park: Option<(Duration, u64)>,
    /// The company it ran under (none: it never started).
    under: Option<Active>,
}

async fn settle(handle: &str, msgs: &[Message], verdict: TurnVerdict) -> Option<Duration> {
    match verdict {
        TurnVerdict::Done => {
            for m in msgs {
                if let Err(e) = m.double_ack().await {
                    warn!(subsystem = "seats", seat = %handle, error = %e,
                        "the server did not confirm an ack; the wake may be delivered again");
                }
            }
            None
        }
        TurnVerdict::Retry { after, reason } => {
            info!(subsystem = "seats", seat = %handle, wakes = msgs.len(), ?after, %reason,
                "turn asked to be retried");
            for m in msgs {
                nak(m, Some(after)).await;
            }
            Some(after)
        }
        // Handed back by the mailbox once its park gate is shut
        // (`Mailbox::on_turn_end`), so they wait in it for room.
        TurnVerdict::Park {
            after,
            need,
            reason,
        } => {
            info!(subsystem = "seats", seat = %handle, wakes = msgs.len(), ?after, need, %reason,
                "turn parked on the budget; its wakes stay in the mailbox");
            None
        }
        TurnVerdict::Poison { reason } => {
            warn!(subsystem = "seats", seat = %handle, wakes = msgs.len(), %reason,
                "turn poisoned; its wakes are terminated and will not be delivered again");
            for m in msgs {
                settle_one(m, AckKind::Term).await;
            }
            None
        }
    }
}

async fn nak(msg: &Message, after: Option<Duration>) {
    let after = after.filter(|d| !d.is_zero());
    settle_one(msg, AckKind::Nak(after)).await;
}

async fn settle_one(msg: &Message, kind: AckKind) {
    if let Err(e) = msg.ack_with(kind).await {
        debug!(subsystem = "seats", error = %e, "settling a mailbox message failed; it will be delivered again after the ack wait");
    }
}
