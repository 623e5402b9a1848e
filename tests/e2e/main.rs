//! End-to-end tests of the real `crewlet` binary against real nats-servers:
//! one module per capability, all in one test binary (one build and link
//! instead of one per file, and the test threads pack every module's slow
//! cases together).

mod common;

mod clock_skew;
mod config_plane;
mod dashboard;
mod doctor;
mod duties;
mod embedded_cluster;
mod event_kinds;
mod failover;
mod fleet;
mod fleet_view;
mod grants;
mod hot_reload;
mod ingress;
mod layout;
mod limits;
mod litellm;
mod live_view;
mod local_coordination;
mod mcp_allowlist;
mod module_state;
mod modules;
mod no_secret;
mod node_lifecycle;
mod operator_access;
mod operator_mcp;
mod placement;
mod plugins_cli;
mod plugins_try;
mod replay;
mod replies;
mod route_cut;
mod sandbox;
mod secrets;
mod speak;
mod stall;
mod telemetry;
mod turns;
