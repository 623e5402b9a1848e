//! The node's file descriptors: its own needs come before its sockets'.
//!
//! At start the soft `RLIMIT_NOFILE` is raised to the hard limit, and the
//! HTTP edge may hold at most half of it, so the broker's restart, SQLite,
//! MCP children and the NATS connection never fail for want of a
//! descriptor however many clients connect.

use tracing::warn;

/// Raises the soft descriptor limit to the hard one and answers it: the
/// node's own needs (the broker's restart, SQLite, MCP children, the NATS
/// connection) must never fail because sockets took every descriptor.
pub fn reserve() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own; no other effect.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we own; raising the soft limit
        // to the hard one needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        }
    }
    lim.rlim_cur
}

/// The connection cap: the configured one, else 1024 — and never more than
/// half the descriptors, the other half kept for the node itself.
pub fn connection_cap(configured: Option<usize>, descriptors: u64) -> usize {
    let ceiling = usize::try_from(descriptors / 2)
        .unwrap_or(usize::MAX)
        .max(1);
    let wanted = configured.unwrap_or(1024);
    if wanted > ceiling {
        warn!(
            subsystem = "api",
            wanted,
            ceiling,
            descriptors,
            "api.max_connections is above half the descriptor limit; serving at most {ceiling} connections (raise the limit with ulimit -n)"
        );
    }
    wanted.min(ceiling)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_half_the_descriptors_to_the_node() {
        assert_eq!(connection_cap(None, 65_536), 1024);
        assert_eq!(connection_cap(None, 256), 128);
        assert_eq!(connection_cap(Some(4), 256), 4);
        assert_eq!(connection_cap(Some(5000), 256), 128);
        assert!(reserve() >= 1);
    }
}
