//! [`Resolver`]: the one way a part of the node reads a secret by name.
//!
//! The webhook edge (signing secrets), MCP launch templates (`${NAME}`) and
//! model credentials all hold one. Its answer is a value, "unset", or one
//! of two ways of not knowing, and none of them may be served as another:
//! - [`Lookup::Unset`] is the store's answer "nobody set it" (a
//!   configuration mistake);
//! - [`Lookup::Unavailable`] is set but not openable here (retry once the
//!   keyring is fixed: a 503);
//! - [`Lookup::Unknown`] is "the store has not answered yet" (the secrets
//!   bucket is not listed on this node): never "unset", never the
//!   environment's value — a reader waits or retries, it does not go on
//!   without the secret. A separate variant, so every `match` must say what
//!   it does with it.

use std::collections::BTreeMap;
use std::sync::Arc;

/// What a name resolves to.
#[derive(Clone, PartialEq, Eq)]
pub enum Lookup {
    Found(String),
    /// Set nowhere this node looks.
    Unset,
    /// Set, but this node cannot open it; the reason names the secret and
    /// never holds its value.
    Unavailable(String),
    /// Not known yet: the secrets store has not answered this node, so the
    /// name is neither set nor unset. The reason says why and to retry.
    Unknown(String),
}

impl std::fmt::Debug for Lookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lookup::Found(_) => f.write_str("Found([redacted])"),
            Lookup::Unset => f.write_str("Unset"),
            Lookup::Unavailable(why) => f.debug_tuple("Unavailable").field(why).finish(),
            Lookup::Unknown(why) => f.debug_tuple("Unknown").field(why).finish(),
        }
    }
}

impl Lookup {
    /// The value, when found. `None` is every other answer, unknown
    /// included: only for a reader that merely uses a value it has (the
    /// redactor), never to decide that a secret is unset.
    pub fn found(self) -> Option<String> {
        match self {
            Lookup::Found(v) => Some(v),
            _ => None,
        }
    }
}

type Resolve = dyn Fn(&str) -> Lookup + Send + Sync;

/// Resolves secret names. Cheap to clone.
#[derive(Clone)]
pub struct Resolver(Arc<Resolve>);

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Resolver")
    }
}

impl Resolver {
    pub fn new(resolve: impl Fn(&str) -> Lookup + Send + Sync + 'static) -> Resolver {
        Resolver(Arc::new(resolve))
    }

    /// Fixed values (tools, benchmarks and tests); any other name is unset.
    pub fn fixed<K: Into<String>, V: Into<String>>(
        values: impl IntoIterator<Item = (K, V)>,
    ) -> Resolver {
        let values: BTreeMap<String, String> = values
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        Resolver::new(move |name| match values.get(name) {
            Some(v) => Lookup::Found(v.clone()),
            None => Lookup::Unset,
        })
    }

    pub fn lookup(&self, name: &str) -> Lookup {
        (self.0)(name)
    }
}
