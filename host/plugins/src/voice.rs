//! What a plugin says in the node's log: its `log` lines, in every world,
//! and what it wrote to stderr during each call.
//!
//! Rules, and why:
//! - **One voice per plugin, one implementation for every world**: the
//!   `log` import is served for any world by the sandbox
//!   ([`crate::sandbox`]: `impl log::Host for Sandbox<W>`), which hands the
//!   line to [`Voice::write`]; a webhook, a provider and a module speak by
//!   the same rules.
//! - **Tagged**: every line carries `plugin` (its name), `kind` (its world)
//!   and `from` (`log` or `stderr`), and the guest's level is kept.
//! - **Nothing secret, nothing unbounded**: a line is scrubbed of the secrets
//!   the current call was handed ([`crate::scrub`]), then cut at
//!   [`MAX_LINE`] bytes; stderr is captured per call up to twice that and
//!   dropped beyond (a full pipe never fails the guest's write).
//! - **Rationed** ([`crate::ration`]): [`LINE_BURST`] lines at once, then
//!   one per [`LINE_EVERY`], per plugin; the next line that passes says how
//!   many were dropped.
//! - **stderr is kept on success too**: after every call what the guest
//!   wrote goes to the log, at DEBUG when the call succeeded (chatter on
//!   every delivery is not news; `log` is how a plugin speaks up) and at
//!   WARN when it faulted. The last [`KEEP_LINES`] `log` lines are kept
//!   per plugin, for `crewlet plugins try`.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

use crate::bindings::module::crewlet::plugin::log::Level;
use crate::manifest::Kind;
use crate::ration::{Ration, Verdict};
use crate::scrub::{Scrub, bound};

/// The longest line a plugin puts in the log, in bytes.
pub const MAX_LINE: usize = 4096;
/// Lines one plugin may write at once.
pub const LINE_BURST: u32 = 50;
/// Then one more line per this long.
pub const LINE_EVERY: Duration = Duration::from_millis(100);
/// Lines kept per plugin for [`Speaker::logged_since`].
pub const KEEP_LINES: usize = 1000;

/// Where a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Log,
    Stderr,
}

impl Via {
    fn as_str(self) -> &'static str {
        match self {
            Via::Log => "log",
            Via::Stderr => "stderr",
        }
    }
}

/// One plugin's voice: its name and world, its ration, its recent lines.
#[derive(Debug)]
pub struct Speaker {
    plugin: String,
    kind: Kind,
    ration: Ration,
    recent: Mutex<Recent>,
}

#[derive(Debug, Default)]
struct Recent {
    lines: VecDeque<(u64, String)>,
    next: u64,
}

impl Speaker {
    pub fn new(plugin: &str, kind: Kind) -> Speaker {
        Speaker {
            plugin: plugin.to_string(),
            kind,
            ration: Ration::new(LINE_BURST, LINE_EVERY),
            recent: Mutex::default(),
        }
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A mark: [`Speaker::logged_since`] it returns only lines logged
    /// after.
    pub fn mark(&self) -> u64 {
        self.recent().next
    }

    /// The kept `log` lines since `mark` (0: all kept), oldest first.
    pub fn logged_since(&self, mark: u64) -> Vec<String> {
        self.recent()
            .lines
            .iter()
            .filter(|(n, _)| *n >= mark)
            .map(|(_, l)| l.clone())
            .collect()
    }

    /// Says `text` (already scrubbed and bounded) at `level`, if the ration
    /// allows; a `log` line is kept either way.
    fn say(&self, level: Level, from: Via, text: String) {
        let verdict = self.ration.take(Instant::now());
        if let Verdict::Write { dropped } = verdict {
            let (plugin, kind, via) = (self.plugin.as_str(), self.kind.world(), from.as_str());
            let line = if dropped == 0 {
                text.clone()
            } else {
                format!(
                    "{text} ({dropped} earlier lines of this plugin were dropped: over its ration)"
                )
            };
            match level {
                Level::Debug => {
                    tracing::debug!(subsystem = "plugins", plugin, kind, from = via, "{line}")
                }
                Level::Info => {
                    tracing::info!(subsystem = "plugins", plugin, kind, from = via, "{line}")
                }
                Level::Warn => {
                    tracing::warn!(subsystem = "plugins", plugin, kind, from = via, "{line}")
                }
                Level::Error => {
                    tracing::error!(subsystem = "plugins", plugin, kind, from = via, "{line}")
                }
            }
        }
        if from != Via::Log {
            return;
        }
        let mut recent = self.recent();
        let n = recent.next;
        recent.next += 1;
        if recent.lines.len() >= KEEP_LINES {
            recent.lines.pop_front();
        }
        recent.lines.push_back((n, text));
    }
}

/// What one instance's store holds of its plugin's voice; a clone is the
/// same voice (a call's stderr is said even when its store is gone: a
/// timed-out call drops it).
#[derive(Clone)]
pub(crate) struct Voice {
    speaker: Arc<Speaker>,
    stderr: StderrTap,
    /// The secrets of the call in progress.
    scrub: Scrub,
}

impl Voice {
    pub(crate) fn new(speaker: Arc<Speaker>) -> Voice {
        Voice {
            speaker,
            stderr: StderrTap::default(),
            scrub: Scrub::none(),
        }
    }

    /// The stream the instance's WASI context writes stderr to.
    pub(crate) fn stderr(&self) -> StderrTap {
        self.stderr.clone()
    }

    /// Readies the voice for a call handed `scrub`'s secrets.
    pub(crate) fn prepare(&mut self, scrub: &Scrub) {
        self.scrub = scrub.clone();
        self.stderr.take();
    }

    /// What the guest wrote to stderr in this call so far, scrubbed and cut
    /// to `max` bytes.
    pub(crate) fn said(&self, max: usize) -> String {
        self.scrubbed(&self.stderr.peek(), max)
    }

    fn scrubbed(&self, bytes: &[u8], max: usize) -> String {
        bound(
            self.scrub
                .replace(String::from_utf8_lossy(bytes).trim())
                .as_str(),
            max,
        )
    }

    /// After a call: what the guest wrote to stderr goes to the log (DEBUG
    /// when the call succeeded, WARN when it faulted), and the tap is
    /// emptied for the next call. A call that wrote nothing (the common
    /// one) costs a lock and no copy.
    pub(crate) fn settle(&self, ok: bool) {
        let written = self.stderr.take();
        if written.is_empty() {
            return;
        }
        let text = self.scrubbed(&written, MAX_LINE);
        if !text.is_empty() {
            let level = if ok { Level::Debug } else { Level::Warn };
            self.speaker.say(level, Via::Stderr, text);
        }
    }

    /// One `log` line of the guest's.
    pub(crate) fn write(&self, level: Level, message: &str) {
        let text = bound(&self.scrub.replace(message), MAX_LINE);
        self.speaker.say(level, Via::Log, text);
    }
}

/// A guest's stderr: kept up to twice [`MAX_LINE`] per call (so a secret
/// cut at the bound is still whole when it is scrubbed), the rest dropped
/// without failing the write.
#[derive(Debug, Clone, Default)]
pub(crate) struct StderrTap(Arc<Mutex<Vec<u8>>>);

const TAP_BYTES: usize = 2 * MAX_LINE;

impl StderrTap {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn keep(&self, bytes: &[u8]) {
        let mut kept = self.lock();
        let room = TAP_BYTES.saturating_sub(kept.len());
        kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    fn peek(&self) -> Vec<u8> {
        self.lock().clone()
    }

    fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.lock())
    }
}

impl IsTerminal for StderrTap {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for StderrTap {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for StderrTap {
    async fn ready(&mut self) {}
}

impl OutputStream for StderrTap {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.keep(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

impl AsyncWrite for StderrTap {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.keep(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_scrubbed_then_cut_and_kept_with_a_mark() {
        let speaker = Arc::new(Speaker::new("p", Kind::Webhook));
        let mut voice = Voice::new(speaker.clone());
        voice.prepare(&Scrub::of([b"hunter2-password".as_slice()]));
        let mark = speaker.mark();
        voice.write(Level::Info, "the key is hunter2-password");
        voice.write(Level::Info, &"x".repeat(3 * MAX_LINE));
        let heard = speaker.logged_since(mark);
        assert_eq!(heard[0], "the key is [redacted]");
        assert!(heard[1].len() <= MAX_LINE && heard[1].ends_with("..."));
        assert!(speaker.logged_since(speaker.mark()).is_empty());
    }

    #[test]
    fn stderr_is_bounded_per_call_and_never_fails_the_guest() {
        let speaker = Arc::new(Speaker::new("p", Kind::Module));
        let mut voice = Voice::new(speaker.clone());
        voice.prepare(&Scrub::of([b"s3cr3t-value".as_slice()]));
        let mut tap = voice.stderr();
        for _ in 0..100 {
            assert!(OutputStream::write(&mut tap, Bytes::from(vec![b'a'; 1024])).is_ok());
        }
        assert_eq!(tap.peek().len(), TAP_BYTES);
        assert!(voice.said(MAX_LINE).len() <= MAX_LINE);
        voice.settle(true);
        assert!(voice.said(MAX_LINE).is_empty(), "the tap is emptied");
        voice.prepare(&Scrub::of([b"s3cr3t-value".as_slice()]));
        assert!(OutputStream::write(&mut tap, Bytes::from_static(b"oops s3cr3t-value\n")).is_ok());
        assert_eq!(voice.said(MAX_LINE), "oops [redacted]");
        voice.settle(false);
        assert!(voice.said(MAX_LINE).is_empty());
    }

    #[test]
    fn lines_over_the_ration_are_dropped_from_the_log_but_kept() {
        let speaker = Speaker::new("p", Kind::Provider);
        let mark = speaker.mark();
        for i in 0..(LINE_BURST + 10) {
            speaker.say(Level::Info, Via::Log, format!("line {i}"));
        }
        assert_eq!(speaker.logged_since(mark).len(), LINE_BURST as usize + 10);
    }
}
