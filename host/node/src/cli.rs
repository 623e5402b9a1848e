//! The `crewlet` command line.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use crewlet_config::LogFormat;

use crate::run::{RunArgs, run};

/// Crewlet runs a company of AI agents: seats woken by work arriving from
/// the surfaces your company already uses, thinking with an LLM, acting
/// through MCP tool servers, and replying as themselves.
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
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// Print each plugin's effective permissions: routes and secrets,
    /// outbound hosts, buckets owned and read, limits.
    List {
        #[arg(value_name = "DIR", default_value = "plugins")]
        dir: PathBuf,
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
        #[arg(long, value_name = "URL", default_value = crate::configplane::DEFAULT_API)]
        api: String,
        /// A node's data dir: used directly when no node holds it.
        #[arg(long, value_name = "DIR", env = "CREWLET_DATA_DIR")]
        data_dir: Option<PathBuf>,
    },
}

#[derive(Debug, clap::Args)]
struct RunCmd {
    /// Node configuration (TOML). Without one every key takes its default.
    #[arg(long, value_name = "node.toml", env = "CREWLET_CONFIG")]
    config: Option<PathBuf>,
    /// The company document to run (TOML).
    #[arg(long, value_name = "company.toml", env = "CREWLET_COMPANY")]
    company: Option<PathBuf>,
    /// Folder holding the plugins (each with its plugin.toml).
    #[arg(long, value_name = "DIR", env = "CREWLET_PLUGINS")]
    plugins: Option<PathBuf>,
    /// Data dir; overrides `node.data_dir`.
    #[arg(long, value_name = "DIR", env = "CREWLET_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Log format; overrides `logging.format`.
    #[arg(long, value_enum, value_name = "FORMAT")]
    log_format: Option<LogFormatArg>,
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
            config: cmd.config,
            company: cmd.company,
            plugins: cmd.plugins,
            data_dir: cmd.data_dir,
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
        }) => match crate::configplane::import(&file, &api, data_dir.as_ref()) {
            Ok(done) => {
                println!("{done}");
                0
            }
            Err(e) => {
                eprintln!("crewlet: {e}");
                e.exit_code()
            }
        },
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

fn plugins(cmd: PluginsCmd) -> i32 {
    match cmd {
        PluginsCmd::Check { dir } => match crewlet_plugins::check(&dir) {
            Ok(report) => {
                print!("{report}");
                if report.is_ok() { 0 } else { 1 }
            }
            Err(e) => {
                eprintln!("crewlet: {e}");
                1
            }
        },
        PluginsCmd::List { dir } => match crewlet_plugins::list(&dir) {
            Ok(list) => {
                print!("{list}");
                0
            }
            Err(e) => {
                eprintln!("crewlet: {e}");
                1
            }
        },
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
