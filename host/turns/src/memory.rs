//! A seat's long memory as the turn sees it: the port the node plugs its
//! store and memory stream into ([`SeatMemory`]), the learned skills seam
//! ([`SkillSource`]) and the company's embedder behind a box ([`Embeds`]).
//!
//! Rule: the engine decides what is remembered and what a prompt recalls;
//! where rows live and how they follow the seat is the node's. Every call
//! is async so the prefetch can bound it; a failure is a block skipped,
//! never a failed turn.

use std::sync::Arc;

use futures::future::BoxFuture;

use crate::ports::{EmbedError, EmbedSite, Embedded, Embedder};

pub use crewlet_os::{Episode, Vector};

/// A note a seat keeps with `remember`.
#[derive(Debug, Clone, PartialEq)]
pub struct Note {
    pub id: String,
    pub text: String,
    pub turn_id: String,
    pub at_ms: i64,
    pub vector: Option<Vector>,
}

/// A recalled note or episode: its text, when, and how far from the
/// query (`None`: not compared — recalled by recency).
#[derive(Debug, Clone, PartialEq)]
pub struct Recalled {
    pub text: String,
    pub at_ms: i64,
    pub distance: Option<f64>,
}

/// What a turn leaves in the seat's memory when it ends.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnMemory {
    /// The ended turn (its store stamp 0: the store sets it).
    pub episode: Episode,
    /// Each counterparty dealt with, and the line learned of them.
    pub met: Vec<(String, String)>,
    /// This was the seat's first turn: mark it onboarded, fleet-wide.
    pub onboarded: bool,
}

/// The store or stream refused; carries its own line.
#[derive(Debug, Clone, thiserror::Error)]
#[error("seat memory: {0}")]
pub struct MemoryFault(pub String);

/// A seat's memory, kept by the node (its store; every row also on the
/// memory stream so it follows the seat).
pub trait SeatMemory: Send + Sync + 'static {
    /// Keeps a note.
    fn remember(&self, seat: &str, note: Note) -> BoxFuture<'_, Result<(), MemoryFault>>;
    /// Up to `limit` notes: those embedded like `query` within
    /// `max_distance`, nearest first, then the others newest first;
    /// without a query the newest.
    fn notes(
        &self,
        seat: &str,
        query: Option<Vector>,
        max_distance: f64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<Recalled>, MemoryFault>>;
    /// Up to `limit` episodes embedded like `query` within `max_distance`.
    fn episodes(
        &self,
        seat: &str,
        query: Vector,
        max_distance: f64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<Recalled>, MemoryFault>>;
    /// What the seat knows of `counterparty`, if it dealt with them.
    fn profile(
        &self,
        seat: &str,
        counterparty: &str,
    ) -> BoxFuture<'_, Result<Option<String>, MemoryFault>>;
    /// Whether the seat has had its first turn, fleet-wide.
    fn onboarded(&self, seat: &str) -> BoxFuture<'_, Result<bool, MemoryFault>>;
    /// Records what an ended turn leaves: its episode, the profiles of
    /// whom it dealt with, the onboarding marker.
    fn ended(&self, seat: &str, turn: TurnMemory) -> BoxFuture<'_, Result<(), MemoryFault>>;
}

/// The skills a seat learned (the learning duty's); the node supplies it.
pub trait SkillSource: Send + Sync + 'static {
    /// Skills that fit `trigger`, each one rendered text.
    fn skills(&self, seat: &str, trigger: &str) -> BoxFuture<'_, Result<Vec<String>, MemoryFault>>;
}

/// No learned skills yet: the block renders its empty state.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoSkills;

impl SkillSource for NoSkills {
    fn skills(
        &self,
        _seat: &str,
        _trigger: &str,
    ) -> BoxFuture<'_, Result<Vec<String>, MemoryFault>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}

/// An [`Embedder`] behind a box, so the engine holds any one.
pub trait Embeds: Send + Sync + 'static {
    fn model(&self) -> Option<String>;
    fn embed_boxed<'a>(
        &'a self,
        texts: Vec<String>,
        site: &'a EmbedSite,
    ) -> BoxFuture<'a, Result<Embedded, EmbedError>>;
}

impl<E: Embedder> Embeds for E {
    fn model(&self) -> Option<String> {
        Embedder::model(self)
    }

    fn embed_boxed<'a>(
        &'a self,
        texts: Vec<String>,
        site: &'a EmbedSite,
    ) -> BoxFuture<'a, Result<Embedded, EmbedError>> {
        Box::pin(self.embed(texts, site))
    }
}

/// What the engine remembers and recalls with.
#[derive(Clone)]
pub struct Recall {
    pub memory: Arc<dyn SeatMemory>,
    pub embedder: Arc<dyn Embeds>,
    pub skills: Arc<dyn SkillSource>,
}
