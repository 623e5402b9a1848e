//! The grant's resolution: held = (declared + added) − denied, each
//! refusal naming its key.

use super::*;
use crate::manifest::{DEFAULT_MAX_BODY, NotHeld};
use std::path::Path;

fn catalogue() -> Catalogue {
    let provider = Manifest::parse(
        Path::new("/p/openai/plugin.toml"),
        "name = \"openai\"\nversion = \"1.0.0\"\nkind = \"provider\"\ncomponent = \"c.wasm\"\n\
         [provider]\nbase_url = \"https://api.openai.com/v1\"\n\
         allowed_outbound_hosts = [\"https://api.openai.com\"]\n",
    )
    .unwrap();
    let webhook = Manifest::parse(
        Path::new("/p/hook/plugin.toml"),
        "name = \"hook\"\nversion = \"1.0.0\"\nkind = \"webhook\"\ncomponent = \"c.wasm\"\n\
         [webhook]\nroutes = [\"/webhooks/hook\"]\n",
    )
    .unwrap();
    let module = Manifest::parse(
        Path::new("/p/board/plugin.toml"),
        "name = \"board\"\nversion = \"1.0.0\"\nkind = \"module\"\ncomponent = \"c.wasm\"\n\
         [module]\nreads = [\"presence.seen\", \"notebook.notes\"]\n",
    )
    .unwrap();
    Catalogue {
        plugins: vec![provider, webhook, module],
    }
}

fn held(c: &Catalogue, i: usize) -> Vec<String> {
    match &c.plugins[i].permissions {
        Permissions::Provider {
            allowed_outbound_hosts,
            ..
        } => allowed_outbound_hosts
            .iter()
            .map(|o| o.to_string())
            .collect(),
        Permissions::Webhook { routes, .. } => routes.clone(),
        Permissions::Module { reads, .. } => reads.iter().map(|r| r.to_string()).collect(),
    }
}

#[test]
fn what_the_operator_denies_is_taken_out_of_what_the_manifest_declares() {
    let mut c = catalogue();
    let provider = Grant {
        allowed_outbound_hosts: vec!["https://auth.example.com".into()],
        denied_outbound_hosts: vec!["https://API.openai.com:443".into()],
        ..Grant::default()
    };
    c.apply_grants(&grants("openai", provider), "node.toml")
        .unwrap();
    assert_eq!(held(&c, 0), ["https://auth.example.com:443"]);
    let api = Permission::Outbound(Origin::parse("https://api.openai.com").unwrap());
    assert_eq!(
        c.plugins[0].granted.denied_by(&api),
        Some("plugins.grants.openai.denied_outbound_hosts[0]")
    );

    let mut c = catalogue();
    let webhook = Grant {
        routes: vec!["/webhooks/hook-enterprise".into()],
        denied_routes: vec!["/webhooks/hook".into()],
        ..Grant::default()
    };
    c.apply_grants(&grants("hook", webhook), "node.toml")
        .unwrap();
    assert_eq!(held(&c, 1), ["/webhooks/hook-enterprise"]);

    let mut c = catalogue();
    let module = Grant {
        reads: vec!["fleet.nodes".into()],
        denied_reads: vec!["notebook.notes".into()],
        ..Grant::default()
    };
    c.apply_grants(&grants("board", module), "node.toml")
        .unwrap();
    assert_eq!(held(&c, 2), ["presence.seen", "fleet.nodes"]);
    let m = &c.plugins[2];
    let added: Vec<&str> = m.granted.added.iter().map(|a| a.key.as_str()).collect();
    assert_eq!(added, ["plugins.grants.board.reads[0]"]);
    let denied: Vec<&str> = m.granted.denied.iter().map(|d| d.key.as_str()).collect();
    assert_eq!(denied, ["plugins.grants.board.denied_reads[0]"]);
}

#[test]
fn a_denied_permission_is_refused_like_an_undeclared_one_naming_the_key() {
    let mut c = catalogue();
    let grant = Grant {
        denied_reads: vec!["notebook.notes".into()],
        ..Grant::default()
    };
    c.apply_grants(&grants("board", grant), "/etc/crewlet/node.toml")
        .unwrap();
    let m = &c.plugins[2];
    let read = |text: &str| Permission::Read(read_of("board", text).unwrap());
    let denied = m.granted.refusal(read("notebook.notes"), &m.file);
    assert!(matches!(denied, NotHeld::Denied { .. }), "{denied:?}");
    assert_eq!(
        denied.to_string(),
        "reads bucket notebook.notes is denied by the operator: `plugins.grants.board.denied_reads[0]` in /etc/crewlet/node.toml (remove it there to allow it)"
    );
    let undeclared = m.granted.refusal(read("fleet.nodes"), &m.file);
    assert!(
        matches!(undeclared, NotHeld::Undeclared { .. }),
        "{undeclared:?}"
    );
    assert!(
        undeclared
            .to_string()
            .contains("/p/board/plugin.toml does not declare it"),
        "{undeclared}"
    );
}

#[test]
fn a_deny_the_manifest_does_not_declare_stands_and_changes_nothing_else() {
    let mut c = catalogue();
    let grant = Grant {
        denied_routes: vec!["/webhooks/other".into()],
        ..Grant::default()
    };
    c.apply_grants(&grants("hook", grant), "node.toml").unwrap();
    assert_eq!(held(&c, 1), ["/webhooks/hook"]);
    assert_eq!(
        c.plugins[1]
            .granted
            .denied_by(&Permission::Route("/webhooks/other".into())),
        Some("plugins.grants.hook.denied_routes[0]")
    );
}

fn grants(name: &str, grant: Grant) -> BTreeMap<String, Grant> {
    BTreeMap::from([(name.to_string(), grant)])
}

#[test]
fn a_base_url_grant_moves_the_provider_and_brings_its_origin() {
    let mut c = catalogue();
    let grant = Grant {
        base_url: Some("http://127.0.0.1:4000/v1/".into()),
        allowed_outbound_hosts: vec![
            "http://127.0.0.1:4000".into(),
            "https://api.openai.com".into(),
            "https://auth.example.com".into(),
        ],
        ..Grant::default()
    };
    c.apply_grants(&grants("openai", grant), "node.toml")
        .unwrap();
    let m = &c.plugins[0];
    let Permissions::Provider {
        base_url,
        allowed_outbound_hosts,
        ..
    } = &m.permissions
    else {
        panic!("a provider")
    };
    assert_eq!(base_url, "http://127.0.0.1:4000/v1");
    let hosts: Vec<String> = allowed_outbound_hosts
        .iter()
        .map(|o| o.to_string())
        .collect();
    assert_eq!(
        hosts,
        [
            "https://api.openai.com:443",
            "http://127.0.0.1:4000",
            "https://auth.example.com:443"
        ]
    );
    // Only what the operator added is marked as theirs.
    let granted: Vec<String> = m
        .granted
        .added
        .iter()
        .filter_map(|a| match &a.permission {
            Permission::Outbound(o) => Some(o.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(
        granted,
        ["http://127.0.0.1:4000", "https://auth.example.com:443"]
    );
    assert_eq!(m.granted.to_string(), "operator grant in node.toml");
    assert_eq!(
        m.granted
            .added_by(&Permission::BaseUrl("http://127.0.0.1:4000/v1".into())),
        Some("plugins.grants.openai.base_url")
    );
}

#[test]
fn a_wrong_grant_is_refused_with_its_key() {
    let cases = [
        (
            "opnai",
            Grant {
                base_url: Some("http://x".into()),
                ..Grant::default()
            },
            "node.toml: `plugins.grants.opnai`: no plugin of that name",
        ),
        (
            "openai",
            Grant {
                base_url: Some("ftp://x".into()),
                ..Grant::default()
            },
            "`plugins.grants.openai.base_url`: `ftp://x`: the scheme must be http or https",
        ),
        (
            "openai",
            Grant {
                allowed_outbound_hosts: vec!["https://ok.example".into(), "https://*.x".into()],
                ..Grant::default()
            },
            "`plugins.grants.openai.allowed_outbound_hosts[1]`: `https://*.x`: a host is required and wildcards are not allowed",
        ),
        (
            "openai",
            Grant {
                max_body_bytes: Some(10),
                ..Grant::default()
            },
            "`plugins.grants.openai.max_body_bytes`: only a webhook plugin takes it",
        ),
        (
            "hook",
            Grant {
                base_url: Some("http://x".into()),
                ..Grant::default()
            },
            "`plugins.grants.hook.base_url`: only a provider plugin takes it",
        ),
        (
            "hook",
            Grant {
                max_body_bytes: Some(MAX_GRANTED_BODY + 1),
                ..Grant::default()
            },
            "`plugins.grants.hook.max_body_bytes`: 26214401 must be between 1 and",
        ),
        (
            "openai",
            Grant {
                base_url: Some("http://127.0.0.1:4000/v1".into()),
                denied_outbound_hosts: vec!["http://127.0.0.1:4000".into()],
                ..Grant::default()
            },
            "`plugins.grants.openai.base_url`: `http://127.0.0.1:4000` is also denied by `plugins.grants.openai.denied_outbound_hosts[0]`; keep one of the two",
        ),
        (
            "openai",
            Grant {
                denied_outbound_hosts: vec!["api.openai.com".into()],
                ..Grant::default()
            },
            "`plugins.grants.openai.denied_outbound_hosts[0]`: `api.openai.com` is not scheme://host:port",
        ),
        (
            "hook",
            Grant {
                denied_routes: vec!["/hook".into()],
                ..Grant::default()
            },
            "`plugins.grants.hook.denied_routes[0]`: `/hook` must start with /webhooks/",
        ),
        (
            "hook",
            Grant {
                denied_reads: vec!["presence.seen".into()],
                ..Grant::default()
            },
            "`plugins.grants.hook.denied_reads`: only a module plugin takes it, and `hook` is a webhook plugin",
        ),
        (
            "board",
            Grant {
                reads: vec!["board.own".into()],
                ..Grant::default()
            },
            "`plugins.grants.board.reads[0]`: `board.own` is this module's own bucket",
        ),
    ];
    for (name, grant, says) in cases {
        let mut c = catalogue();
        let e = c
            .apply_grants(&grants(name, grant), "node.toml")
            .unwrap_err();
        assert!(e.to_string().contains(says), "{e} ≠ {says}");
        assert!(c.plugins.iter().all(|m| m.granted.is_empty()));
    }
}

#[test]
fn a_body_grant_raises_only_that_webhook_route() {
    let mut c = catalogue();
    let grant = Grant {
        max_body_bytes: Some(8 * 1024 * 1024),
        ..Grant::default()
    };
    c.apply_grants(&grants("hook", grant), "node.toml").unwrap();
    assert_eq!(c.plugins[1].limits.max_body_bytes, 8 * 1024 * 1024);
    assert_eq!(c.plugins[0].limits.max_body_bytes, DEFAULT_MAX_BODY);
}
