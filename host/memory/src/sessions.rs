//! Conversation sessions (what a seat already said in a thread) as a
//! memory table: keyed by conversation within the seat, carried as the
//! store's whole row in JSON, applied newest-`updated_ms`-wins
//! (`crewlet_store::Store::apply_sessions`).

use std::sync::Arc;

use crewlet_store::{SessionRow, Store};

use crate::{Applied, Table};

/// The `conversation_sessions` table of a node's store.
pub struct Sessions(pub Arc<Store>);

impl Table for Sessions {
    type Row = SessionRow;
    const NAME: &'static str = "sessions";

    fn seat(row: &SessionRow) -> &str {
        &row.seat
    }

    fn key(row: &SessionRow) -> String {
        row.conversation.clone()
    }

    fn encode(row: &SessionRow) -> Result<Vec<u8>, String> {
        serde_json::to_vec(row).map_err(|e| e.to_string())
    }

    fn decode(bytes: &[u8]) -> Result<SessionRow, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }

    fn apply(&self, rows: Vec<SessionRow>) -> Result<Vec<Applied>, String> {
        crate::tables::applied(self.0.apply_sessions(&rows))
    }
}
