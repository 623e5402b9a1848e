//! The `crewlet` command line.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use crewlet_config::LogFormat;

use crate::run::{RunArgs, run};

/// Crewlet runs a company of AI agents: seats woken by work arriving from
/// the surfaces your company already uses, thinking with an LLM, acting
/// through MCP tool servers, and replying as themselves.
///
/// Every command that talks to a running node takes `--api URL`, else
/// `CREWLET_API`, else http://127.0.0.1:7420, and sends `CREWLET_TOKEN`,
/// else the first-start token of the node's data dir (`--data-dir`, else
/// `CREWLET_DATA_DIR`, else ./crewlet-data).
#[derive(Debug, Parser)]
#[command(name = "crewlet", version = crate::VERSION, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start a node: the HTTP surface, the event stream (an embedded
    /// nats-server unless `stream.url` names an external one), and the
    /// engine. Runs until SIGINT/SIGTERM, then drains and exits 0.
    /// A configuration it refuses exits 2 without touching the disk.
    Run(RunCmd),
    /// Inspect and create plugins (WASM components with a plugin.toml).
    #[command(subcommand)]
    Plugins(PluginsCmd),
    /// Manage the company configuration (the config plane).
    #[command(subcommand)]
    Config(ConfigCmd),
    /// Manage the company's secrets in the fleet's secrets bucket (sealed
    /// under the node's keyring), through a running node's API — or, for
    /// `set --data-dir`, a stopped node's store. Values are read from stdin
    /// and never printed.
    #[command(subcommand)]
    Secrets(SecretsCmd),
    /// Back the company up (admin scope), through a running node's API: one
    /// artefact directory DIR on the node's machine — the company's
    /// coordination buckets (secrets still sealed), module buckets, memory,
    /// dead letters and the node's own store, with a manifest and checksums.
    Backup(BackupArgs),
    /// Prepare a fresh or emptied data dir from a backup artefact: verified
    /// whole first (a checksum that fails or a newer format is refused,
    /// nothing written); the next `crewlet run` on it restores the rest.
    Restore(RestoreArgs),
    /// The token budgets' live windows, through a running node's API.
    #[command(subcommand)]
    Budgets(BudgetsCmd),
    /// Operator tokens (admin scope), through a running node's API. Every
    /// command sends the token in CREWLET_TOKEN, else the first-start token
    /// in the node's data dir (--data-dir, else CREWLET_DATA_DIR, else
    /// ./crewlet-data).
    #[command(subcommand)]
    Tokens(TokensCmd),
    /// The company's seats, through a running node's API: with no
    /// subcommand every seat's holder node, state, turns in flight and
    /// mailbox depth (read scope); `pause` and `resume` need write scope.
    Agents(AgentsArgs),
    /// Every live node of the fleet: roles, posture, applied epoch, seats
    /// and duties held, MCP servers, last beat and broker (read scope).
    Fleet(ShowArgs),
    /// The fleet's usage history (tokens, turns, schedule fires) from a
    /// running data node's replicated estate (read scope).
    Usage(UsageArgs),
    /// The replicated estate's state log (write scope).
    #[command(subcommand)]
    Estate(EstateCmd),
    /// Send a signed sample delivery to a running node.
    #[command(subcommand)]
    Webhook(WebhookCmd),
    /// MCP servers built into this binary.
    #[command(subcommand)]
    Mcp(McpCmd),
    /// The company chat (docs/chat.md), through a running node's API:
    /// `send` posts as the operator token's name (write scope), `read`
    /// prints a channel's top-level messages or one thread (read scope).
    #[command(subcommand)]
    Chat(ChatCmd),
    /// Check what `crewlet run` with these arguments needs, without
    /// starting it: the configuration, the data dir, nats-server (or the
    /// external NATS), free ports, the keyring, the plugins, the company
    /// against them and the secrets it names — each with its fix. Exit 1
    /// when `run` would not start.
    Doctor(DoctorCmd),
    /// Print the version of this binary.
    Version {
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum PluginsCmd {
    /// Validate every plugin under DIR without running any: manifests, the
    /// catalogue between them, and each component's world. Exits 1 on any
    /// problem.
    Check {
        #[arg(value_name = "DIR", required = true)]
        dirs: Vec<PathBuf>,
        /// Check again whenever a manifest or component under DIR changes
        /// (and held still for a second), until interrupted.
        #[arg(long)]
        watch: bool,
    },
    /// Print each plugin's effective permissions: routes and secrets,
    /// outbound hosts, buckets owned and read, limits. With --api, what
    /// the running node reports instead: health, module subscriptions,
    /// tools and publications, and each bucket's keys, bytes and cap.
    List {
        #[arg(value_name = "DIR", default_value = "plugins")]
        dirs: Vec<PathBuf>,
        /// A running node's HTTP API (e.g. http://127.0.0.1:7420).
        #[arg(long, value_name = "URL", env = "CREWLET_API")]
        api: Option<String>,
        /// A node configuration whose `[plugins.grants]` to apply, as that
        /// node would (its `[plugins] dirs` are read too).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Print each permission an operator's grant can change (base
        /// URL, outbound hosts, routes, body limit, bucket reads) with
        /// where it came from: manifest, operator added or operator
        /// denied, naming the operator's key.
        #[arg(long)]
        effective: bool,
    },
    /// Run one request through a plugin and print what it made of it,
    /// with what it wrote to stderr or its log. A webhook plugin gets a
    /// captured request (as a node records refused deliveries with
    /// `[ingress] record_refused`; its secrets from the environment, by name
    /// or upper-cased): verify, parse and the host's bounds, offline. A
    /// provider makes one `complete` call ({"model", "messages", "tools",
    /// "options", "api_key_env"}). A module gets one event ({"event":
    /// {"kind", "payload"}}) or one tool call ({"tool": {"name",
    /// "arguments"}}) on empty state of its own. Exit 0 when it answered
    /// (accepted), 1 when it refused or faulted, 2 when the request is
    /// wrong.
    Try {
        /// The plugin's name (its manifest's `name`).
        name: String,
        /// The request (JSON; its shape depends on the plugin's kind).
        #[arg(long, value_name = "FILE")]
        request: PathBuf,
        #[arg(value_name = "DIR", default_value = "plugins")]
        dirs: Vec<PathBuf>,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Scaffold a new plugin that builds and passes its own test.
    New {
        /// webhook, provider or module.
        #[arg(long, value_name = "KIND")]
        kind: String,
        /// The plugin's name (a-z, 0-9, -).
        name: String,
        /// Where to create it.
        #[arg(long, value_name = "DIR", default_value = ".")]
        dir: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum ConfigCmd {
    /// Validate a company document and activate it: through a running
    /// node's `PUT /config` (the fleet's pointer moves at once), or — with
    /// `--data-dir` naming a stopped node's data dir — by marking it active
    /// in that node's store, to be activated when the node next starts.
    /// Exits 2 on a document refused, 1 on any other failure.
    Import {
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// The running node's HTTP API.
        #[arg(long, value_name = "URL", env = "CREWLET_API", default_value = crate::client::DEFAULT_API)]
        api: String,
        /// A node's data dir: used directly when no node holds it.
        #[arg(long, value_name = "DIR", env = "CREWLET_DATA_DIR")]
        data_dir: Option<PathBuf>,
        /// The configuration the stopped node starts with: its `[mcp]`
        /// allow-list judges the document (a running node judges by its own).
        #[arg(long, value_name = "node.toml", env = "CREWLET_CONFIG")]
        config: Option<PathBuf>,
        /// Through a running node: wait up to this long for every node of
        /// the fleet to apply the revision (0: answer once it is active).
        /// Exits 1 naming the nodes behind when the wait runs out.
        #[arg(long, value_name = "SECONDS", default_value_t = 30)]
        wait: u64,
    },
}

#[derive(Debug, Subcommand)]
enum SecretsCmd {
    /// Set NAME to the value read from stdin (one trailing newline trimmed).
    /// With `--data-dir` naming a node's data dir that no node holds, the
    /// value is sealed into that node's store and moved onto the fleet when
    /// the node next starts.
    Set {
        #[arg(value_name = "NAME")]
        name: String,
        /// The running node's HTTP API.
        #[arg(long, value_name = "URL", env = "CREWLET_API", default_value = crate::client::DEFAULT_API)]
        api: String,
        /// A node's data dir: used directly when no node holds it.
        #[arg(long, value_name = "DIR", env = "CREWLET_DATA_DIR")]
        data_dir: Option<PathBuf>,
        /// The keyring that node uses (`secrets.keyring`); defaults to
        /// `<data dir>/keyring`.
        #[arg(long, value_name = "FILE", requires = "data_dir")]
        keyring: Option<PathBuf>,
    },
    /// Add a key to the node's keyring, re-seal every secret under it, and
    /// retire the keys no secret uses any more. Then copy the keyring file to
    /// every node of the fleet.
    RotateKey {
        /// The running node's HTTP API.
        #[arg(long, value_name = "URL", env = "CREWLET_API", default_value = crate::client::DEFAULT_API)]
        api: String,
    },
    /// List the secrets' names and when each was last set (never values).
    List {
        /// The running node's HTTP API.
        #[arg(long, value_name = "URL", env = "CREWLET_API", default_value = crate::client::DEFAULT_API)]
        api: String,
    },
    /// Remove NAME.
    Rm {
        #[arg(value_name = "NAME")]
        name: String,
        /// The running node's HTTP API.
        #[arg(long, value_name = "URL", env = "CREWLET_API", default_value = crate::client::DEFAULT_API)]
        api: String,
    },
}

#[derive(Debug, clap::Args)]
struct BackupArgs {
    /// Where the node writes the artefact (a new directory).
    #[arg(value_name = "DIR")]
    dir: PathBuf,
    #[command(flatten)]
    node: ApiArgs,
}

#[derive(Debug, clap::Args)]
struct RestoreArgs {
    /// The artefact directory `crewlet backup` wrote.
    #[arg(value_name = "ARTEFACT")]
    artefact: PathBuf,
    /// The data dir the restored node will run with (empty or absent).
    #[arg(long, value_name = "DIR", env = "CREWLET_DATA_DIR")]
    data_dir: PathBuf,
}

#[derive(Debug, Subcommand)]
enum BudgetsCmd {
    /// Print the company's and every seat's day, week and month windows:
    /// spent, ceiling, remaining, and whether a window refused work.
    Show(ShowArgs),
}

/// `crewlet usage`: sums by period and key.
#[derive(Debug, clap::Args)]
struct UsageArgs {
    /// day, week (named by its Monday) or month.
    #[arg(long, default_value = "day")]
    period: String,
    /// seat, role, model, node or provider (the slot that served the calls).
    #[arg(long, default_value = "seat")]
    by: String,
    /// First company day included (YYYY-MM-DD).
    #[arg(long)]
    from: Option<String>,
    /// Last company day included (YYYY-MM-DD).
    #[arg(long)]
    to: Option<String>,
    #[command(flatten)]
    show: ShowArgs,
}

#[derive(Debug, Subcommand)]
enum EstateCmd {
    /// Evict a data node gone for good: the state log's trim stops waiting
    /// for its position (audited: a `node_evicted` event with the reason).
    Evict {
        /// The node's id.
        node: String,
        /// Why it is gone for good.
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        node_api: ApiArgs,
    },
    /// Readmit an evicted node: it applies the state log again, adopting a
    /// peer's snapshot first if the log was trimmed past it (audited: a
    /// `node_readmitted` event with the reason).
    Readmit {
        /// The node's id.
        node: String,
        /// Why it may come back.
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        node_api: ApiArgs,
    },
}

/// The running node a command talks to, and whose token it sends.
#[derive(Debug, clap::Args)]
struct ApiArgs {
    /// The running node's HTTP API.
    #[arg(long, value_name = "URL", env = "CREWLET_API", default_value = crate::client::DEFAULT_API)]
    api: String,
    /// The data dir that node runs with (`run --data-dir`): its first-start
    /// operator token is sent, unless CREWLET_TOKEN is set.
    #[arg(long, value_name = "DIR", env = "CREWLET_DATA_DIR")]
    data_dir: Option<PathBuf>,
}

impl ApiArgs {
    fn node(&self) -> crate::client::NodeApi<'_> {
        crate::client::NodeApi {
            api: &self.api,
            data_dir: self.data_dir.as_deref(),
        }
    }
}

/// A read printed as a table, or as the API's JSON.
#[derive(Debug, clap::Args)]
struct ShowArgs {
    #[command(flatten)]
    node: ApiArgs,
    /// Print the API's JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
struct AgentsArgs {
    #[command(subcommand)]
    cmd: Option<AgentsCmd>,
    #[command(flatten)]
    show: ShowArgs,
}

#[derive(Debug, Subcommand)]
enum AgentsCmd {
    /// Pause HANDLE fleet-wide: its wakes wait in its mailbox and its
    /// running turn stops before its next model call.
    Pause {
        #[arg(value_name = "HANDLE")]
        handle: String,
        /// Why, for whoever looks at the seat next.
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
        #[command(flatten)]
        node: ApiArgs,
    },
    /// Resume HANDLE: what waited in its mailbox runs.
    Resume {
        #[arg(value_name = "HANDLE")]
        handle: String,
        #[command(flatten)]
        node: ApiArgs,
    },
    /// What HANDLE remembers and learned: skills with every version,
    /// notes, episodes, the people it knows.
    Memory {
        #[arg(value_name = "HANDLE")]
        handle: String,
        #[command(flatten)]
        show: ShowArgs,
    },
}

#[derive(Debug, Subcommand)]
enum ChatCmd {
    /// Post TEXT in a channel (or a thread of it); `@handle` wakes a seat.
    Send {
        #[arg(long, value_name = "CHANNEL")]
        channel: String,
        /// The thread to reply in: a top-level message's id.
        #[arg(long, value_name = "ID")]
        thread: Option<String>,
        #[arg(value_name = "TEXT")]
        text: String,
        #[command(flatten)]
        node: ApiArgs,
    },
    /// Print a channel's top-level messages, or one thread's.
    Read {
        #[arg(long, value_name = "CHANNEL")]
        channel: String,
        #[arg(long, value_name = "ID")]
        thread: Option<String>,
        #[command(flatten)]
        show: ShowArgs,
    },
}

#[derive(Debug, Subcommand)]
enum TokensCmd {
    /// Make a token and print its value once (only its hash is kept).
    Create {
        /// read, write (config, secrets, pauses) or admin (tokens).
        #[arg(long, value_name = "SCOPE")]
        scope: String,
        /// How long it is accepted: 90s, 15m, 12h, 30d. Default: until revoked.
        #[arg(long, value_name = "TTL")]
        ttl: Option<String>,
        /// What it is for.
        #[arg(long, value_name = "NAME", default_value = "")]
        name: String,
        #[command(flatten)]
        node: ApiArgs,
    },
    /// List the tokens: id, name, scope, created, expiry, revocation.
    List {
        #[command(flatten)]
        node: ApiArgs,
    },
    /// Revoke token ID fleet-wide.
    Revoke {
        #[arg(value_name = "ID")]
        id: String,
        #[command(flatten)]
        node: ApiArgs,
    },
}

#[derive(Debug, Subcommand)]
enum WebhookCmd {
    /// Send a signed Slack `app_mention` for a seat, as Slack would, to
    /// `/webhooks/slack/HANDLE`. The signing secret is read from the
    /// environment variable the company names for Slack.
    Sample {
        /// The seat to mention.
        #[arg(long, value_name = "HANDLE", default_value = "grace")]
        to: String,
        /// The Slack channel it is posted in.
        #[arg(long, value_name = "CHANNEL", default_value = "C0DEMO")]
        channel: String,
        /// What the person says.
        #[arg(
            long,
            value_name = "TEXT",
            default_value = "the export button does nothing on Safari, can you take a look?"
        )]
        text: String,
        /// The environment variable holding Slack's signing secret.
        #[arg(long, value_name = "NAME", default_value = "SLACK_SIGNING_SECRET")]
        secret_env: String,
        /// The running node's HTTP API.
        #[arg(long, value_name = "URL", env = "CREWLET_API", default_value = crate::client::DEFAULT_API)]
        api: String,
    },
}

#[derive(Debug, Subcommand)]
enum McpCmd {
    /// A small chat surface over stdio, for demos and tests: `post_message`,
    /// `read_thread`, `raise_working`, `clear_working`, `whoami`. Posts are
    /// appended to the JSON-lines file named by CHAT_LOG (indicator changes
    /// beside it, `*.working.jsonl`), as the identity in CHAT_IDENTITY.
    Chat,
}

/// What a node runs with: `crewlet run`'s arguments, which `crewlet
/// doctor` takes too.
#[derive(Debug, clap::Args)]
struct NodeArgs {
    /// Node configuration (TOML). Without one every key takes its default.
    #[arg(long, value_name = "node.toml", env = "CREWLET_CONFIG")]
    config: Option<PathBuf>,
    /// The company document to run (TOML). It seeds a fleet with no active
    /// revision; otherwise the node follows the fleet's revision and says so
    /// (WARN, and `/health` `company`) unless --activate-company.
    #[arg(long, value_name = "company.toml", env = "CREWLET_COMPANY")]
    company: Option<PathBuf>,
    /// A folder holding plugins (each with its plugin.toml); repeat for
    /// several, or `:`-separate them in CREWLET_PLUGINS. Read after the
    /// config file's `[plugins] dirs`.
    #[arg(
        long,
        value_name = "DIR",
        env = "CREWLET_PLUGINS",
        value_delimiter = ':'
    )]
    plugins: Vec<PathBuf>,
    /// Data dir; overrides `node.data_dir`.
    #[arg(long, value_name = "DIR", env = "CREWLET_DATA_DIR")]
    data_dir: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct RunCmd {
    #[command(flatten)]
    node: NodeArgs,
    /// Activate the --company document through the fleet's pointer even
    /// when the fleet runs another revision (as `crewlet config import`
    /// would). For a development loop (`./dev run` uses it); on a fleet it
    /// replaces whatever an operator activated last.
    #[arg(long, requires = "company")]
    activate_company: bool,
    /// Log format; overrides `logging.format`.
    #[arg(long, value_enum, value_name = "FORMAT")]
    log_format: Option<LogFormatArg>,
}

#[derive(Debug, clap::Args)]
struct DoctorCmd {
    #[command(flatten)]
    node: NodeArgs,
    /// Print the findings as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormatArg {
    /// Human-readable lines.
    Text,
    /// One JSON object per event.
    Json,
}

/// Parses the command line, runs it, and answers the exit status.
pub fn main() -> i32 {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(cmd) => run(RunArgs {
            config: cmd.node.config,
            company: cmd.node.company,
            activate_company: cmd.activate_company,
            plugins: cmd.node.plugins,
            data_dir: cmd.node.data_dir,
            log_format: cmd.log_format.map(|f| match f {
                LogFormatArg::Text => LogFormat::Text,
                LogFormatArg::Json => LogFormat::Json,
            }),
        }),
        Command::Plugins(cmd) => plugins(cmd),
        Command::Config(ConfigCmd::Import {
            file,
            api,
            data_dir,
            config,
            wait,
        }) => import_config(
            &file,
            &api,
            data_dir.as_ref(),
            config.as_deref(),
            std::time::Duration::from_secs(wait),
        ),
        Command::Secrets(cmd) => secrets(cmd),
        Command::Backup(args) => backup(args),
        Command::Restore(args) => {
            match crewlet_estate::backup::prepare(&args.artefact, &args.data_dir) {
                Ok(said) => {
                    println!("{said}");
                    0
                }
                Err(e) => {
                    eprintln!("crewlet: restore refused: {e}");
                    1
                }
            }
        }
        Command::Budgets(BudgetsCmd::Show(show)) => crate::client::shown(
            show.node.node(),
            "/budgets",
            show.json,
            crewlet_fleet::render_budgets,
        ),
        Command::Tokens(cmd) => tokens(cmd),
        Command::Agents(AgentsArgs { cmd: Some(cmd), .. }) => agents(cmd),
        Command::Agents(AgentsArgs { cmd: None, show }) => crate::client::shown(
            show.node.node(),
            "/agents",
            show.json,
            crewlet_fleet::render_agents,
        ),
        Command::Usage(u) => {
            let mut query = format!("/usage?period={}&by={}", u.period, u.by);
            for (k, v) in [("from", &u.from), ("to", &u.to)] {
                if let Some(v) = v {
                    query.push_str(&format!("&{k}={v}"));
                }
            }
            crate::client::shown(
                u.show.node.node(),
                &query,
                u.show.json,
                crewlet_estate::render_usage,
            )
        }
        Command::Estate(EstateCmd::Evict {
            node,
            reason,
            node_api,
        }) => audited(&node_api, "/estate/evict", &node, &reason),
        Command::Estate(EstateCmd::Readmit {
            node,
            reason,
            node_api,
        }) => audited(&node_api, "/estate/readmit", &node, &reason),
        Command::Fleet(show) => crate::client::shown(
            show.node.node(),
            "/fleet",
            show.json,
            crewlet_fleet::render_fleet,
        ),
        Command::Webhook(WebhookCmd::Sample {
            to,
            channel,
            text,
            secret_env,
            api,
        }) => sample(&to, &channel, &text, &secret_env, &api),
        Command::Mcp(McpCmd::Chat) => mcp_chat(),
        Command::Chat(cmd) => chat(cmd),
        Command::Doctor(d) => crate::doctor::doctor(crate::doctor::DoctorArgs {
            config: d.node.config,
            company: d.node.company,
            plugins: d.node.plugins,
            data_dir: d.node.data_dir,
            json: d.json,
        }),
        Command::Version { json } => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({ "name": "crewlet", "version": crate::VERSION })
                );
            } else {
                println!("crewlet {}", crate::VERSION);
            }
            0
        }
    }
}

fn secrets(cmd: SecretsCmd) -> i32 {
    use crate::secrets_cli::{Offline, cli_list, cli_remove, cli_rotate, cli_set};
    let done = match cmd {
        SecretsCmd::Set {
            name,
            api,
            data_dir,
            keyring,
        } => {
            let offline = data_dir.map(|data_dir| Offline { data_dir, keyring });
            cli_set(&api, &name, &mut std::io::stdin().lock(), offline.as_ref())
        }
        SecretsCmd::RotateKey { api } => cli_rotate(&api),
        SecretsCmd::List { api } => cli_list(&api),
        SecretsCmd::Rm { name, api } => cli_remove(&api, &name),
    };
    match done {
        Ok(out) => {
            let out = out.trim_end();
            if !out.is_empty() {
                println!("{out}");
            }
            0
        }
        Err(e) => {
            eprintln!("crewlet: {e}");
            e.exit_code()
        }
    }
}

/// A JSON command over the API (`crewlet tokens …`, `crewlet agents …`):
/// answers what to print, or an error line.
/// `crewlet estate evict|readmit`: the node and the audited reason.
fn audited(node_api: &ApiArgs, path: &str, node: &str, reason: &str) -> i32 {
    let body = serde_json::json!({ "node": node, "reason": reason });
    printed(api_request(
        node_api,
        "POST",
        path,
        body.to_string().as_bytes(),
    ))
}

fn api_request(node: &ApiArgs, method: &str, path: &str, body: &[u8]) -> Result<String, String> {
    let headers = [("content-type", "application/json")];
    match crate::client::request_to(node.node(), method, path, &headers, body) {
        Ok((200 | 201, body)) => Ok(body),
        Ok((status, body)) => Err(format!("the node answered {status}: {}", body.trim())),
        Err(e) => Err(e.to_string()),
    }
}

fn agents(cmd: AgentsCmd) -> i32 {
    let done = match cmd {
        AgentsCmd::Pause {
            handle,
            reason,
            node,
        } => {
            let body = serde_json::json!({ "reason": reason });
            let path = format!("/agents/{handle}/pause");
            api_request(&node, "POST", &path, body.to_string().as_bytes())
        }
        AgentsCmd::Resume { handle, node } => {
            api_request(&node, "POST", &format!("/agents/{handle}/resume"), b"")
        }
        AgentsCmd::Memory { handle, show } => {
            return crate::client::shown(
                show.node.node(),
                &format!("/agents/{handle}/memory"),
                show.json,
                crewlet_fleet::render_memory,
            );
        }
    };
    printed(done)
}

fn chat(cmd: ChatCmd) -> i32 {
    use crewlet_mcp::chat::company::segment;
    match cmd {
        ChatCmd::Send {
            channel,
            thread,
            text,
            node,
        } => {
            let body = serde_json::json!({ "text": text, "thread": thread });
            let path = format!("/chat/channels/{}/messages", segment(&channel));
            printed(api_request(
                &node,
                "POST",
                &path,
                body.to_string().as_bytes(),
            ))
        }
        ChatCmd::Read {
            channel,
            thread,
            show,
        } => {
            let mut path = format!("/chat/channels/{}/messages", segment(&channel));
            if let Some(t) = thread {
                path.push_str(&format!("?thread={}", segment(&t)));
            }
            crate::client::shown(show.node.node(), &path, show.json, crewlet_chat::render)
        }
    }
}

/// Prints a command's answer; answers its exit status.
fn printed(done: Result<String, String>) -> i32 {
    match done {
        Ok(out) => {
            println!("{}", out.trim_end());
            0
        }
        Err(e) => {
            eprintln!("crewlet: {e}");
            1
        }
    }
}

fn tokens(cmd: TokensCmd) -> i32 {
    use crewlet_tokens::parse_ttl;
    let cli = api_request;
    let done = match cmd {
        TokensCmd::Create {
            scope,
            ttl,
            name,
            node,
        } => {
            let ttl = match ttl.as_deref().map(parse_ttl).transpose() {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("crewlet: {e}");
                    return 2;
                }
            };
            let body = serde_json::json!({ "scope": scope, "name": name, "ttl_seconds": ttl });
            cli(&node, "POST", "/tokens", body.to_string().as_bytes())
        }
        TokensCmd::List { node } => cli(&node, "GET", "/tokens", b""),
        TokensCmd::Revoke { id, node } => cli(&node, "DELETE", &format!("/tokens/{id}"), b""),
    };
    printed(done)
}

fn sample(to: &str, channel: &str, text: &str, secret_env: &str, api: &str) -> i32 {
    let Some(secret) = std::env::var(secret_env).ok().filter(|s| !s.is_empty()) else {
        eprintln!(
            "crewlet: {}",
            crate::sample::SampleError::NoSecret(secret_env.to_owned())
        );
        return 2;
    };
    let sent = crate::sample::send_slack(&crate::sample::Sample {
        api,
        handle: to,
        channel,
        text,
        secret: &secret,
    });
    match sent {
        Ok(done) => {
            println!("{done}");
            0
        }
        Err(e) => {
            eprintln!("crewlet: {e}");
            1
        }
    }
}

/// `crewlet config import`: exit 2 on a refused document or configuration.
fn import_config(
    file: &std::path::Path,
    api: &str,
    data_dir: Option<&PathBuf>,
    config: Option<&std::path::Path>,
    wait: std::time::Duration,
) -> i32 {
    let env = |name: &str| std::env::var(name).ok();
    let node = match crewlet_config::NodeConfig::load(config, &Default::default(), &env) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("crewlet: {e}");
            return 2;
        }
    };
    match crate::config_import::import(file, api, data_dir, &node, wait) {
        Ok(done) => {
            println!("{done}");
            0
        }
        Err(e) => {
            eprintln!("crewlet: {e}");
            e.exit_code()
        }
    }
}

fn mcp_chat() -> i32 {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("crewlet mcp chat: cannot start a runtime: {e}");
            return 1;
        }
    };
    match rt.block_on(crewlet_mcp::chat::serve_stdio()) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("crewlet mcp chat: {e}");
            2
        }
    }
}

/// One `crewlet plugins check`: the report printed, the exit status.
fn check_once(dirs: &[PathBuf]) -> i32 {
    match crewlet_plugins::check(dirs) {
        Ok(report) => {
            print!("{report}");
            if report.is_ok() { 0 } else { 1 }
        }
        Err(e) => {
            eprintln!("crewlet: {e}");
            1
        }
    }
}

fn plugins(cmd: PluginsCmd) -> i32 {
    match cmd {
        PluginsCmd::Check { dirs, watch: false } => check_once(&dirs),
        PluginsCmd::Check { dirs, watch: true } => {
            use crewlet_catalog::reload::{stamp_all, wait_for_change};
            let mut stamps = stamp_all(&dirs);
            loop {
                let at = time::OffsetDateTime::now_utc();
                println!(
                    "--- checked at {:02}:{:02}:{:02} UTC ---",
                    at.hour(),
                    at.minute(),
                    at.second()
                );
                check_once(&dirs);
                use std::io::Write;
                let _ = std::io::stdout().flush();
                stamps = wait_for_change(&dirs, &stamps);
            }
        }
        PluginsCmd::List {
            api: Some(api),
            effective,
            ..
        } => match crate::client::request(&api, "GET", "/plugins", &[], b"") {
            Ok((200, body)) => {
                let view: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                match effective {
                    true => print!("{}", crewlet_catalog::render_effective(&view)),
                    false => print!("{}", crewlet_catalog::render_live(&view)),
                }
                0
            }
            Ok((status, body)) => {
                eprintln!("crewlet: GET /plugins answered {status}: {body}");
                1
            }
            Err(e) => {
                eprintln!("crewlet: {e}");
                1
            }
        },
        PluginsCmd::List {
            dirs,
            api: None,
            config: Some(file),
            effective,
        } => crewlet_catalog::list_granted(&file, &dirs, effective),
        PluginsCmd::List {
            dirs,
            api: None,
            config: None,
            effective,
        } => match crewlet_plugins::list(&dirs) {
            Ok(list) if effective => {
                let plugins = list.catalogue.plugins.iter();
                let rows: Vec<_> = plugins
                    .map(crewlet_plugins::effective::PluginRows::of)
                    .collect();
                print!("{}", crewlet_plugins::effective::render(&rows));
                0
            }
            Ok(list) => {
                print!("{list}");
                0
            }
            Err(e) => {
                eprintln!("crewlet: {e}");
                1
            }
        },
        PluginsCmd::Try {
            name,
            request,
            dirs,
            json,
        } => crate::plugin_try::try_plugin(&name, &request, &dirs, json),
        PluginsCmd::New { kind, name, dir } => {
            let Some(kind) = crewlet_plugins::Kind::parse(&kind) else {
                eprintln!("crewlet: --kind {kind:?}: expected webhook, provider or module");
                return 2;
            };
            match crewlet_plugins::scaffold(kind, &name, &dir) {
                Ok(report) => {
                    print!("{report}");
                    0
                }
                Err(e) => {
                    eprintln!("crewlet: {e}");
                    1
                }
            }
        }
    }
}

/// `crewlet backup DIR`: the node writes the artefact; its manifest printed.
fn backup(args: BackupArgs) -> i32 {
    let dir = match std::path::absolute(&args.dir) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("crewlet: {}: {e}", args.dir.display());
            return 1;
        }
    };
    let body = serde_json::json!({ "dir": dir }).to_string();
    let headers = [("Content-Type", "application/json")];
    match crate::client::request_to(
        args.node.node(),
        "POST",
        "/backup",
        &headers,
        body.as_bytes(),
    ) {
        Ok((200, answer)) => {
            println!("{}", answer.trim_end());
            0
        }
        Ok((status, answer)) => {
            eprintln!("crewlet: the node answered {status}: {}", answer.trim());
            1
        }
        Err(e) => {
            eprintln!("crewlet: {e}");
            1
        }
    }
}
