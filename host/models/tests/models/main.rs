//! The integration tests of `crewlet-models` through the real provider
//! components: one module per area, all in one test binary (one build and
//! link of wasmtime instead of one per file).

mod common;

mod embeddings;
mod fleet;
mod openai_chain;
mod scripted;
