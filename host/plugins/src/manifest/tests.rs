use super::*;

fn parse(text: &str) -> Result<Manifest, ManifestError> {
    Manifest::parse(Path::new("plugins/x/plugin.toml"), text)
}

const HEAD: &str = "name = \"x\"\nversion = \"0.1.0\"\ncomponent = \"x.wasm\"\n";

#[test]
fn errors_name_file_and_field() {
    let e = parse(&format!(
        "{HEAD}kind = \"webhook\"\n[limits]\nmemory_mb = 3\n[webhook]\nroutes = [\"/webhooks/x\"]\n"
    ))
    .unwrap_err();
    assert_eq!(e.field, "limits.memory_mb");
    assert!(
        e.to_string()
            .starts_with("plugins/x/plugin.toml: field `limits.memory_mb`"),
        "{e}"
    );

    let e = parse(&format!(
        "{HEAD}kind = \"provider\"\n[provider]\nbase_url = \"https://api.example.com/v1\"\nallowed_outbound_hosts = [\"https://other.example.com\"]\n"
    ))
    .unwrap_err();
    assert_eq!(e.field, "provider.base_url");
    assert!(e.problem.contains("https://api.example.com:443"), "{e}");

    let e = parse(&format!(
        "{HEAD}kind = \"module\"\n[module]\nreads = [\"nodot\"]\n"
    ))
    .unwrap_err();
    assert_eq!(e.field, "module.reads[0]");

    let e = parse(&format!(
        "{HEAD}kind = \"webhook\"\n[webhook]\nroutes = [\"/webhooks/x\"]\n[module]\n"
    ))
    .unwrap_err();
    assert_eq!(e.field, "module");
}

#[test]
fn a_module_manifest_yields_its_buckets_and_reads() {
    let m = parse(&format!(
        "{HEAD}kind = \"module\"\n[module]\nreads = [\"other.things\"]\n[module.state.seen]\nhistory = 3\nttl_seconds = 60\n"
    ))
    .unwrap();
    let Permissions::Module { state, reads } = m.permissions else {
        panic!("not a module")
    };
    assert_eq!(state[0].local, "seen");
    assert_eq!(state[0].history, 3);
    assert_eq!(state[0].ttl, Some(std::time::Duration::from_secs(60)));
    assert_eq!(reads[0].to_string(), "other.things");
    assert_eq!(bucket_name("x", "seen"), "mod_x_seen");
}

#[test]
fn origins_default_ports_and_refuse_wildcards() {
    assert_eq!(
        Origin::parse("https://API.example.com/v1")
            .unwrap()
            .to_string(),
        "https://api.example.com:443"
    );
    assert_eq!(Origin::parse("http://127.0.0.1:8080").unwrap().port, 8080);
    assert!(Origin::parse("https://*.example.com").is_err());
    assert!(Origin::parse("ftp://x").is_err());
}
