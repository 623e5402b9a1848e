use super::*;

const EXAMPLE: &str = include_str!("../../../examples/company.toml");

#[test]
fn the_example_company_is_valid() {
    let c = Company::parse(EXAMPLE).unwrap_or_else(|e| panic!("{e}"));
    assert!(!c.seats.is_empty());
    for seat in c.seats.values() {
        assert!(c.roles.contains_key(&seat.role));
    }
    assert_eq!(c.digest.len(), 64);
}

#[test]
fn seat_ids_are_uuidv5_over_org_and_handle() {
    let h = Handle::parse("ada").unwrap();
    let a = seat_id("Acme", &h);
    assert_eq!(a, seat_id("Acme", &h), "every node computes the same id");
    assert_eq!(a.get_version_num(), 5);
    assert_ne!(a, seat_id("Acme2", &h));
    assert_ne!(a, seat_id("Acme", &Handle::parse("bob").unwrap()));
}

#[test]
fn every_error_is_reported_with_its_path() {
    let doc = r#"
        [org]
        name = ""
        timezone = "Mars/Olympus"
        budget = { day = -5 }

        [roles.eng]
        system_prompt = "x"
        executor = []
        reviewer = { provider = "openai", model = "m", credentials = "sk-live-123" }
        max_tool_rounds = 0
        [roles.eng.mcp.chat]
        command = "srv"
        url = "http://x"
        [roles.eng.mcp.wiki]
        url = "ftp://x"

        [seats]
        "Bad Handle" = { role = "eng" }
        ada = { role = "nope" }

        [integrations.github]
        plugin = "github"
        secret = "not a name"
    "#;
    let err = Company::parse(doc).unwrap_err();
    let paths: Vec<&str> = err.errors.iter().map(|e| e.path.as_str()).collect();
    for expected in [
        "org.name",
        "org.timezone",
        "org.budget.day",
        "roles.eng.executor",
        "roles.eng.reviewer.credentials",
        "roles.eng.max_tool_rounds",
        "roles.eng.mcp.chat",
        "roles.eng.mcp.wiki.url",
        "seats.Bad Handle",
        "seats.ada.role",
        "integrations.github.secret",
    ] {
        assert!(
            paths.contains(&expected),
            "{expected} missing from {paths:?}"
        );
    }
    let text = err.to_string();
    assert!(text.contains("never written into a document"), "{text}");
    assert!(text.starts_with(&format!(
        "the company document has {} errors",
        err.errors.len()
    )));
}

#[test]
fn unknown_keys_and_wrong_types_name_their_path() {
    let err = Company::parse("[org]\nname = \"A\"\ncolour = \"red\"\n").unwrap_err();
    assert_eq!(err.errors[0].path, "org.colour");
    let err = Company::parse("[org]\nname = \"A\"\n[seats.ada]\nrole = 3\n").unwrap_err();
    assert_eq!(err.errors[0].path, "seats.ada.role");
    let err = Company::parse("[org\n").unwrap_err();
    assert!(err.errors[0].message.contains("not valid TOML"));
}

#[test]
fn credentials_accept_one_reference_or_a_pool() {
    let doc = r#"
        [org]
        name = "A"
        [roles.r]
        system_prompt = "p"
        executor = [{ provider = "openai", model = "m", credentials = ["${K1}", "${K2}"], options = { base_url = "http://127.0.0.1:9" } }]
        reviewer = { provider = "openai", model = "m", credentials = "${K1}" }
        [seats]
        a = { role = "r", group = "gpu" }
    "#;
    let c = Company::parse(doc).unwrap();
    let r = &c.roles["r"];
    assert_eq!(r.executor[0].credentials.len(), 2);
    assert_eq!(r.executor[0].options["base_url"], "http://127.0.0.1:9");
    assert_eq!(r.max_iterations, 3);
    assert_eq!(c.timezone, "UTC");
    assert_eq!(c.seat("a").unwrap().group.as_deref(), Some("gpu"));
    assert_eq!(
        Handle::parse("a").unwrap().inbox_subject(),
        "crewlet.agent.a.inbox"
    );
}
