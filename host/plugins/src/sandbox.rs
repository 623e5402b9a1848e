//! What one instance's store holds: the WASI context every world shares,
//! the memory limiter, the tick budget, and the world's own part.
//!
//! Rules, and why:
//! - **Each world its own data** (`Sandbox<W>`): a webhook store holds
//!   nothing beyond WASI (`W = ()`), a provider store its HTTP context and
//!   outbound policy ([`ProviderCtx`]), a module store its issued buckets and state
//!   backend (`crate::module::ModuleCtx`). An import is implemented only
//!   for the world that has it, so no host function can find the wrong
//!   data at run time.
//! - **Nothing ambient**: no environment, arguments, stdin, sockets, name
//!   lookups or preopened directories; both clocks read zero. A manifest's
//!   `scratch = true` preopens `/scratch`, a directory private to it.
//! - **A guest yields every tick**: the epoch callback hands the thread
//!   back to the scheduler every [`EPOCH_TICK`] and counts
//!   the ticks the call has left; at zero it interrupts (a timeout). A
//!   spinning guest can therefore never hold a thread for more than a tick.
//! - **Memory cap per instance**: the limiter refuses growth past the cap
//!   and remembers it did, so the fault reads "out of memory", not the guest
//!   allocator's `unreachable`.
//! - **A transfer bound per call** (the world's `Ceiling::transfer_mib`, as
//!   wasmtime's hostcall fuel): every string and list the host lifts out of
//!   the guest is weighed before it is copied, so what an export returns or
//!   an import is handed can never cost the host more than the bound — even
//!   a list whose strings all point at one buffer.
//! - **Where a call stands is known when its deadline cuts it**
//!   ([`crate::whereabouts`]): at a tick's yield (the guest's own code was running)
//!   or inside a host call with the host's own wait in flight (a vendor
//!   over `wasi:http`, a bucket, the bus). The first is the guest's fault;
//!   the second the host's ([`Blame`]), and not counted by the breaker.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::ResourceTable;
use wasmtime::{Store, Trap, UpdateDeadline, WasmBacktrace};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::bindings::module::crewlet::plugin::log::{self, Level};
use crate::fault::Fault;
use crate::outbound::OutboundPolicy;
use crate::scrub::{MAX_PLUGIN_TEXT, Scrub};
use crate::voice::Voice;
use crate::whereabouts::Whereabouts;

/// How often the epoch advances: a guest yields its thread at least this
/// often, and a deadline is rounded up to it.
pub const EPOCH_TICK: Duration = Duration::from_millis(1);

/// Frames at the top of a trap's backtrace that, all from one or two
/// functions, mark an out-of-bounds access as the guest's own stack running
/// out (see [`Sandbox::classify`]).
const RECURSION_FRAMES: usize = 16;

/// Everything one instance's store holds; `W` is the world's own part.
pub struct Sandbox<W> {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: Limiter,
    pub(crate) voice: Voice,
    ticks_left: u64,
    transfer: usize,
    whereabouts: Arc<Whereabouts>,
    /// When the host stops waiting on the current call's behalf (see
    /// [`HostWaits::wait_for`]).
    waits_end: Instant,
    pub(crate) world: W,
}

/// A wait of the host's on a guest's behalf that was given up at the
/// margin before the call's deadline ([`HostWaits::wait_for`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OutOfTime {
    pub(crate) waited: Duration,
}

impl std::fmt::Display for OutOfTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no answer within {} ms, the time this call had left; it may or may not have taken effect",
            self.waited.as_millis()
        )
    }
}

/// The host's waits on one call's behalf (a bucket, the bus).
pub(crate) struct HostWaits {
    whereabouts: Arc<Whereabouts>,
    end: Instant,
}

impl HostWaits {
    /// Runs one wait, counted while it lasts (see [`Whereabouts`]) and given
    /// up a margin before the call's deadline. Why: a store that does not
    /// answer must reach the guest as an answer it can handle
    /// (`unavailable`), not as the deadline cutting the call — which ends
    /// the instance and, for a module, every watch it holds.
    pub(crate) async fn wait_for<T>(
        &self,
        wait: impl std::future::Future<Output = T>,
    ) -> Result<T, OutOfTime> {
        let _waiting = self.whereabouts.host_wait();
        let started = Instant::now();
        tokio::time::timeout_at(self.end.into(), wait)
            .await
            .map_err(|_| OutOfTime {
                waited: started.elapsed(),
            })
    }
}

/// What a host wait leaves of a call's deadline for the guest to handle
/// its answer: a tenth, within 20 ms..1 s.
fn wait_margin(deadline: Duration) -> Duration {
    (deadline / 10).clamp(Duration::from_millis(20), Duration::from_secs(1))
}

/// What one instance may hold and hand over: its memory cap and the most
/// bytes the host copies out of it in one call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub(crate) memory: usize,
    pub(crate) transfer: usize,
}

/// The provider world's part: `wasi:http` and the policy every request and
/// redirect hop is checked against.
pub struct ProviderCtx {
    pub(crate) http: WasiHttpCtx,
    pub(crate) outbound: OutboundPolicy,
}

impl<W: Send + 'static> WasiView for Sandbox<W> {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for Sandbox<ProviderCtx> {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.world.http,
            table: &mut self.table,
            hooks: self.world.outbound.waited_by(&self.whereabouts),
        }
    }
}

impl<W: Send + 'static> Sandbox<W> {
    pub(crate) fn new(wasi: WasiCtx, voice: Voice, bounds: Bounds, world: W) -> Self {
        Sandbox {
            wasi,
            table: ResourceTable::new(),
            limiter: Limiter {
                cap: bounds.memory,
                denied: None,
            },
            voice,
            ticks_left: 0,
            transfer: bounds.transfer,
            whereabouts: Arc::default(),
            waits_end: Instant::now(),
            world,
        }
    }

    /// Wires the limiter, the transfer bound and the yielding tick budget
    /// into `store`.
    pub(crate) fn install(store: &mut Store<Sandbox<W>>) {
        store.limiter(|s| &mut s.limiter);
        let transfer = store.data().transfer;
        store.set_hostcall_fuel(transfer);
        store.epoch_deadline_callback(|mut cx| {
            let sandbox = cx.data_mut();
            if sandbox.ticks_left == 0 {
                return Ok(UpdateDeadline::Interrupt);
            }
            sandbox.ticks_left -= 1;
            let whereabouts = sandbox.whereabouts.clone();
            whereabouts.at_tick(true);
            Ok(UpdateDeadline::YieldCustom(
                1,
                Box::pin(async move {
                    tokio::task::yield_now().await;
                    whereabouts.at_tick(false);
                }),
            ))
        });
        store.set_epoch_deadline(1);
    }

    /// Readies the store for one call of at most `deadline`, handed
    /// `scrub`'s secrets.
    pub(crate) fn prepare(store: &mut Store<Sandbox<W>>, deadline: Duration, scrub: &Scrub) {
        let sandbox = store.data_mut();
        sandbox.voice.prepare(scrub);
        sandbox.limiter.denied = None;
        sandbox.ticks_left = deadline_ticks(deadline);
        sandbox.waits_end = Instant::now() + deadline.saturating_sub(wait_margin(deadline));
        sandbox.whereabouts.at_tick(false);
        store.set_epoch_deadline(1);
    }

    /// What bounds the host's waits on this guest's behalf in the current
    /// call ([`HostWaits::wait_for`]).
    pub(crate) fn host_waits(&self) -> HostWaits {
        HostWaits {
            whereabouts: self.whereabouts.clone(),
            end: self.waits_end,
        }
    }

    /// Where this instance's calls stand, for the caller that outlives a
    /// cut store.
    pub(crate) fn whereabouts(&self) -> Arc<Whereabouts> {
        self.whereabouts.clone()
    }

    /// What the guest wrote to stderr in this call so far, scrubbed of the
    /// call's secrets and bounded.
    pub(crate) fn said(&self) -> String {
        self.voice.said(MAX_PLUGIN_TEXT)
    }

    /// Turns a failed call's error into a typed fault; what the guest
    /// wrote to stderr is scrubbed of the call's secrets and bounded.
    pub(crate) fn classify(
        &mut self,
        error: &wasmtime::Error,
        deadline: Duration,
        scrub: &Scrub,
    ) -> Fault {
        if let Some(requested) = self.limiter.denied.take() {
            return Fault::OutOfMemory {
                limit: self.limiter.cap as u64,
                requested: requested as u64,
            };
        }
        if oversized(error) {
            return Fault::Oversized {
                limit: self.transfer as u64,
            };
        }
        let trap = error
            .chain()
            .find_map(|cause| cause.downcast_ref::<Trap>())
            .copied();
        match trap {
            Some(Trap::Interrupt) => Fault::Timeout { deadline },
            Some(Trap::StackOverflow) => Fault::StackOverflow,
            Some(Trap::MemoryOutOfBounds) if recursing(error) => Fault::StackOverflow,
            Some(other) => {
                let said = self.said();
                Fault::Trap {
                    reason: if said.is_empty() {
                        other.to_string()
                    } else {
                        format!("{other}; the plugin said: {said}")
                    },
                }
            }
            None => Fault::Trap {
                reason: scrub.text(&format!("{error:#}")),
            },
        }
    }
}

/// The `log` import, the same for every world ([`crate::voice`]).
impl<W: Send + 'static> log::Host for Sandbox<W> {
    async fn write(&mut self, level: Level, message: String) {
        self.voice.write(level, &message);
    }
}

/// Whether `error` is wasmtime refusing to copy past the hostcall fuel. Its
/// error type is private, so its sentence is what there is to match; the
/// hostile suite's `alias` case fails if wasmtime ever rewords it.
fn oversized(error: &wasmtime::Error) -> bool {
    error
        .chain()
        .any(|cause| cause.to_string().contains("fuel allocated for hostcalls"))
}

/// Whether a trap's backtrace is one deep recursion: a guest compiled from
/// Rust (or C) keeps its own stack in linear memory, below its data, so
/// running out of it is an out-of-bounds access, not wasmtime's stack
/// overflow. A full backtrace whose top frames are all one or two
/// functions is that, and reported as the stack fault it is.
fn recursing(error: &wasmtime::Error) -> bool {
    let Some(trace) = error.downcast_ref::<WasmBacktrace>() else {
        return false;
    };
    let frames = trace.frames();
    if frames.len() < RECURSION_FRAMES {
        return false;
    }
    let mut distinct: Vec<u32> = frames[..RECURSION_FRAMES]
        .iter()
        .map(|f| f.func_index())
        .collect();
    distinct.sort_unstable();
    distinct.dedup();
    distinct.len() <= 2
}

/// Epoch ticks for a deadline, rounded up, at least one.
pub(crate) fn deadline_ticks(deadline: Duration) -> u64 {
    (deadline.as_micros() as u64).div_ceil(EPOCH_TICK.as_micros() as u64) + 1
}

/// Both WASI clocks read zero: a plugin's only time is what a call passes.
pub(crate) struct ZeroClock;

impl HostWallClock for ZeroClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl HostMonotonicClock for ZeroClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

/// Refuses memory growth past the cap, and remembers it did.
struct Limiter {
    cap: usize,
    denied: Option<usize>,
}

impl wasmtime::ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.cap {
            self.denied = Some(desired);
            Ok(false)
        } else {
            Ok(true)
        }
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}
