//! The embedded server's configuration file, and the ports it reports.
//!
//! Rule: the file is rewritten at every start and written 0600, because a
//! clustered server's file holds the route secret. Clients stay on
//! loopback whatever `[stream.cluster]` says; only the route listener
//! binds where `listen` names, and a clustered server also serves its
//! monitoring endpoint on loopback (an ephemeral port, no credentials in
//! any answer) so the node can report routes and the JetStream meta group.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crewlet_config::{ClusterConfig, SyncPolicy};

/// The user every route presents; its password is the cluster's secret.
const ROUTE_USER: &str = "crewlet-route";

/// What one server config says.
pub(crate) struct ServerConf<'a> {
    pub node_id: &'a str,
    /// The client port; `None` lets the server pick one.
    pub port: Option<u16>,
    pub store_dir: &'a Path,
    pub sync: SyncPolicy,
    /// The one nkey admitted as a client.
    pub user: &'a str,
    pub cluster: Option<&'a ClusterConfig>,
}

impl ServerConf<'_> {
    /// The file's text. Strings are quoted JSON, which the NATS config
    /// format reads verbatim.
    pub(crate) fn render(&self) -> String {
        let quote = |s: &str| serde_json::to_string(s).expect("string to JSON");
        let listen = match self.port {
            Some(p) => p.to_string(),
            None => "-1".to_owned(),
        };
        let mut conf = format!(
            "# Written by crewlet at every start; edits are overwritten.\n\
             server_name: {name}\n\
             listen: \"127.0.0.1:{listen}\"\n\
             ports_file_dir: {store}\n\
             authorization {{\n  users: [ {{ nkey: {user} }} ]\n}}\n\
             jetstream {{\n  store_dir: {store}\n",
            name = quote(&server_name(self.node_id)),
            store = quote(&self.store_dir.display().to_string()),
            user = quote(self.user),
        );
        if self.sync == SyncPolicy::Always {
            conf.push_str("  sync_interval: always\n");
        }
        conf.push_str("}\n");
        if let Some(c) = self.cluster {
            let routes: Vec<String> = c
                .routes
                .iter()
                .map(|r| quote(&format!("nats-route://{ROUTE_USER}:{}@{r}", c.secret)))
                .collect();
            // no_advertise: the peers' client URLs are their loopback
            // ports, which mean nothing to this node's clients.
            conf.push_str(&format!(
                "http: \"127.0.0.1:-1\"\n\
                 cluster {{\n  name: {name}\n  listen: {listen}\n  no_advertise: true\n  \
                 authorization {{ user: {user}, password: {secret} }}\n  routes: [\n    {routes}\n  ]\n}}\n",
                name = quote(&c.name),
                listen = quote(&c.listen.to_string()),
                user = quote(ROUTE_USER),
                secret = quote(&c.secret),
                routes = routes.join(",\n    "),
            ));
        }
        conf
    }

    /// Writes the file, readable by this user alone.
    pub(crate) fn write(&self, path: &Path) -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?;
        // A file left by an older version keeps its mode on open: narrow it.
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        f.write_all(self.render().as_bytes())
    }
}

/// The name the server goes by among its peers (`/health`, the meta group).
pub(crate) fn server_name(node_id: &str) -> String {
    format!("crewlet-{node_id}")
}

/// The ports the server with `pid` reported in its ports file
/// (`<exe>_<pid>.ports` in `dir`): the client port, and the monitoring
/// port when it serves one.
pub(crate) fn reported_ports(dir: &Path, pid: u32) -> Option<(u16, Option<u16>)> {
    let suffix = format!("_{pid}.ports");
    let file = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with(&suffix))?;
    let ports: serde_json::Value =
        serde_json::from_slice(&std::fs::read(file.path()).ok()?).ok()?;
    let port_of = |key: &str| -> Option<u16> {
        let url = ports[key].get(0)?.as_str()?;
        url.rsplit(':').next()?.parse().ok()
    };
    Some((port_of("nats")?, port_of("monitoring")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(port: Option<u16>, sync: SyncPolicy, cluster: Option<&ClusterConfig>) -> String {
        ServerConf {
            node_id: "n1",
            port,
            store_dir: Path::new("/var/x \"y\""),
            sync,
            user: "UABC",
            cluster,
        }
        .render()
    }

    #[test]
    fn config_syncs_always_unless_told_otherwise() {
        let c = conf(Some(4222), SyncPolicy::Always, None);
        assert!(c.contains(r#"users: [ { nkey: "UABC" } ]"#), "{c}");
        assert!(c.contains("sync_interval: always"), "{c}");
        assert!(c.contains(r#"store_dir: "/var/x \"y\"""#), "{c}");
        assert!(c.contains("listen: \"127.0.0.1:4222\""), "{c}");
        assert!(!c.contains("cluster"), "{c}");
        let lazy = conf(None, SyncPolicy::ServerDefault, None);
        assert!(!lazy.contains("sync_interval"), "{lazy}");
        assert!(lazy.contains("listen: \"127.0.0.1:-1\""), "{lazy}");
    }

    #[test]
    fn a_cluster_routes_with_the_secret_and_clients_stay_on_loopback() {
        let cluster = ClusterConfig {
            name: "acme".into(),
            listen: "0.0.0.0:6222".parse().unwrap(),
            routes: vec!["10.0.0.6:6222".into(), "b.internal:6222".into()],
            secret: "0123456789abcdef".into(),
        };
        let c = conf(Some(4222), SyncPolicy::Always, Some(&cluster));
        assert!(c.contains("listen: \"127.0.0.1:4222\""), "{c}");
        assert!(c.contains("http: \"127.0.0.1:-1\""), "{c}");
        assert!(c.contains("name: \"acme\""), "{c}");
        assert!(c.contains("listen: \"0.0.0.0:6222\""), "{c}");
        assert!(c.contains("no_advertise: true"), "{c}");
        assert!(
            c.contains(r#"authorization { user: "crewlet-route", password: "0123456789abcdef" }"#),
            "{c}"
        );
        assert!(
            c.contains(r#""nats-route://crewlet-route:0123456789abcdef@b.internal:6222""#),
            "{c}"
        );
        assert!(c.contains("server_name: \"crewlet-n1\""), "{c}");
    }

    #[test]
    fn the_file_is_for_its_owner_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nats-server.conf");
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        ServerConf {
            node_id: "n1",
            port: None,
            store_dir: dir.path(),
            sync: SyncPolicy::Always,
            user: "U",
            cluster: None,
        }
        .write(&path)
        .unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(
            std::fs::read_to_string(&path)
                .unwrap()
                .contains("server_name")
        );
    }
}
