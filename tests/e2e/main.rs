//! End-to-end tests of the real `crewlet` binary against real nats-servers:
//! one module per capability, all in one test binary (one build and link
//! instead of one per file, and the test threads pack every module's slow
//! cases together).

mod common;

mod backup;
mod blame;
mod budget_park;
mod chat;
mod clock_skew;
mod config_plane;
mod custody;
mod dashboard;
mod dashboard_chat;
mod dashboard_views;
mod doctor;
mod duties;
mod embedded_cluster;
mod event_kinds;
mod failover;
mod fleet;
mod fleet_view;
mod follows;
mod grants;
mod hot_reload;
mod identities;
mod ingress;
mod layout;
mod learning;
mod limits;
mod litellm;
mod live_view;
mod local_coordination;
mod mcp_allowlist;
mod memory;
mod module_state;
mod modules;
mod newcomer;
mod no_secret;
mod node_lifecycle;
mod operator_access;
mod operator_mcp;
mod peer_status;
mod placement;
mod plugins_cli;
mod plugins_try;
mod quiet;
mod readback;
mod readiness;
mod recipes;
mod replay;
mod replies;
mod route_cut;
mod sandbox;
mod secrets;
mod secrets_unknown;
mod signing;
mod speak;
mod stall;
mod telemetry;
mod tool_failures;
mod turns;
mod usage;
