//! The buckets: one per retention.
//!
//! Rule: a horizon is a property of the bucket, fixed when the bucket is
//! created, never a per-write TTL. Why: on the embedded broker a per-key TTL
//! is create-only — an update clears it — so a rate window incremented four
//! times would never expire. Two kinds of records in one bucket silently
//! give one of them the other's retention, hence seventeen buckets.
//!
//! Opening adopts a bucket that already exists and never rewrites its
//! configuration (the first node to boot decides; a differing lease TTL is
//! logged and honoured). A bucket with fewer replicas than configured is the
//! one difference a node refuses to start with.

use std::time::Duration;

/// The longest TTL any duty or other non-seat lease may ask for, on every
/// backend; also the age of the duties bucket.
pub const MAX_DUTY_TTL: Duration = Duration::from_secs(3 * 3600);

/// How long a thread is followed after the last post in it: the follows
/// bucket's age (the design's ninety days, where a chat thread stops being
/// live on every backend that ships one).
pub const FOLLOW_AGE: Duration = Duration::from_secs(90 * 24 * 3600);

/// How long the fleet remembers which data node keeps a custody batch: the
/// design's 32 days, past the event log's retention (30 days by default),
/// so a node settling a batch it wrote before a crash always finds the
/// answer while any row of it can be left.
pub const CUSTODY_AGE: Duration = Duration::from_secs(32 * 24 * 3600);

/// Removal markers younger than this are left by the sweep.
pub const MARKER_RETENTION: Duration = Duration::from_secs(3 * 3600);

/// Every shared slot the layer opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Bucket {
    Leases,
    Duties,
    Epochs,
    Config,
    Status,
    Ledger,
    Claims,
    Rate,
    Cooldowns,
    Budgets,
    Fires,
    Secrets,
    Mailboxes,
    Positions,
    Tokens,
    Follows,
    Custody,
}

impl Bucket {
    pub const ALL: [Bucket; 17] = [
        Bucket::Leases,
        Bucket::Duties,
        Bucket::Epochs,
        Bucket::Config,
        Bucket::Status,
        Bucket::Ledger,
        Bucket::Claims,
        Bucket::Rate,
        Bucket::Cooldowns,
        Bucket::Budgets,
        Bucket::Fires,
        Bucket::Secrets,
        Bucket::Mailboxes,
        Bucket::Positions,
        Bucket::Tokens,
        Bucket::Follows,
        Bucket::Custody,
    ];

    /// The short name; the bucket is `{namespace}_{short}`.
    pub fn short(self) -> &'static str {
        match self {
            Bucket::Leases => "leases",
            Bucket::Duties => "duties",
            Bucket::Epochs => "epochs",
            Bucket::Config => "config",
            Bucket::Status => "status",
            Bucket::Ledger => "ledger",
            Bucket::Claims => "claims",
            Bucket::Rate => "rate",
            Bucket::Cooldowns => "cooldowns",
            Bucket::Budgets => "budgets",
            Bucket::Fires => "fires",
            Bucket::Secrets => "secrets",
            Bucket::Mailboxes => "mailboxes",
            Bucket::Positions => "positions",
            Bucket::Tokens => "tokens",
            Bucket::Follows => "follows",
            Bucket::Custody => "custody",
        }
    }

    /// True for the buckets the `local` coordination kind keeps in process.
    pub fn is_lease_store(self) -> bool {
        matches!(self, Bucket::Leases | Bucket::Duties | Bucket::Epochs)
    }

    /// True for the one bucket whose records are never removed (the fencing
    /// counter), so it holds no removal marker to sweep.
    pub fn never_removes(self) -> bool {
        matches!(self, Bucket::Epochs)
    }
}

/// The retention a bucket is created with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketSpec {
    pub bucket: Bucket,
    /// The stream's `max_age`; `None` is "no age".
    pub age: Option<Duration>,
}

/// The ages the layer asks for when it creates buckets.
#[derive(Debug, Clone)]
pub struct Retentions {
    pub lease_ttl: Duration,
    pub status: Duration,
    pub rate: Duration,
}

impl Retentions {
    pub fn spec(&self, bucket: Bucket) -> BucketSpec {
        const H: u64 = 3600;
        const D: u64 = 24 * H;
        let age = match bucket {
            Bucket::Leases => Some(self.lease_ttl),
            Bucket::Duties => Some(MAX_DUTY_TTL),
            Bucket::Status => Some(self.status),
            Bucket::Ledger => Some(Duration::from_secs(7 * D)),
            Bucket::Claims => Some(Duration::from_secs(30 * 60)),
            Bucket::Rate => Some(self.rate),
            Bucket::Cooldowns => Some(Duration::from_secs(D)),
            Bucket::Budgets => Some(Duration::from_secs(32 * D)),
            Bucket::Fires => Some(Duration::from_secs(7 * D)),
            // Ninety days of a thread's last activity (crate::follows).
            Bucket::Follows => Some(FOLLOW_AGE),
            // Past the event log's retention (crate::custody).
            Bucket::Custody => Some(CUSTODY_AGE),
            Bucket::Epochs
            | Bucket::Config
            | Bucket::Secrets
            | Bucket::Mailboxes
            | Bucket::Positions
            | Bucket::Tokens => None,
        };
        BucketSpec { bucket, age }
    }
}

/// Whether the marker sweep covers a bucket, derived from its retention:
/// every ageless bucket except the one that never removes a record.
pub fn swept(spec: &BucketSpec) -> bool {
    spec.age.is_none() && !spec.bucket.never_removes()
}
