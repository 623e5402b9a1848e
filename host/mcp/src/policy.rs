//! Which programs a company document may make this node run.
//!
//! Rule: a stdio server runs only if its program, after every symlink and
//! `..` is resolved, is one the node's own file allows (`[mcp]` in Tier A,
//! see `crewlet_config::mcp`), its `args` start with that entry's pinned
//! arguments, its `cwd` lies under an allowed directory, and its `env` sets
//! no loader variable (`LD_*`, `DYLD_*`: they make any allowed program run
//! other code). Why: the document is Tier B, accepted over the API; the
//! file is Tier A, written by whoever runs the node. The check runs when a
//! document is accepted (so a refused one names its key) and again at every
//! spawn (so a revision accepted before the allow-list shrank, or by a node
//! with a wider one, does not run here).
//!
//! Matching is on canonical paths: `/bin/../bin/sh`, a symlink to a refused
//! program and a relative path cannot pass for an allowed one. A bare name
//! (`node`) is looked up on the node's `PATH` (absolute entries only) and
//! then matched the same way; the child is started by the canonical path,
//! so what runs is what was checked. A multi-call binary (busybox) allowed
//! under one name is allowed under all of them: its canonical file is one.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crewlet_company::{Company, DocError, McpTransport};
use crewlet_config::{AllowedCommand, McpConfig};

/// Environment variable prefixes a document may not set on a child.
const LOADER_PREFIXES: &[&str] = &["LD_", "DYLD_"];

/// The node's allow-list, with its own executable for `crewlet`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandPolicy {
    own_exe: Option<PathBuf>,
    commands: Vec<AllowedCommand>,
    dirs: Vec<PathBuf>,
    path_var: Option<OsString>,
}

/// What a checked server is started as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    /// The canonical program: what is executed.
    pub program: PathBuf,
    pub cwd: Option<PathBuf>,
}

/// Why a server's launch is refused; the text says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(
        "{command:?} is a relative path, which would depend on the node's working directory; give an absolute path or a bare program name"
    )]
    Relative { command: String },
    #[error("{command:?} cannot be run here: {why}")]
    NotFound { command: String, why: String },
    #[error(
        "{command:?} (which is {}) is not in this node's `[mcp] allowed_commands`; ask the node's operator to allow it in the node's configuration file, or use an allowed program",
        .resolved.display()
    )]
    NotAllowed { command: String, resolved: PathBuf },
    #[error(
        "{command:?} is allowed here only with arguments starting {prefix:?}; change `args` or ask the node's operator to allow these"
    )]
    Args {
        command: String,
        prefix: Vec<String>,
    },
    #[error("expected an absolute directory, found {cwd:?}")]
    CwdRelative { cwd: String },
    #[error("{cwd:?} cannot be used as a working directory here: {why}")]
    CwdNotFound { cwd: String, why: String },
    #[error(
        "{cwd:?} (which is {}) is not under this node's `[mcp] allowed_dirs`; ask the node's operator to allow it, or remove `cwd`",
        .resolved.display()
    )]
    CwdNotAllowed { cwd: String, resolved: PathBuf },
    #[error(
        "`{name}` changes which code the program loads, so a document may not set it; remove it from `env`"
    )]
    LoaderEnv { name: String },
}

impl Refused {
    /// The key of the server's spec the refusal is about.
    pub fn key(&self) -> String {
        match self {
            Refused::Relative { .. } | Refused::NotFound { .. } | Refused::NotAllowed { .. } => {
                "command".into()
            }
            Refused::Args { .. } => "args".into(),
            Refused::CwdRelative { .. }
            | Refused::CwdNotFound { .. }
            | Refused::CwdNotAllowed { .. } => "cwd".into(),
            Refused::LoaderEnv { name } => format!("env.{name}"),
        }
    }
}

impl CommandPolicy {
    /// The node's `[mcp]` section; `own_exe` is what `crewlet` names.
    pub fn new(config: &McpConfig, own_exe: Option<PathBuf>) -> CommandPolicy {
        CommandPolicy {
            own_exe,
            commands: config.allowed_commands.clone(),
            dirs: config.allowed_dirs.clone(),
            path_var: std::env::var_os("PATH"),
        }
    }

    /// The default section for this process (only `crewlet mcp …`).
    pub fn builtin_only() -> CommandPolicy {
        CommandPolicy::new(&McpConfig::default(), std::env::current_exe().ok())
    }

    /// Checks one stdio server's launch values.
    pub fn check<'a>(
        &self,
        command: &str,
        args: &[String],
        env_names: impl IntoIterator<Item = &'a String>,
        cwd: Option<&str>,
    ) -> Result<Allowed, Refused> {
        for name in env_names {
            let upper = name.to_ascii_uppercase();
            if LOADER_PREFIXES.iter().any(|p| upper.starts_with(p)) {
                return Err(Refused::LoaderEnv { name: name.clone() });
            }
        }
        let program = self.resolve(command)?;
        let own = self
            .own_exe
            .as_deref()
            .and_then(|p| std::fs::canonicalize(p).ok());
        let mut arg_refusal = None;
        for entry in &self.commands {
            let candidate = match &entry.program {
                None => own.clone(),
                Some(p) => std::fs::canonicalize(p).ok(),
            };
            if candidate.as_deref() != Some(program.as_path()) {
                continue;
            }
            if args.starts_with(&entry.args_prefix) {
                return Ok(Allowed {
                    program,
                    cwd: self.check_cwd(cwd)?,
                });
            }
            arg_refusal.get_or_insert_with(|| Refused::Args {
                command: command.to_owned(),
                prefix: entry.args_prefix.clone(),
            });
        }
        Err(arg_refusal.unwrap_or(Refused::NotAllowed {
            command: command.to_owned(),
            resolved: program,
        }))
    }

    /// Every stdio server of `company` this node would refuse, each with
    /// its path in the document.
    pub fn check_company(&self, company: &Company) -> Vec<DocError> {
        let mut errors = Vec::new();
        for (role, r) in &company.roles {
            for (server, s) in &r.mcp {
                if let McpTransport::Stdio {
                    command,
                    args,
                    env,
                    cwd,
                } = &s.transport
                    && let Err(e) = self.check(command, args, env.keys(), cwd.as_deref())
                {
                    errors.push(DocError {
                        path: format!("roles.{role}.mcp.{server}.{}", e.key()),
                        message: e.to_string(),
                    });
                }
            }
        }
        errors
    }

    /// The canonical program `command` names.
    fn resolve(&self, command: &str) -> Result<PathBuf, Refused> {
        let not_found = |why: String| Refused::NotFound {
            command: command.to_owned(),
            why,
        };
        let path = if command == crewlet_config::mcp::OWN_BINARY
            && let Some(own) = &self.own_exe
        {
            own.clone()
        } else if command.contains('/') {
            if !command.starts_with('/') {
                return Err(Refused::Relative {
                    command: command.to_owned(),
                });
            }
            PathBuf::from(command)
        } else if command.is_empty() {
            return Err(not_found("the command is empty".into()));
        } else {
            self.on_path(command)
                .ok_or_else(|| not_found("no executable of that name on the node's PATH".into()))?
        };
        let canonical = std::fs::canonicalize(&path).map_err(|e| not_found(e.to_string()))?;
        if !is_executable(&canonical) {
            return Err(not_found("not an executable file".into()));
        }
        Ok(canonical)
    }

    fn on_path(&self, name: &str) -> Option<PathBuf> {
        let var = self.path_var.as_ref()?;
        std::env::split_paths(var)
            .filter(|dir| dir.is_absolute())
            .map(|dir| dir.join(name))
            .find(|p| is_executable(p))
    }

    fn check_cwd(&self, cwd: Option<&str>) -> Result<Option<PathBuf>, Refused> {
        let Some(cwd) = cwd else {
            return Ok(None);
        };
        if !cwd.starts_with('/') {
            return Err(Refused::CwdRelative {
                cwd: cwd.to_owned(),
            });
        }
        let resolved = std::fs::canonicalize(cwd).map_err(|e| Refused::CwdNotFound {
            cwd: cwd.to_owned(),
            why: e.to_string(),
        })?;
        if !resolved.is_dir() {
            return Err(Refused::CwdNotFound {
                cwd: cwd.to_owned(),
                why: "not a directory".into(),
            });
        }
        let under = self
            .dirs
            .iter()
            .filter_map(|d| std::fs::canonicalize(d).ok())
            .any(|d| resolved.starts_with(d));
        if under {
            Ok(Some(resolved))
        } else {
            Err(Refused::CwdNotAllowed {
                cwd: cwd.to_owned(),
                resolved,
            })
        }
    }
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests;
