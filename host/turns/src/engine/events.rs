//! A turn's events, off its critical path.
//!
//! Rule: every step is emitted in the order it happened, and one writer
//! task hands them to the [`EventSink`] in that order. Why: a model call
//! never waits for a row or a broadcast, and a reader of the log sees a
//! turn's steps as they happened. After [`Events::close`] an event is
//! published inline, still after everything queued before it.

use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::mpsc;
use tracing::warn;

use super::{Brain, Run};
use crate::ports::{EventSink, Toolbox, TurnEvent};

pub(super) struct Events {
    sink: Arc<dyn EventSink>,
    tx: Mutex<Option<mpsc::UnboundedSender<TurnEvent>>>,
    writer: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Events {
    pub(super) fn start(sink: Arc<dyn EventSink>) -> Events {
        let (tx, mut rx) = mpsc::unbounded_channel::<TurnEvent>();
        let s = sink.clone();
        let writer = tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                publish(&*s, ev).await;
            }
        });
        Events {
            sink,
            tx: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
        }
    }

    async fn emit(&self, ev: TurnEvent) {
        let queued = match &*self.tx.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(tx) => tx.send(ev).map_err(|e| e.0),
            None => Err(ev),
        };
        if let Err(ev) = queued {
            publish(&*self.sink, ev).await;
        }
    }

    pub(super) async fn close(&self) {
        drop(self.tx.lock().unwrap_or_else(|p| p.into_inner()).take());
        let writer = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(w) = writer {
            let _ = w.await;
        }
    }
}

async fn publish(sink: &dyn EventSink, ev: TurnEvent) {
    let kind = ev.kind;
    if let Err(e) = sink.publish(ev).await {
        warn!(subsystem = "turns", %kind, error = %e, "event not published");
    }
}

impl<B: Brain, T: Toolbox> Run<'_, B, T> {
    pub(super) async fn emit(&self, kind: &'static str, payload: Value) {
        self.engine
            .events
            .emit(TurnEvent {
                kind,
                at_ms: self.engine.clock.now_ms(),
                seat: self.handle.clone(),
                trace_id: self.trace_id.clone(),
                conversation: self.conversation.clone(),
                payload,
            })
            .await;
    }
}
