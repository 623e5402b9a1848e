use super::*;

const EXAMPLE: &str = include_str!("../../../examples/company.toml");
const EXAMPLE_OPENAI: &str = include_str!("../../../examples/company.openai.toml");
const EXAMPLE_ANTHROPIC: &str = include_str!("../../../examples/company.anthropic.toml");

#[test]
fn the_example_companies_are_valid_and_alike() {
    let parsed: Vec<Company> = [EXAMPLE, EXAMPLE_OPENAI, EXAMPLE_ANTHROPIC]
        .iter()
        .map(|d| Company::parse(d).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    for c in &parsed {
        assert!(!c.seats.is_empty());
        for seat in c.seats.values() {
            assert!(c.roles.contains_key(&seat.role));
        }
        assert_eq!(c.digest.len(), 64);
        assert_eq!(c.seats, parsed[0].seats, "one company, three models");
    }
    assert_eq!(parsed[0].roles["engineer"].executor[0].provider, "scripted");
    assert_eq!(parsed[1].roles["engineer"].executor[0].provider, "openai");
    assert_eq!(parsed[2].roles["support"].reviewer.provider, "anthropic");
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
}

#[test]
fn seats_carry_their_own_credentials_and_servers_name_their_reply_tools() {
    let doc = r#"
        [org]
        name = "A"
        [roles.r]
        system_prompt = "p"
        executor = [{ provider = "scripted", model = "m" }]
        reviewer = { provider = "scripted", model = "m" }
        [roles.r.mcp.chat]
        command = "chat"
        env = { CHAT_IDENTITY = "${SEAT_CHAT_TOKEN}" }
        replies = ["post_message"]
        [seats]
        a = { role = "r", credentials = { SEAT_CHAT_TOKEN = "${A_CHAT_TOKEN}" } }
        b = { role = "r" }
    "#;
    let c = Company::parse(doc).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.roles["r"].mcp["chat"].replies, ["post_message"]);
    let a = c.seat("a").unwrap();
    assert_eq!(a.credentials["SEAT_CHAT_TOKEN"].name_str(), "A_CHAT_TOKEN");
    assert!(c.seat("b").unwrap().credentials.is_empty());

    let bad = doc
        .replace("\"${A_CHAT_TOKEN}\"", "\"sk-literal\"")
        .replace("[\"post_message\"]", "[\"\"]");
    let errors = Company::parse(&bad).unwrap_err().errors;
    let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
    assert!(
        paths.contains(&"seats.a.credentials.SEAT_CHAT_TOKEN"),
        "{paths:?}"
    );
    assert!(paths.contains(&"roles.r.mcp.chat.replies[0]"), "{paths:?}");
}

#[test]
fn a_working_directory_is_absolute_and_only_for_command_servers() {
    let doc = |server: &str| {
        format!(
            r#"
[org]
name = "Acme"
[roles.dev]
system_prompt = "x"
executor = [{{ provider = "scripted", model = "m" }}]
reviewer = {{ provider = "scripted", model = "r" }}
[roles.dev.mcp.tool]
{server}
[seats]
ada = {{ role = "dev" }}
"#
        )
    };
    let ok = Company::parse(&doc("command = \"crewlet\"\ncwd = \"/srv/work\"")).unwrap();
    match &ok.roles["dev"].mcp["tool"].transport {
        McpTransport::Stdio { cwd, .. } => assert_eq!(cwd.as_deref(), Some("/srv/work")),
        other => panic!("{other:?}"),
    }
    let err = Company::parse(&doc("command = \"crewlet\"\ncwd = \"work\"")).unwrap_err();
    assert_eq!(err.errors[0].path, "roles.dev.mcp.tool.cwd");
    assert!(err.errors[0].message.contains("absolute"), "{err}");
    let err = Company::parse(&doc("url = \"http://127.0.0.1:1/mcp\"\ncwd = \"/srv\"")).unwrap_err();
    assert_eq!(err.errors[0].path, "roles.dev.mcp.tool");
    assert!(err.errors[0].message.contains("`cwd`"), "{err}");
}
