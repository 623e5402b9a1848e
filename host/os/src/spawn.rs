//! Children that die with their parent.
//!
//! The rule: a child Crewlet starts (nats-server, an MCP server, a node under
//! test) gets SIGKILL when its parent goes (`PR_SET_PDEATHSIG`), however the
//! parent goes — a SIGKILL to the node leaves no broker or MCP child holding
//! ports and store locks. Two facts shape it:
//! - The signal fires when the *thread* that forked the child ends, not the
//!   process; callers fork from threads that live as long as the process
//!   (runtime workers, a spawner thread).
//! - The parent may die between fork and `prctl`; the child then checks that
//!   its parent is still the one that forked it and exits at once if not.
//!
//! A `prctl` that fails fails the spawn: a child that would outlive its
//! parent is not started.

use std::io;

/// Ties a command's child to the thread that spawns it (see the module docs).
pub trait DieWithParent {
    /// Installs the hook that runs in the child between fork and exec.
    fn die_with_parent(&mut self) -> &mut Self;
}

impl DieWithParent for std::process::Command {
    fn die_with_parent(&mut self) -> &mut Self {
        use std::os::unix::process::CommandExt;
        // SAFETY: the hook makes only async-signal-safe calls (`prctl`,
        // `getppid`, `_exit`) and allocates nothing, as code between fork
        // and exec must.
        unsafe { self.pre_exec(hook()) }
    }
}

impl DieWithParent for tokio::process::Command {
    fn die_with_parent(&mut self) -> &mut Self {
        // SAFETY: as for `std::process::Command`: the hook makes only
        // async-signal-safe calls and allocates nothing.
        unsafe { self.pre_exec(hook()) }
    }
}

/// The hook itself, run in the forked child.
fn hook() -> impl FnMut() -> io::Result<()> + Send + Sync + 'static {
    let parent = std::process::id() as libc::pid_t;
    move || {
        // SAFETY: `prctl(PR_SET_PDEATHSIG, sig)` reads no memory of ours.
        if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `getppid` cannot fail and touches no memory.
        if unsafe { libc::getppid() } != parent {
            // SAFETY: `_exit` ends the child without running the parent's
            // atexit handlers or flushing its copied buffers.
            unsafe { libc::_exit(1) };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tied_child_runs_and_exits() {
        let status = std::process::Command::new("true")
            .die_with_parent()
            .status()
            .expect("spawn `true`");
        assert!(status.success());
    }

    #[tokio::test]
    async fn a_tied_tokio_child_runs_and_exits() {
        let status = tokio::process::Command::new("true")
            .die_with_parent()
            .status()
            .await
            .expect("spawn `true`");
        assert!(status.success());
    }

    #[test]
    fn the_child_gets_sigkill_when_the_forking_thread_ends() {
        let child = std::thread::spawn(|| {
            std::process::Command::new("sleep")
                .arg("30")
                .die_with_parent()
                .spawn()
                .expect("spawn `sleep`")
        })
        .join()
        .expect("forking thread");
        let mut child = child;
        let status = child.wait().expect("wait for the child");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }
}
