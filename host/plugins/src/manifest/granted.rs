//! What the operator's grant did to one manifest, and the one refusal
//! every choke point gives for a permission not held.
//!
//! Rules, and why:
//! - **Held = (declared + added) − denied.** The grant is resolved once,
//!   at load (`crate::grant`), into the manifest's `permissions`: those
//!   are what the runtime enforces. This record keeps what the operator
//!   added and what they denied, each with its configuration key, so a
//!   listing can say where each permission came from.
//! - **One refusal for both** ([`NotHeld`]): a permission the operator
//!   denies is refused exactly like one nobody declared (the guest sees
//!   the same error), and the text names the key that denies it, so the
//!   operator finds the line to change and the author is not blamed.

use std::fmt;
use std::path::PathBuf;

use super::{Origin, ReadDecl};

/// A permission an operator's grant can add or deny.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Permission {
    /// A provider's base URL (the host sets it on every call).
    BaseUrl(String),
    /// An origin a provider may reach.
    Outbound(Origin),
    /// A route a webhook plugin serves.
    Route(String),
    /// The largest body a webhook route reads.
    BodyLimit(u64),
    /// Another module's bucket, read-only.
    Read(ReadDecl),
}

impl Permission {
    /// The kind's name in listings and `GET /plugins` (`outbound`, `read`).
    pub fn kind(&self) -> &'static str {
        match self {
            Permission::BaseUrl(_) => "base_url",
            Permission::Outbound(_) => "outbound",
            Permission::Route(_) => "route",
            Permission::BodyLimit(_) => "body_limit",
            Permission::Read(_) => "read",
        }
    }

    /// What it names (`https://api.openai.com:443`, `notebook.notes`).
    pub fn value(&self) -> String {
        match self {
            Permission::BaseUrl(url) => url.clone(),
            Permission::Outbound(origin) => origin.to_string(),
            Permission::Route(route) => route.clone(),
            Permission::BodyLimit(bytes) => bytes.to_string(),
            Permission::Read(read) => read.to_string(),
        }
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Permission::BaseUrl(url) => write!(f, "base URL {url}"),
            Permission::Outbound(origin) => write!(f, "outbound {origin}"),
            Permission::Route(route) => write!(f, "serves {route}"),
            Permission::BodyLimit(bytes) => write!(f, "bodies up to {bytes} bytes"),
            Permission::Read(read) => write!(f, "reads bucket {read}"),
        }
    }
}

/// One permission the operator's configuration wrote, with its key
/// (`plugins.grants.openai.denied_outbound_hosts[0]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ByOperator {
    pub permission: Permission,
    pub key: String,
}

/// What the operator's grant did to a manifest (empty: nothing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Granted {
    /// Where the grant was read (the node's configuration file).
    pub source: String,
    /// What the operator added beyond the manifest.
    pub added: Vec<ByOperator>,
    /// What the operator denied: none of it is in the manifest's
    /// permissions, whether the manifest declared it or not (a deny
    /// stands for every version of the plugin).
    pub denied: Vec<ByOperator>,
}

impl Granted {
    /// Whether the operator's grant changed anything.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.denied.is_empty()
    }

    /// The key that added `permission`, if the operator added it.
    pub fn added_by(&self, permission: &Permission) -> Option<&str> {
        let found = self.added.iter().find(|a| &a.permission == permission);
        found.map(|a| a.key.as_str())
    }

    /// The key that denies `permission`, if the operator denies it.
    pub fn denied_by(&self, permission: &Permission) -> Option<&str> {
        let found = self.denied.iter().find(|d| &d.permission == permission);
        found.map(|d| d.key.as_str())
    }

    /// Why `permission`, missed by a choke point, is not held: denied by
    /// the operator (naming the key), else never declared nor added.
    pub fn refusal(&self, permission: Permission, manifest: &std::path::Path) -> NotHeld {
        match self.denied_by(&permission) {
            Some(key) => NotHeld::Denied {
                key: key.to_string(),
                file: self.source.clone(),
                permission,
            },
            None => NotHeld::Undeclared {
                manifest: manifest.to_path_buf(),
                permission,
            },
        }
    }
}

impl fmt::Display for Granted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "operator grant in {}", self.source)
    }
}

/// Why a plugin does not hold a permission it used: the one refusal of
/// every choke point, whoever took the permission away.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotHeld {
    /// Neither the manifest declares it nor the operator adds it: the
    /// plugin's author declares it, or the operator grants it.
    #[error(
        "{permission} is not held: {} does not declare it and the operator does not add it (declare it there, or grant it under [plugins.grants])",
        manifest.display()
    )]
    Undeclared {
        permission: Permission,
        manifest: PathBuf,
    },
    /// The operator denies it: the key says where.
    #[error(
        "{permission} is denied by the operator: `{key}` in {file} (remove it there to allow it)"
    )]
    Denied {
        permission: Permission,
        key: String,
        file: String,
    },
}
