//! The estate's wiring against a real nats-server and real SQLite files:
//! a node's usage events are tallied, published and applied into a data
//! node's estate (its own and a stateless peer's), and a backup taken on
//! one broker is prepared into an empty data dir and adopted on a fresh
//! broker, the estate coming back with it.

mod backup;
mod fixture;
mod usage;
