//! The node store's conversation sessions as the turn engine's
//! [`Sessions`]: what a seat already said in a thread, every row written
//! also offered to the memory changelog so it follows the seat.

use std::sync::Arc;

use crewlet_turns::{Said, SessionError, Sessions};
use tracing::warn;

/// The node store's conversation sessions as the turn engine's; every row
/// written is offered to the memory changelog too.
pub struct NodeSessions {
    pub store: Arc<crewlet_store::Store>,
    pub changelog: crewlet_memory::Changelog,
}

impl Sessions for NodeSessions {
    fn said(&self, seat: &str, conversation: &str) -> Result<Vec<Said>, SessionError> {
        let session = self
            .store
            .session(seat, conversation)
            .map_err(|e| SessionError(e.to_string()))?;
        Ok(session.said)
    }

    fn remember(
        &self,
        seat: &str,
        conversation: &str,
        said: &[Said],
        at_ms: i64,
    ) -> Result<(), SessionError> {
        self.store
            .remember(seat, conversation, said, at_ms)
            .map_err(|e| SessionError(e.to_string()))?;
        // The local row is written: a row that cannot follow the seat is
        // said here, not as a session that was not recorded.
        match self.store.session_row(seat, conversation) {
            Ok(Some(row)) => {
                if let Err(e) = self.changelog.offer::<crewlet_memory::Sessions>(&row) {
                    warn!(subsystem = "memory", seat, conversation, error = %e, "session row not published");
                }
            }
            Ok(None) => {}
            Err(e) => {
                warn!(subsystem = "memory", seat, conversation, error = %e, "cannot read the session row back to publish it")
            }
        }
        Ok(())
    }
}
