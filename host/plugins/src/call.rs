//! One way into a guest: [`Guard::call`], and the threads guest code runs on.
//!
//! Every call of every world goes through the same steps, in this order:
//! 1. **the breaker** ([`crate::breaker`]): a quarantined plugin is refused
//!    at once, without running ([`CallError::Quarantined`]);
//! 2. **the plugin's concurrency bound** (`limits.concurrency`, capped by
//!    the host): a free slot is taken at once, else a call waits at most
//!    its own deadline for one, then [`CallError::Busy`] — one plugin can
//!    hold at most its share;
//! 3. **the guest threads** ([`Guests`]): a call starts on the caller's
//!    thread and stays there only until it first waits — a tick's yield or
//!    a host call's I/O — then the rest of it moves to the plugin host's own
//!    threads, under its deadline's timer, counted from the call's start
//!    (the timer covers host calls; the tick budget covers guest code,
//!    [`crate::sandbox`]). A call done within its first tick (every healthy
//!    verify, parse or tool call) costs no hand-off, no timer and no
//!    lowered priority; a guest that spins holds an I/O thread for at most
//!    one tick, then competes only on the guest threads;
//! 4. **settling**: the result or a typed fault with who is to blame
//!    ([`crate::fault::Blame`]), recorded in the plugin's health (only the
//!    guest's faults count towards its breaker: a deadline that cut a call
//!    waiting on the host or a vendor is the host's,
//!    [`crate::whereabouts::Whereabouts`]), and what the guest wrote to stderr
//!    said in the log ([`crate::voice`]). A store whose call failed is
//!    dropped, never re-entered.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};
use wasmtime::Store;

use crate::breaker::{Admission, BreakerPolicy, Health};
use crate::fault::{Blame, CallError, Fault};
use crate::manifest::Kind;
use crate::manifest::MAX_CONCURRENCY;
use crate::sandbox::Sandbox;
use crate::scrub::Scrub;
use crate::voice::Speaker;
use crate::whereabouts::Whereabouts;

/// Where guest code runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestThreads {
    /// On the caller's runtime (the node's I/O workers), yielding every
    /// tick. Kept for measurement (`BENCHMARKS.md`), not for production.
    Shared,
    /// Started on the caller's thread, moved at its first wait to a runtime
    /// of this many threads of its own, at a lowered scheduling priority,
    /// yielding every tick.
    Dedicated(usize),
}

impl GuestThreads {
    /// The default: a dedicated runtime with as many threads as cores (at
    /// least two).
    pub fn default_dedicated() -> GuestThreads {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        GuestThreads::Dedicated(cores.max(2))
    }
}

/// The niceness of the guest threads: under contention the node's own
/// threads (HTTP, the stream, SQLite) are served first.
const GUEST_NICE: i32 = 10;

/// The threads guest code runs on.
pub(crate) struct Guests {
    runtime: Option<tokio::runtime::Runtime>,
}

impl Guests {
    pub(crate) fn new(threads: GuestThreads) -> std::io::Result<Guests> {
        let runtime = match threads {
            GuestThreads::Shared => None,
            GuestThreads::Dedicated(n) => Some(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(n.max(1))
                    .thread_name("plugin-guest")
                    // Every call arrives from outside this runtime (the
                    // injection queue); checking it on every scheduling
                    // step makes a new call wait for at most the tick of a
                    // spinning guest, not for dozens of them.
                    .global_queue_interval(1)
                    .on_thread_start(|| {
                        if let Err(e) = crewlet_os::lower_thread_priority(GUEST_NICE) {
                            tracing::debug!("guest thread keeps its priority: {e}");
                        }
                    })
                    .enable_all()
                    .build()?,
            ),
        };
        Ok(Guests { runtime })
    }

    /// Runs `task` here until it first waits, then on the guest threads
    /// (all of it here, when shared), and waits for it for at most
    /// `deadline` in all. `Ok(Err(blame))` is a task the deadline cut, and
    /// who the cut is charged to — read from `whereabouts` while the task
    /// still stands (dropping it ends the host's waits it was in); `Err`
    /// carries why it never finished (the runtime went away, or host code
    /// panicked).
    ///
    /// The first poll needs no timer: guest code yields at its first
    /// tick, and a host call that waits makes the task pending, so a
    /// task still running past its first poll is where the deadline's
    /// timer starts (from the call's start). A healthy call never
    /// registers one.
    async fn run<T: Send + 'static>(
        &self,
        task: impl Future<Output = T> + Send + 'static,
        deadline: Duration,
        whereabouts: Arc<Whereabouts>,
    ) -> Result<Result<T, Blame>, String> {
        let until = tokio::time::Instant::now() + deadline;
        let mut task = Box::pin(task);
        let first = std::future::poll_fn(|cx| match task.as_mut().poll(cx) {
            std::task::Poll::Ready(value) => std::task::Poll::Ready(Some(value)),
            std::task::Poll::Pending => std::task::Poll::Ready(None),
        })
        .await;
        if let Some(value) = first {
            return Ok(Ok(value));
        }
        let rest = async move {
            match tokio::time::timeout_at(until, &mut task).await {
                Ok(value) => Ok(value),
                Err(_) => Err(whereabouts.blame_for_cut()),
            }
        };
        match &self.runtime {
            None => Ok(rest.await),
            Some(rt) => rt.spawn(rest).await.map_err(|e| e.to_string()),
        }
    }
}

impl Drop for Guests {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which panics inside an async context;
        // the guest tasks are abandoned (their stores dropped) instead.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// A plugin's way in: its health and breaker, its concurrency bound, the
/// guest threads, and its voice in the log ([`crate::voice`]).
pub(crate) struct Guard {
    plugin: String,
    speaker: Arc<Speaker>,
    health: Health,
    permits: Arc<Semaphore>,
    concurrency: u32,
    guests: Arc<Guests>,
}

impl Guard {
    pub(crate) fn new(
        plugin: &str,
        kind: Kind,
        concurrency: u32,
        breaker: BreakerPolicy,
        guests: Arc<Guests>,
    ) -> Guard {
        let concurrency = concurrency.clamp(1, MAX_CONCURRENCY);
        Guard {
            plugin: plugin.to_string(),
            speaker: Arc::new(Speaker::new(plugin, kind)),
            health: Health::new(plugin, breaker),
            permits: Arc::new(Semaphore::new(concurrency as usize)),
            concurrency,
            guests,
        }
    }

    pub(crate) fn health(&self) -> &Health {
        &self.health
    }

    /// The plugin's voice, shared by all its instances.
    pub(crate) fn speaker(&self) -> Arc<Speaker> {
        self.speaker.clone()
    }

    /// A slot under the plugin's concurrency bound: at once when one is
    /// free (no timer), else within `deadline`; `None` when none came.
    async fn permit(&self, deadline: Duration) -> Option<OwnedSemaphorePermit> {
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(TryAcquireError::Closed) => None,
            Err(TryAcquireError::NoPermits) => {
                tokio::time::timeout(deadline, self.permits.clone().acquire_owned())
                    .await
                    .ok()?
                    .ok()
            }
        }
    }

    /// Runs `f` with `store` under every rule of the module docs. `f` owns
    /// the store for the call and hands it back with the guest's result;
    /// on `Ok` the store may be reused, on `Err` it is gone.
    pub(crate) async fn call<W, R, F, Fut>(
        &self,
        mut store: Store<Sandbox<W>>,
        deadline: Duration,
        scrub: &Scrub,
        f: F,
    ) -> Result<(Store<Sandbox<W>>, R), CallError>
    where
        W: Send + 'static,
        R: Send + 'static,
        F: FnOnce(Store<Sandbox<W>>) -> Fut + Send + 'static,
        Fut: Future<Output = (Store<Sandbox<W>>, wasmtime::Result<R>)> + Send + 'static,
    {
        if let Admission::Refused { retry_after } = self.health.admit(deadline) {
            return Err(CallError::Quarantined {
                plugin: self.plugin.clone(),
                retry_after,
            });
        }
        let Some(permit) = self.permit(deadline).await else {
            self.health.record_refused();
            return Err(CallError::Busy {
                plugin: self.plugin.clone(),
                concurrency: self.concurrency,
            });
        };
        Sandbox::prepare(&mut store, deadline, scrub);
        let voice = store.data().voice.clone();
        let whereabouts = store.data().whereabouts();
        let task = async move {
            let _slot = permit;
            f(store).await
        };
        let started = std::time::Instant::now();
        let ran = self.guests.run(task, deadline, whereabouts).await;
        self.health.record_took(started.elapsed());
        let (fault, blame) = match ran {
            Ok(Ok((store, Ok(value)))) => {
                self.health.record_ok();
                voice.settle(true);
                return Ok((store, value));
            }
            Ok(Ok((mut store, Err(error)))) => (
                store.data_mut().classify(&error, deadline, scrub),
                Blame::Guest,
            ),
            Ok(Err(blame)) => (Fault::Timeout { deadline }, blame),
            Err(lost) => (
                Fault::Trap {
                    reason: format!("the call was lost: {lost}"),
                },
                Blame::Host,
            ),
        };
        self.health.record_fault(&fault, blame);
        voice.settle(false);
        Err(CallError::Fault {
            plugin: self.plugin.clone(),
            fault,
            blame,
        })
    }
}

/// Idle instances of one plugin whose last call succeeded, ready for reuse.
pub(crate) struct IdleInstances<W: 'static, B> {
    slots: Mutex<Vec<(Store<Sandbox<W>>, B)>>,
    keep: usize,
}

impl<W: 'static, B> IdleInstances<W, B> {
    pub(crate) fn new(keep: usize) -> Self {
        IdleInstances {
            slots: Mutex::new(Vec::new()),
            keep,
        }
    }

    pub(crate) fn take(&self) -> Option<(Store<Sandbox<W>>, B)> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }

    pub(crate) fn give_back(&self, slot: (Store<Sandbox<W>>, B)) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if slots.len() < self.keep {
            slots.push(slot);
        }
    }

    pub(crate) fn clear(&self) {
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}
