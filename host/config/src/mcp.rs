//! `[mcp]`: which programs the company document may make this node run.
//!
//! Rule: the company document (Tier B, changed over the API) names MCP
//! servers, but only this file (Tier A, written by whoever runs the node)
//! says which programs, with which leading arguments and in which working
//! directories, those servers may be. Why: a document is accepted from a
//! token holder over the network; letting it name any program would make
//! write access to the config plane a shell on every node.
//!
//! Entries are absolute paths (relative ones resolve against this file's
//! directory, like every path here) or `crewlet`, this node's own binary,
//! which is only ever allowed as `crewlet mcp …` (its built-in servers). A
//! bare name such as `npx` is refused: it would allow whatever comes first
//! on the `PATH` at spawn time, which the file's author does not control.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The name that stands for this node's own executable.
pub const OWN_BINARY: &str = "crewlet";

/// What an `allowed_commands` entry looks like, for error messages.
const SHAPE: &str = "a program's absolute path, or a table `{ command = \"/path\", args = [\"pinned\", \"leading\", \"args\"] }`";

/// The leading argument the node's own binary is allowed with.
pub const OWN_BINARY_ARGS: &[&str] = &["mcp"];

/// One program the company may run as an MCP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedCommand {
    /// `None`: this node's own executable.
    pub program: Option<PathBuf>,
    /// The arguments a server's `args` must start with (empty: any).
    pub args_prefix: Vec<String>,
}

impl AllowedCommand {
    /// `crewlet mcp …`.
    pub fn own_binary() -> AllowedCommand {
        AllowedCommand {
            program: None,
            args_prefix: OWN_BINARY_ARGS.iter().map(|a| (*a).to_owned()).collect(),
        }
    }
}

/// The `[mcp]` section, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpConfig {
    pub allowed_commands: Vec<AllowedCommand>,
    /// Directories (and everything under them) a server's `cwd` may name.
    pub allowed_dirs: Vec<PathBuf>,
}

impl Default for McpConfig {
    /// Only the node's own built-in servers, in the node's working directory.
    fn default() -> Self {
        McpConfig {
            allowed_commands: vec![AllowedCommand::own_binary()],
            allowed_dirs: Vec::new(),
        }
    }
}

pub(crate) mod raw {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Pinned {
        pub command: String,
        #[serde(default)]
        pub args: Vec<String>,
    }

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct Mcp {
        /// A path, or a `{ command, args }` table; read by hand so a bad
        /// entry gets a sentence, not serde's "no variant matched".
        pub allowed_commands: Option<Vec<toml::Value>>,
        pub allowed_dirs: Vec<PathBuf>,
    }
}

impl raw::Mcp {
    /// `Err((key, message))` for the first bad entry.
    pub(crate) fn validate(self, base: &Path) -> Result<McpConfig, (String, String)> {
        let resolve = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };
        let mut allowed_commands = Vec::new();
        let entries = match self.allowed_commands {
            Some(e) => e,
            None => {
                return Ok(McpConfig {
                    allowed_dirs: self.allowed_dirs.into_iter().map(resolve).collect(),
                    ..McpConfig::default()
                });
            }
        };
        for (i, entry) in entries.into_iter().enumerate() {
            let key = format!("mcp.allowed_commands[{i}]");
            let (command, args) = match entry {
                toml::Value::String(c) => (c, Vec::new()),
                table @ toml::Value::Table(_) => match table.try_into::<raw::Pinned>() {
                    Ok(p) => (p.command, p.args),
                    Err(e) => return Err((key, format!("{}: expected {SHAPE}", e.message()))),
                },
                other => {
                    return Err((
                        key,
                        format!("found a {}: expected {SHAPE}", other.type_str()),
                    ));
                }
            };
            if command == OWN_BINARY {
                if !args.is_empty() && !args.starts_with(&[OWN_BINARY_ARGS[0].to_owned()]) {
                    return Err((
                        format!("{key}.args"),
                        "this node's own binary is allowed only as `crewlet mcp …`; remove `args` or start them with \"mcp\"".into(),
                    ));
                }
                let mut own = AllowedCommand::own_binary();
                if args.len() > own.args_prefix.len() {
                    own.args_prefix = args;
                }
                allowed_commands.push(own);
                continue;
            }
            if command.is_empty() {
                return Err((
                    key,
                    "expected a program's path, found an empty string".into(),
                ));
            }
            if !command.contains('/') {
                return Err((
                    key,
                    format!(
                        "{command:?} is a bare name: give the program's absolute path (e.g. the output of `command -v {command}`), since a name allows whatever comes first on the PATH"
                    ),
                ));
            }
            allowed_commands.push(AllowedCommand {
                program: Some(resolve(PathBuf::from(command))),
                args_prefix: args,
            });
        }
        let mut allowed_dirs = Vec::new();
        for (i, dir) in self.allowed_dirs.into_iter().enumerate() {
            if dir.as_os_str().is_empty() {
                return Err((
                    format!("mcp.allowed_dirs[{i}]"),
                    "expected a directory, found an empty path".into(),
                ));
            }
            allowed_dirs.push(resolve(dir));
        }
        Ok(McpConfig {
            allowed_commands,
            allowed_dirs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<McpConfig, (String, String)> {
        let raw: raw::Mcp = toml::from_str(text).unwrap();
        raw.validate(Path::new("/etc/crewlet"))
    }

    #[test]
    fn absent_means_only_the_built_in_servers() {
        let cfg = parse("").unwrap();
        assert_eq!(cfg, McpConfig::default());
        assert_eq!(cfg.allowed_commands, vec![AllowedCommand::own_binary()]);
        assert!(cfg.allowed_dirs.is_empty());
    }

    #[test]
    fn paths_resolve_against_the_file_and_pins_keep_their_args() {
        let cfg = parse(
            r#"
            allowed_commands = ["/usr/bin/npx", "bin/server", { command = "/usr/bin/python3", args = ["-m", "mcp_fs"] }, "crewlet"]
            allowed_dirs = ["work", "/srv/mcp"]
            "#,
        )
        .unwrap();
        assert_eq!(
            cfg.allowed_commands[0].program.as_deref(),
            Some(Path::new("/usr/bin/npx"))
        );
        assert!(cfg.allowed_commands[0].args_prefix.is_empty());
        assert_eq!(
            cfg.allowed_commands[1].program.as_deref(),
            Some(Path::new("/etc/crewlet/bin/server"))
        );
        assert_eq!(cfg.allowed_commands[2].args_prefix, ["-m", "mcp_fs"]);
        assert_eq!(cfg.allowed_commands[3], AllowedCommand::own_binary());
        assert_eq!(
            cfg.allowed_dirs,
            [
                PathBuf::from("/etc/crewlet/work"),
                PathBuf::from("/srv/mcp")
            ]
        );
    }

    #[test]
    fn an_empty_list_allows_nothing() {
        assert!(
            parse("allowed_commands = []")
                .unwrap()
                .allowed_commands
                .is_empty()
        );
    }

    #[test]
    fn a_bare_name_is_refused_with_the_way_out() {
        let (key, msg) = parse(r#"allowed_commands = ["/bin/cat", "npx"]"#).unwrap_err();
        assert_eq!(key, "mcp.allowed_commands[1]");
        assert!(msg.contains("command -v npx"), "{msg}");
    }

    #[test]
    fn the_own_binary_cannot_be_allowed_beyond_mcp() {
        let (key, msg) =
            parse(r#"allowed_commands = [{ command = "crewlet", args = ["run"] }]"#).unwrap_err();
        assert_eq!(key, "mcp.allowed_commands[0].args");
        assert!(msg.contains("crewlet mcp"), "{msg}");
        let pinned =
            parse(r#"allowed_commands = [{ command = "crewlet", args = ["mcp", "chat"] }]"#)
                .unwrap();
        assert_eq!(pinned.allowed_commands[0].args_prefix, ["mcp", "chat"]);
    }
}
