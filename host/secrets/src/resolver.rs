//! [`Resolver`]: the one way a part of the node reads a secret by name.
//!
//! The webhook edge (signing secrets), MCP launch templates (`${NAME}`) and
//! model credentials all hold one. Its answer is three-valued, because a
//! secret this node cannot open is not the same as one nobody set: the
//! first is a 503 (retry once the keyring is fixed), the second a
//! configuration mistake, and neither may be served as an empty value.

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
}

impl std::fmt::Debug for Lookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lookup::Found(_) => f.write_str("Found([redacted])"),
            Lookup::Unset => f.write_str("Unset"),
            Lookup::Unavailable(why) => f.debug_tuple("Unavailable").field(why).finish(),
        }
    }
}

impl Lookup {
    /// The value, when found.
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
