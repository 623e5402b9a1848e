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
    /// Print the version of this binary.
    Version {
        /// Print as JSON.
        #[arg(long)]
        json: bool,
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
