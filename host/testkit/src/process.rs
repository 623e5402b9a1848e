//! Freezing a child process the way a test means it.
//!
//! `kill(pid, SIGSTOP)` returns once the signal is queued, not once the
//! process is stopped: the kernel wakes one thread, and that thread stops
//! the others when it next runs. On a loaded machine the rest keep running
//! meanwhile — a frozen node's runtime thread answered a request 3 ms after
//! its SIGSTOP. [`stop`] returns only when every thread is stopped.

use std::time::{Duration, Instant};

/// Sends SIGSTOP and waits until every thread of `pid` is in the stopped
/// state (`T` in `/proc/PID/task/*/stat`). Panics if that takes over 5 s
/// or the signal cannot be sent.
pub fn stop(pid: i32) {
    // SAFETY: kill has no memory effects; the caller names its own child.
    let sent = unsafe { libc::kill(pid, libc::SIGSTOP) };
    assert_eq!(sent, 0, "SIGSTOP to {pid}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !all_stopped(pid) {
        assert!(
            Instant::now() < deadline,
            "process {pid} still running 5 s after SIGSTOP"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether every thread of `pid` is stopped; false while any runs or the
/// task list cannot be read.
fn all_stopped(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut any = false;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            return false;
        };
        // "TID (comm) STATE …": comm may hold spaces and parentheses, the
        // state follows the last ')'.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        if !matches!(state, Some("T")) {
            return false;
        }
        any = true;
    }
    any
}
