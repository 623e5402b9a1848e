//! Conversation sessions (what a seat already said in a thread) as a
//! memory table: keyed by conversation within the seat, carried as the
//! store's whole row in JSON, applied newest-`updated_ms`-wins
//! (`crewlet_store::Store::apply_sessions`).

store_table! {
    /// The `conversation_sessions` table of a node's store.
    Sessions: crewlet_store::SessionRow, "sessions", |row| row.conversation.clone(), apply_sessions
}
