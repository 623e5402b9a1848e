//! The integration tests of `crewlet-plugins` against the repository's real
//! plugin components: one module per area, all in one test binary (one build
//! and link of wasmtime instead of one per file).

mod common;

mod chat_module;
mod cli;
mod embeddings;
mod hostile;
mod modules;
mod providers;
mod state;
mod tools;
mod webhooks;
