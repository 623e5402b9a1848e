//! Following the threads a seat posts in ([`crewlet_coord::follows`]), and
//! leaving one when the seat says so (`leave_thread`).
//!
//! Rules, and why:
//! - **A post in a thread follows it.** A post that landed in a thread
//!   records the follow, its last activity renewed, so a later message
//!   there from someone else wakes the seat without a mention, on
//!   whichever node claims it. A post with no thread follows nothing.
//! - **The backend is a wake's source**: the source of the turn's wake from
//!   the post's channel, else the one source every wake of the turn shares.
//!   A schedule's is none (no surface delivers into it); a post whose
//!   backend cannot be told follows nothing, and says so in the log.
//! - **Best effort.** The post landed whatever the store says: a follow
//!   that could not be written is in the post's `reply_posted` event
//!   (`follow_error`) and the log, and the seat's next post writes it again.
//! - **Leaving is the seat's word**, through the builtin; unknown is told to
//!   the model as such (ask again), never "you did not follow it".

use crewlet_coord::{Answer, ChatThread};
use tracing::{debug, warn};

use super::dispatch::Answered;
use super::{Brain, Run};
use crate::builtins::{self, ThreadArg};
use crate::ports::Toolbox;
use crate::trigger::Target;

/// The source of every wake that is not a surface's.
const SCHEDULE: &str = "schedule";

impl<B: Brain, T: Toolbox> Run<'_, B, T> {
    /// The backend a post in `channel` is on (see the module docs).
    fn backend_of(&self, channel: &str) -> Option<String> {
        let surfaces = || self.wakes.iter().filter(|w| w.source != SCHEDULE);
        if let Some(w) = surfaces().find(|w| w.channel.as_deref() == Some(channel)) {
            return Some(w.source.clone());
        }
        let mut sources = surfaces().map(|w| w.source.as_str());
        let first = sources.next()?;
        sources.all(|s| s == first).then(|| first.to_owned())
    }

    /// Records that this seat posted at `target`: the thread it now
    /// follows, `None` when the post was in no thread it can follow.
    pub(super) async fn follow(&self, target: &Target) -> Result<Option<ChatThread>, String> {
        let Some(thread) = &target.thread else {
            return Ok(None);
        };
        let Some(backend) = self.backend_of(&target.channel) else {
            debug!(subsystem = "turns", seat = %self.handle, %target,
                "no wake of the turn says which surface the post is on; the thread is not followed");
            return Ok(None);
        };
        let at = ChatThread::new(backend, &target.channel, thread);
        match self.engine.follows.follow(&at, &self.handle).await {
            Ok(_) => Ok(Some(at)),
            Err(e) => {
                warn!(subsystem = "turns", seat = %self.handle, thread = %at, error = %e,
                    "the post landed but its thread is not followed; the next post there tries again");
                Err(e.to_string())
            }
        }
    }

    /// `leave_thread`: this seat stops following a thread.
    pub(super) async fn leave_thread(&self, arguments: &str) -> Answered {
        let arg = match builtins::decode::<ThreadArg>(builtins::LEAVE_THREAD, arguments) {
            Ok(a) => a,
            Err(e) => return Answered::error(e),
        };
        let named = match (arg.channel, arg.thread) {
            (Some(channel), Some(thread)) => self
                .backend_of(&channel)
                .map(|backend| ChatThread::new(backend, channel, thread)),
            (None, None) => self.wakes.iter().find_map(|w| {
                let (channel, thread) = (w.channel.as_ref()?, w.thread.as_ref()?);
                (w.source != SCHEDULE).then(|| ChatThread::new(&w.source, channel, thread))
            }),
            _ => None,
        };
        let Some(at) = named else {
            return Answered::error(format!(
                "{} needs a `channel` and a `thread` of a surface that woke you, or no arguments for the thread that woke you",
                builtins::LEAVE_THREAD
            ));
        };
        let shown = format!("{}#{}", at.channel, at.thread);
        match self.engine.follows.leave(&at, &self.handle).await {
            Ok(Answer::Yes(())) => Answered::ok(format!(
                "You no longer follow {shown}: a message there wakes you only when it mentions you."
            )),
            Ok(Answer::No(())) => {
                Answered::ok(format!("You did not follow {shown}; nothing changed."))
            }
            Err(e) if e.is_unavailable() => Answered::error(format!(
                "Could not leave {shown}: the coordination store did not answer. Call {} again.",
                builtins::LEAVE_THREAD
            )),
            Err(e) => Answered::error(format!("Could not leave {shown}: {e}")),
        }
    }
}
