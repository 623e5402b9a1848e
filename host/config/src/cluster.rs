//! `[stream.cluster]`: embedded brokers that cluster with each other.
//!
//! Rule: a small fleet needs no external NATS. Each node's own nats-server
//! joins its peers over routes (`listen`, `routes`) under one cluster
//! `name`, and the fleet's streams and buckets are replicated across them
//! at `stream.replicas`. Clients never leave loopback: only the route
//! listener binds where `listen` says, and a route is admitted only with
//! the shared `secret` (at least 16 characters, written into the server's
//! 0600 config file), because a route is a full peer of the company's data.
//!
//! Refused, naming the key: a cluster beside `stream.url` (an external NATS
//! clusters itself), a missing name, a listen address that is not
//! `IP:PORT`, a route that is not `nats-route://HOST:PORT`, a short or
//! URL-unsafe secret, and more `stream.replicas` than the routes can reach.

use std::fmt;
use std::net::SocketAddr;

use serde::Deserialize;

/// The least number of characters a route secret has.
pub const MIN_ROUTE_SECRET: usize = 16;

/// The `[stream.cluster]` section, validated.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// The cluster's name: every member's must match.
    pub name: String,
    /// Where this server listens for routes from its peers.
    pub listen: SocketAddr,
    /// The peers' route listeners, as `HOST:PORT` (this server's own may
    /// be among them: nats-server ignores a route to itself).
    pub routes: Vec<String>,
    /// The one credential every route presents and every member admits.
    pub secret: String,
}

impl fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("name", &self.name)
            .field("listen", &self.listen)
            .field("routes", &self.routes)
            .field("secret", &"[redacted]")
            .finish()
    }
}

impl ClusterConfig {
    /// The most members this node can know of: its routes, plus itself
    /// unless its own listen address is one of them. An upper bound — a
    /// route naming this server by another address counts twice.
    pub fn known_size(&self) -> usize {
        let own = self.listen.to_string();
        let listed = self.routes.contains(&own);
        self.routes.len() + usize::from(!listed)
    }
}

pub(crate) mod raw {
    use super::*;

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct Cluster {
        pub name: Option<String>,
        pub listen: Option<String>,
        pub routes: Vec<String>,
        pub secret: Option<String>,
    }
}

impl raw::Cluster {
    /// `Err((key, message))` naming the first key that is wrong.
    pub(crate) fn validate(self) -> Result<ClusterConfig, (&'static str, String)> {
        let name = match self.name {
            Some(n) if !n.is_empty() => n,
            _ => {
                return Err((
                    "stream.cluster.name",
                    "a cluster needs a name, the same on every member (e.g. name = \"acme\")"
                        .into(),
                ));
            }
        };
        if name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err((
                "stream.cluster.name",
                format!("expected 1 to 64 letters, digits, `-` or `_`, found {name:?}"),
            ));
        }
        let Some(listen) = self.listen else {
            return Err((
                "stream.cluster.listen",
                "expected the address this server takes routes on, e.g. \"10.0.0.5:6222\" (\"0.0.0.0:6222\" for every interface)".into(),
            ));
        };
        let listen: SocketAddr = listen.parse().map_err(|_| {
            (
                "stream.cluster.listen",
                format!(
                    "expected IP:PORT such as \"10.0.0.5:6222\" or \"[::]:6222\", found {listen:?}"
                ),
            )
        })?;
        if listen.port() == 0 {
            return Err((
                "stream.cluster.listen",
                "expected a fixed port: peers name it in their routes".into(),
            ));
        }
        if self.routes.is_empty() {
            return Err((
                "stream.cluster.routes",
                "expected the peers' route addresses, e.g. [\"nats-route://10.0.0.6:6222\", \"nats-route://10.0.0.7:6222\"]".into(),
            ));
        }
        let mut routes = Vec::with_capacity(self.routes.len());
        for r in &self.routes {
            let hostport = parse_route(r).ok_or_else(|| {
                (
                    "stream.cluster.routes",
                    format!(
                        "expected nats-route://HOST:PORT (no user or password: the secret is `stream.cluster.secret`), found {r:?}"
                    ),
                )
            })?;
            if !routes.contains(&hostport) {
                routes.push(hostport);
            }
        }
        let Some(secret) = self.secret else {
            return Err((
                "stream.cluster.secret",
                format!(
                    "a route is a full peer of the company's data: set a shared secret of at least {MIN_ROUTE_SECRET} characters on every member, e.g. secret = \"${{CREWLET_ROUTE_SECRET}}\" with the value from `openssl rand -hex 24`"
                ),
            ));
        };
        if secret.chars().count() < MIN_ROUTE_SECRET
            || !secret
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.~".contains(&b))
        {
            return Err((
                "stream.cluster.secret",
                format!(
                    "expected at least {MIN_ROUTE_SECRET} letters, digits, `-`, `_`, `.` or `~` (it travels in the route URL), found {} characters; `openssl rand -hex 24` makes one",
                    secret.chars().count()
                ),
            ));
        }
        Ok(ClusterConfig {
            name,
            listen,
            routes,
            secret,
        })
    }
}

/// `nats-route://HOST:PORT` → `HOST:PORT`, or `None` when it is not that.
fn parse_route(url: &str) -> Option<String> {
    let rest = url.trim().strip_prefix("nats-route://")?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (host, port) = rest.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let host_ok = !bare.is_empty()
        && bare
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:".contains(&b))
        && ((bare == host) != bare.contains(':'));
    host_ok.then(|| format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(listen: &str, routes: &[&str], secret: &str) -> raw::Cluster {
        raw::Cluster {
            name: Some("acme".into()),
            listen: Some(listen.into()),
            routes: routes.iter().map(|s| (*s).to_owned()).collect(),
            secret: Some(secret.into()),
        }
    }

    const SECRET: &str = "0123456789abcdef0123";

    #[test]
    fn routes_and_listen_parse_and_the_size_counts_this_node_once() {
        let c = cluster(
            "127.0.0.1:6222",
            &[
                "nats-route://127.0.0.1:6222",
                "nats-route://10.0.0.6:6222/",
                "nats-route://nats-b.internal:6222",
                "nats-route://[::1]:7000",
            ],
            SECRET,
        )
        .validate()
        .unwrap();
        assert_eq!(
            c.routes,
            [
                "127.0.0.1:6222",
                "10.0.0.6:6222",
                "nats-b.internal:6222",
                "[::1]:7000"
            ]
        );
        assert_eq!(c.known_size(), 4);
        let c = cluster("0.0.0.0:6222", &["nats-route://b:6222"], SECRET)
            .validate()
            .unwrap();
        assert_eq!(c.known_size(), 2);
        assert!(!format!("{c:?}").contains(SECRET));
    }

    #[test]
    fn each_bad_key_is_named() {
        let named = |c: raw::Cluster| c.validate().unwrap_err().0;
        let ok = ["nats-route://b:6222"];
        assert_eq!(
            named(raw::Cluster {
                name: None,
                ..cluster("0.0.0.0:6222", &ok, SECRET)
            }),
            "stream.cluster.name"
        );
        assert_eq!(
            named(raw::Cluster {
                name: Some("a b".into()),
                ..cluster("0.0.0.0:6222", &ok, SECRET)
            }),
            "stream.cluster.name"
        );
        for listen in ["host:6222", "0.0.0.0", "0.0.0.0:0"] {
            assert_eq!(named(cluster(listen, &ok, SECRET)), "stream.cluster.listen");
        }
        for route in [
            "nats://b:6222",
            "nats-route://u:p@b:6222",
            "nats-route://b",
            "nats-route://:6222",
            "nats-route://b:0",
        ] {
            assert_eq!(
                named(cluster("0.0.0.0:6222", &[route], SECRET)),
                "stream.cluster.routes",
                "{route}"
            );
        }
        assert_eq!(
            named(cluster("0.0.0.0:6222", &[], SECRET)),
            "stream.cluster.routes"
        );
        for secret in ["short", "0123456789abcdef/x", "0123456789abcdef@x"] {
            assert_eq!(
                named(cluster("0.0.0.0:6222", &ok, secret)),
                "stream.cluster.secret"
            );
        }
        assert_eq!(
            named(raw::Cluster {
                secret: None,
                ..cluster("0.0.0.0:6222", &ok, SECRET)
            }),
            "stream.cluster.secret"
        );
    }
}
