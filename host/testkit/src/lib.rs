//! Test harness: real nats-server processes on loopback and small helpers
//! for tests that drive the real `crewlet` binary.
//!
//! Nothing here is a double. Every server is the pinned nats-server binary
//! the bootstrap installs, started on free ports with its store in a
//! temporary dir, killed when its handle drops (and by the kernel if the test
//! process dies first, through a parent-death signal).

#![recursion_limit = "256"]

pub mod cluster;
pub mod diagram;
pub mod doc_paths;
pub mod github;
pub mod http;
pub mod layout;
pub mod litellm;
pub mod nats;
pub mod openai;
pub mod otlp;
pub mod plugins;
pub mod process;

pub use cluster::{Cluster, Proxy};
pub use litellm::{LiteLlm, MockModel};
pub use nats::{NatsServer, free_port, nats_server_bin};
pub use openai::{Reply, ScriptedOpenAi, SeenRequest};
pub use plugins::PluginsDir;
