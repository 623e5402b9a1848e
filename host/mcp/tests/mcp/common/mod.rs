//! Helpers shared by the MCP tests: real children, real files.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crewlet_company::{McpServer, McpTransport};
use crewlet_mcp::{Resolver, ServerState, ServerSummary};

/// The chat server binary of this package.
pub const CHAT: &str = env!("CARGO_BIN_EXE_crewlet-chat-mcp");

/// A chat server spec whose identity is `${identity_ref}`.
pub fn chat_spec(shared: bool, identity_ref: &str, log: &Path) -> McpServer {
    McpServer {
        transport: McpTransport::Stdio {
            command: CHAT.to_owned(),
            args: Vec::new(),
            env: BTreeMap::from([
                ("CHAT_IDENTITY".to_owned(), format!("${{{identity_ref}}}")),
                ("CHAT_LOG".to_owned(), log.display().to_string()),
            ]),
            cwd: None,
        },
        shared,
        replies: vec!["post_message".to_owned()],
        surface: Default::default(),
    }
}

pub fn stdio(command: &str, args: &[&str], env: &[(&str, &str)]) -> McpServer {
    McpServer {
        transport: McpTransport::Stdio {
            command: command.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            cwd: None,
        },
        shared: false,
        replies: Vec::new(),
        surface: Default::default(),
    }
}

/// A resolver over fixed name → value pairs.
pub fn resolver(pairs: &[(&str, &str)]) -> Resolver {
    let map: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    Resolver::new(move |name: &str| match map.get(name) {
        Some(v) => crewlet_secrets::Lookup::Found(v.clone()),
        None => crewlet_secrets::Lookup::Unset,
    })
}

pub fn summary<'a>(servers: &'a [ServerSummary], name: &str) -> &'a ServerSummary {
    servers
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no server {name} in {servers:?}"))
}

pub fn failure(servers: &[ServerSummary], name: &str) -> String {
    match &summary(servers, name).state {
        ServerState::Failed { reason } => reason.clone(),
        other => panic!("{name} should have failed, is {other:?}"),
    }
}

pub fn pid_of(servers: &[ServerSummary], name: &str) -> u32 {
    summary(servers, name)
        .pid
        .unwrap_or_else(|| panic!("{name} has no pid"))
}

/// A process exists (running or a zombie not yet reaped).
pub fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The children of this test process whose command name is `comm`.
pub fn children_named(comm: &str) -> Vec<u32> {
    let me = std::process::id();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = &stat[open + 1..close];
        let ppid = stat[close + 2..]
            .split(' ')
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok());
        if name == comm && ppid == Some(me) {
            found.push(pid);
        }
    }
    found
}

/// Waits for `done` to hold, checking every few ms, failing after `within`.
/// For an outcome the OS reports only by polling (a process reaped).
pub async fn until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A node allow-list for these tests: the programs they start (`sh`,
/// `sleep`, `node` where installed, the chat server), with any arguments.
pub fn test_policy() -> Arc<crewlet_mcp::CommandPolicy> {
    let on_path = |name: &str| {
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    };
    let allowed_commands = ["sh", "sleep", "node"]
        .into_iter()
        .filter_map(on_path)
        .chain([std::path::PathBuf::from(CHAT)])
        .map(|p| crewlet_config::AllowedCommand {
            program: Some(p),
            args_prefix: Vec::new(),
        })
        .collect();
    let cfg = crewlet_config::McpConfig {
        allowed_commands,
        allowed_dirs: Vec::new(),
    };
    Arc::new(crewlet_mcp::CommandPolicy::new(&cfg, None))
}
