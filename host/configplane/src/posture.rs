//! The posture rule: what a node does about the fleet's active epoch,
//! picked from what it sees of the pointer and of its peers (the rules are
//! in the crate's docs). Pure: no I/O, tested as a table.

use std::time::Duration;

use crewlet_os::ConfigEpoch;

/// How long a node behind the pointer, while a peer has applied its epoch,
/// waits before it sheds: five polls — a healthy node applies within one,
/// so only a node that cannot apply gets here.
pub const SHED_GRACE: Duration = Duration::from_secs(10);
/// How long a node may fail to apply the pointer's revision (its document
/// missing, malformed or refused by this build) before it is stuck: five
/// polls, enough for a document written just after its pointer to land.
pub const STUCK_AFTER: Duration = Duration::from_secs(10);

/// The node's config posture: what it does about the fleet's active epoch
/// (picked by [`decide`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Posture {
    /// Applied the pointer's epoch (or nothing is activated yet).
    Serve,
    /// Behind, but no peer has the epoch either (or not for long): ready.
    Wait,
    /// Behind while peers serve the epoch: not ready, consumes nothing.
    Shed,
    /// The pointer cannot be read: keeps serving the last applied epoch.
    Isolated,
    /// Failed to apply the pointer's revision for too long: not ready.
    Stuck,
}

impl Posture {
    pub fn as_str(self) -> &'static str {
        match self {
            Posture::Serve => "serve",
            Posture::Wait => "wait",
            Posture::Shed => "shed",
            Posture::Isolated => "isolated",
            Posture::Stuck => "stuck",
        }
    }

    /// Whether this node takes triggers off the stream (everything but shed).
    pub fn admits(self) -> bool {
        self != Posture::Shed
    }
}

/// The posture with why, as `/health` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostureReport {
    pub posture: Posture,
    pub reason: String,
    /// The epoch the pointer named when the posture was picked.
    pub pointer_epoch: Option<ConfigEpoch>,
}

/// What the reconciler could see of the pointer on one poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PointerSeen {
    /// Neither the pointer nor the revision it names could be read.
    Unreadable(String),
    Unset,
    Set(ConfigEpoch),
}

/// What the reconciler could see of its peers' statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeersSeen {
    /// Not read (this node is not behind) or unreadable: unknown.
    Unknown,
    /// How many peers report having applied the pointer's epoch.
    Known { with_epoch: usize, others: usize },
}

/// Everything a posture is picked from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub pointer: PointerSeen,
    pub applied: Option<ConfigEpoch>,
    /// How long this node has been behind the pointer's epoch.
    pub behind_for: Duration,
    /// How long this node has failed to apply it, and why (if it has).
    pub failing: Option<(Duration, String)>,
    pub peers: PeersSeen,
}

/// Picks the posture (the rules are in the module docs).
pub fn decide(seen: &Seen) -> PostureReport {
    let report = |posture, reason: String, epoch| PostureReport {
        posture,
        reason,
        pointer_epoch: epoch,
    };
    let applied = match seen.applied {
        Some(e) => format!("epoch {e}"),
        None => "the company it started with".to_owned(),
    };
    let epoch = match &seen.pointer {
        PointerSeen::Unreadable(why) => {
            return report(
                Posture::Isolated,
                format!("the config pointer cannot be read ({why}); serving {applied}"),
                None,
            );
        }
        PointerSeen::Unset => {
            return report(
                Posture::Serve,
                "no company revision is activated; serving the company this node started with"
                    .into(),
                None,
            );
        }
        PointerSeen::Set(epoch) => *epoch,
    };
    if seen.applied == Some(epoch) {
        return report(
            Posture::Serve,
            format!("applied epoch {epoch}"),
            Some(epoch),
        );
    }
    if let PeersSeen::Known { with_epoch, .. } = seen.peers
        && with_epoch > 0
        && seen.behind_for >= SHED_GRACE
    {
        return report(
            Posture::Shed,
            format!(
                "behind epoch {epoch} for {}s while {with_epoch} peer(s) serve it; serving {applied}, taking no triggers",
                seen.behind_for.as_secs()
            ),
            Some(epoch),
        );
    }
    if let Some((failing_for, why)) = &seen.failing {
        if *failing_for >= STUCK_AFTER {
            return report(
                Posture::Stuck,
                format!(
                    "cannot apply epoch {epoch} for {}s: {why}",
                    failing_for.as_secs()
                ),
                Some(epoch),
            );
        }
        return report(
            Posture::Wait,
            format!("cannot apply epoch {epoch} yet: {why}; serving {applied}"),
            Some(epoch),
        );
    }
    report(
        Posture::Wait,
        format!("applying epoch {epoch}; serving {applied}"),
        Some(epoch),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(pointer: PointerSeen, applied: Option<u64>) -> Seen {
        let applied = applied.map(ConfigEpoch);
        Seen {
            pointer,
            applied,
            behind_for: Duration::ZERO,
            failing: None,
            peers: PeersSeen::Unknown,
        }
    }

    #[test]
    fn postures_follow_the_rules() {
        use Posture::*;
        let p = |s: &Seen| decide(s).posture;
        assert_eq!(p(&seen(PointerSeen::Set(ConfigEpoch(7)), Some(7))), Serve);
        assert_eq!(p(&seen(PointerSeen::Unset, None)), Serve);
        assert_eq!(
            p(&seen(PointerSeen::Unreadable("down".into()), Some(7))),
            Isolated
        );
        // Behind: waits while applying, however long, if no peer is ahead.
        let mut s = seen(PointerSeen::Set(ConfigEpoch(8)), Some(7));
        assert_eq!(p(&s), Wait);
        s.behind_for = Duration::from_secs(3600);
        s.peers = PeersSeen::Known {
            with_epoch: 0,
            others: 2,
        };
        assert_eq!(p(&s), Wait, "nobody has the epoch: not shedding");
        s.peers = PeersSeen::Unknown;
        assert_eq!(p(&s), Wait, "unknown peers are not peers ahead");
        // Lag alone never sheds: a peer ahead but within the grace.
        s.peers = PeersSeen::Known {
            with_epoch: 1,
            others: 0,
        };
        s.behind_for = SHED_GRACE - Duration::from_millis(1);
        assert_eq!(p(&s), Wait);
        s.behind_for = SHED_GRACE;
        assert_eq!(p(&s), Shed);
        // Failing to apply: wait, then stuck (unless a peer has it: shed).
        let mut s = seen(PointerSeen::Set(ConfigEpoch(8)), Some(7));
        s.failing = Some((Duration::from_secs(1), "refused".into()));
        assert_eq!(p(&s), Wait);
        s.failing = Some((STUCK_AFTER, "refused".into()));
        let r = decide(&s);
        assert_eq!((r.posture, r.pointer_epoch), (Stuck, Some(ConfigEpoch(8))));
        assert!(r.reason.contains("refused"), "{}", r.reason);
        s.behind_for = SHED_GRACE;
        s.peers = PeersSeen::Known {
            with_epoch: 2,
            others: 0,
        };
        assert_eq!(p(&s), Shed);
    }
}
