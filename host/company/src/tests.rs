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
        assert_eq!(c.roles["engineer"].modules, ["notebook"]);
    }
    assert_eq!(parsed[0].roles["engineer"].executor[0].provider, "scripted");
    assert_eq!(parsed[1].roles["engineer"].executor[0].provider, "openai");
    assert_eq!(parsed[2].roles["support"].reviewer.provider, "anthropic");
    let standup = &parsed[0].schedules["standup"];
    assert_eq!(standup.seats, [Handle::parse("ada").unwrap()]);
    assert_eq!(standup.timezone, "Europe/Berlin");
    assert_eq!(standup.deliver.as_ref().unwrap().channel, "#standup");
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
        modules = ["Notebook", "wiki", "ok", "ok"]
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
        "roles.eng.modules[0]",
        "roles.eng.modules[1]",
        "roles.eng.modules[3]",
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

/// A company of two engineers and a support seat with `schedules` appended.
fn with_schedules(schedules: &str) -> String {
    format!(
        r#"
[org]
name = "Acme"
timezone = "Europe/Berlin"
[roles.engineer]
system_prompt = "x"
executor = [{{ provider = "scripted", model = "m" }}]
reviewer = {{ provider = "scripted", model = "r" }}
[roles.support]
system_prompt = "y"
executor = [{{ provider = "scripted", model = "m" }}]
reviewer = {{ provider = "scripted", model = "r" }}
[roles.idle]
system_prompt = "z"
executor = [{{ provider = "scripted", model = "m" }}]
reviewer = {{ provider = "scripted", model = "r" }}
[seats]
linus = {{ role = "engineer" }}
ada = {{ role = "engineer" }}
grace = {{ role = "support" }}
{schedules}
"#
    )
}

#[test]
fn schedules_name_a_seat_or_every_seat_of_a_role() {
    let doc = with_schedules(
        r##"
[schedules.standup]
cron = "0 9 * * mon-fri"
role = "engineer"
prompt = "Post today's stand-up."
deliver = { channel = "#eng", thread = "standup" }
catch_up = "all"
[schedules.triage]
cron = "30 0 8 * * *"
seat = "grace"
prompt = "Triage the queue."
timezone = "America/New_York"
catch_up = "none"
[schedules.report]
cron = "@weekly"
seat = "ada"
prompt = "Weekly report."
catch_up = "all"
catch_up_limit = 3
"##,
    );
    let c = Company::parse(&doc).unwrap_or_else(|e| panic!("{e}"));
    let standup = &c.schedules["standup"];
    assert_eq!(standup.target, ScheduleTarget::Role("engineer".into()));
    let handles: Vec<&str> = standup.seats.iter().map(Handle::as_str).collect();
    assert_eq!(handles, ["ada", "linus"], "every engineer, sorted");
    assert_eq!(standup.cron.as_str(), "0 9 * * mon-fri");
    assert_eq!(standup.timezone, "Europe/Berlin", "org.timezone by default");
    assert_eq!(
        standup.deliver,
        Some(Delivery {
            channel: "#eng".into(),
            thread: Some("standup".into())
        })
    );
    assert_eq!(
        standup.catch_up,
        CatchUp::All {
            limit: DEFAULT_CATCH_UP_LIMIT
        }
    );
    // Tuesday 2026-12-01, 09:00 in Berlin is 08:00 UTC.
    let next = standup
        .cron
        .next_after(&standup.tz, "2026-12-01T07:00:00Z".parse().unwrap());
    assert_eq!(next, Some("2026-12-01T08:00:00Z".parse().unwrap()));

    let triage = &c.schedules["triage"];
    assert_eq!(triage.seats, [Handle::parse("grace").unwrap()]);
    assert_eq!(triage.target, ScheduleTarget::Seat(triage.seats[0].clone()));
    assert_eq!(triage.timezone, "America/New_York");
    assert_eq!(
        triage.tz,
        jiff::tz::TimeZone::get("America/New_York").unwrap()
    );
    assert_eq!(triage.deliver, None, "the result goes nowhere");
    assert_eq!(triage.catch_up, CatchUp::None);
    assert_eq!(c.schedules["report"].catch_up, CatchUp::All { limit: 3 });

    let json = serde_json::to_value(&c).unwrap();
    assert_eq!(json["schedules"]["standup"]["cron"], "0 9 * * mon-fri");
    assert_eq!(json["schedules"]["triage"]["target"]["seat"], "grace");
    assert_eq!(json["schedules"]["report"]["catch_up"]["all"]["limit"], 3);
    assert_eq!(c, Company::parse(&doc).unwrap());

    let latest = Company::parse(&with_schedules(
        "[schedules.a]\ncron = \"* * * * *\"\nseat = \"ada\"\nprompt = \"p\"\n",
    ))
    .unwrap();
    assert_eq!(latest.schedules["a"].catch_up, CatchUp::Latest);
}

/// The paths of the errors `schedule` (one `[schedules.x]` table) draws.
fn schedule_errors(schedule: &str) -> Vec<DocError> {
    Company::parse(&with_schedules(&format!("[schedules.x]\n{schedule}")))
        .unwrap_err()
        .errors
}

#[test]
fn each_bad_schedule_key_is_refused_at_its_path() {
    let ok = "cron = \"0 9 * * *\"\nseat = \"ada\"\nprompt = \"p\"\n";
    let limit = MAX_PROMPT_BYTES;
    let cases = [
        (
            ok.replace("0 9 * * *", "0 9 * *"),
            "schedules.x.cron",
            "five fields",
        ),
        (
            ok.replace("0 9 * * *", "0 0 30 2 *"),
            "schedules.x.cron",
            "never fire",
        ),
        (
            format!("{ok}timezone = \"Mars/Olympus\""),
            "schedules.x.timezone",
            "IANA",
        ),
        (
            ok.replace("ada", "nobody"),
            "schedules.x.seat",
            "known: ada, grace, linus",
        ),
        (ok.replace("ada", "Ada"), "schedules.x.seat", "not a handle"),
        (
            ok.replace("seat = \"ada\"", "role = \"nope\""),
            "schedules.x.role",
            "no role",
        ),
        (
            ok.replace("seat = \"ada\"", "role = \"idle\""),
            "schedules.x.role",
            "no seat has",
        ),
        (
            format!("{ok}role = \"engineer\""),
            "schedules.x",
            "not both",
        ),
        (
            ok.replace("seat = \"ada\"", ""),
            "schedules.x",
            "expected `seat`",
        ),
        (ok.replace("\"p\"", "\" \""), "schedules.x.prompt", "empty"),
        (
            ok.replace("\"p\"", &format!("\"{}\"", "a".repeat(limit + 1))),
            "schedules.x.prompt",
            "8192",
        ),
        (
            format!("{ok}catch_up = \"some\""),
            "schedules.x.catch_up",
            "\"latest\"",
        ),
        (
            format!("{ok}catch_up_limit = 5"),
            "schedules.x.catch_up_limit",
            "applies to",
        ),
        (
            format!("{ok}catch_up = \"all\"\ncatch_up_limit = 0"),
            "schedules.x.catch_up_limit",
            "1 to 100",
        ),
        (
            format!("{ok}catch_up = \"all\"\ncatch_up_limit = 101"),
            "schedules.x.catch_up_limit",
            "1 to 100",
        ),
        (
            format!("{ok}deliver = {{ channel = \"\" }}"),
            "schedules.x.deliver.channel",
            "channel",
        ),
        (
            format!("{ok}deliver = {{ channel = \"#c\", thread = \"\" }}"),
            "schedules.x.deliver.thread",
            "thread",
        ),
    ];
    for (schedule, path, says) in cases {
        let errors = schedule_errors(&schedule);
        assert_eq!(errors.len(), 1, "{schedule}: {errors:?}");
        assert_eq!(errors[0].path, path, "{schedule}");
        assert!(
            errors[0].message.contains(says),
            "{schedule}: {}",
            errors[0]
        );
    }
    let at_limit = ok.replace("\"p\"", &format!("\"{}\"", "a".repeat(limit)));
    Company::parse(&with_schedules(&format!("[schedules.x]\n{at_limit}"))).unwrap();

    let err =
        Company::parse(&with_schedules(&format!("[schedules.\"Stand Up\"]\n{ok}"))).unwrap_err();
    assert_eq!(err.errors[0].path, "schedules.Stand Up");
    for unknown in [
        "colour = \"red\"",
        "deliver = { channel = \"#c\", surface = \"slack\" }",
    ] {
        let errors = schedule_errors(&format!("{ok}{unknown}"));
        assert!(errors[0].path.starts_with("schedules.x."), "{errors:?}");
        assert!(errors[0].message.contains("unknown field"), "{errors:?}");
    }
    let errors = schedule_errors("seat = \"ada\"\nprompt = \"p\"\n");
    assert_eq!(errors[0].path, "schedules.x", "{errors:?}");
    assert!(
        errors[0].message.contains("missing field `cron`"),
        "{errors:?}"
    );
}

#[test]
fn placement_groups_pin_seats_to_node_labels_and_undeclared_groups_stay_free() {
    let doc = r#"
        [org]
        name = "A"
        [roles.r]
        system_prompt = "p"
        executor = [{ provider = "scripted", model = "m" }]
        reviewer = { provider = "scripted", model = "m" }
        [placement.groups.gpu]
        labels = { accel = "gpu", zone = "eu" }
        [seats]
        a = { role = "r", group = "gpu" }
        b = { role = "r", group = "batch" }
        c = { role = "r" }
    "#;
    let c = Company::parse(doc).unwrap();
    let pin = c.pin_of(c.seat("a").unwrap()).expect("gpu is declared");
    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    assert!(pin.admits(&labels(&[("accel", "gpu"), ("zone", "eu"), ("rack", "7")])));
    assert!(
        !pin.admits(&labels(&[("accel", "gpu")])),
        "every pair is needed"
    );
    assert!(!pin.admits(&labels(&[("accel", "cpu"), ("zone", "eu")])));
    assert!(
        c.pin_of(c.seat("b").unwrap()).is_none(),
        "undeclared: free-form"
    );
    assert!(c.pin_of(c.seat("c").unwrap()).is_none(), "default group");
}

#[test]
fn a_pin_without_labels_or_with_a_bad_name_is_refused_at_its_path() {
    let doc = r#"
        [org]
        name = "A"
        [placement.groups.gpu]
        labels = {}
        [placement.groups."bad name"]
        labels = { accel = "gpu" }
        [placement.groups.edge]
        labels = { "" = "x" }
    "#;
    let err = Company::parse(doc).unwrap_err();
    let paths: Vec<&str> = err.errors.iter().map(|e| e.path.as_str()).collect();
    assert!(paths.contains(&"placement.groups.gpu.labels"), "{err}");
    assert!(paths.contains(&"placement.groups.bad name"), "{err}");
    assert!(paths.contains(&"placement.groups.edge.labels"), "{err}");
    let err =
        Company::parse("[org]\nname = \"A\"\n[placement.groups.gpu]\nnodes = 2\n").unwrap_err();
    assert_eq!(err.errors[0].path, "placement.groups.gpu.nodes");
}

fn with_identities(extra: &str) -> String {
    format!(
        r#"
        [org]
        name = "Acme"
        [roles.eng]
        system_prompt = "x"
        executor = [{{ provider = "openai", model = "m" }}]
        reviewer = {{ provider = "openai", model = "m" }}
        {extra}
        "#
    )
}

#[test]
fn seats_and_people_claim_their_ids_and_the_registry_names_them() {
    let c = Company::parse(&with_identities(
        r#"
        [seats.ada]
        role = "eng"
        identities = { slack = "U04ABCDEF", github = "Acme-Ada-Bot", jira = "5b10a2844c20165700ede21g", gitlab = ["ada", "ada-bot"] }
        [seats.linus]
        role = "eng"
        [people.grace]
        name = "Grace Hopper"
        identities = { slack = "U07GRACE1", jira = "557058:f58131cb" }
        "#,
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let ada = Claimant::Seat {
        handle: Handle::parse("ada").unwrap(),
    };
    let grace = Claimant::Person {
        key: "grace".into(),
    };
    assert_eq!(c.claimant("slack", "U04ABCDEF"), Some(&ada));
    assert_eq!(c.claimant("github", "acme-ada-bot"), Some(&ada));
    assert_eq!(c.claimant("gitlab", "ada-bot"), Some(&ada));
    assert_eq!(c.claimant("jira", "557058:f58131cb"), Some(&grace));
    assert_eq!(c.claimant("slack", "U04ABCDEG"), None);
    assert_eq!(c.claimant("jira", "U04ABCDEF"), None, "ids are per surface");
    // Seven ids, and each seat's handle on the company chat.
    assert_eq!(c.registry.len(), 9);
    assert_eq!(c.claimant("chat", "ada"), Some(&ada));
    assert_eq!(
        c.claimant("chat", "grace"),
        None,
        "a person is no seat there"
    );
    assert_eq!(c.people["grace"].name, "Grace Hopper");
    assert_eq!(
        c.seats[&Handle::parse("ada").unwrap()].identities["slack"],
        ["U04ABCDEF"]
    );
    assert!(
        c.seats[&Handle::parse("linus").unwrap()]
            .identities
            .is_empty()
    );
}

#[test]
fn an_id_claimed_twice_is_refused_naming_both_claimants() {
    let err = Company::parse(&with_identities(
        r#"
        [seats.ada]
        role = "eng"
        identities = { slack = "U04ABCDEF", github = "acme-bot" }
        [seats.linus]
        role = "eng"
        identities = { slack = "U04ABCDEF", github = "ACME-BOT" }
        [people.grace]
        name = "Grace"
        identities = { slack = ["U04ABCDEF", "U07GRACE1"] }
        [people.kay]
        name = "Kay"
        identities = { slack = "U07GRACE1" }
        "#,
    ))
    .unwrap_err();
    let text = err.to_string();
    let at = |path: &str| -> Vec<&str> {
        err.errors
            .iter()
            .filter(|e| e.path == path)
            .map(|e| e.message.as_str())
            .collect()
    };
    assert_eq!(err.errors.len(), 4, "{text}");
    let two_seats = at("seats.linus.identities.slack");
    assert!(
        two_seats[0].contains("`seats.ada`") && two_seats[0].contains("`seats.linus`"),
        "{text}"
    );
    let folded = at("seats.linus.identities.github");
    assert!(
        folded[0].contains("`seats.ada`"),
        "GitHub logins fold: {text}"
    );
    let seat_person = at("people.grace.identities.slack");
    assert!(
        seat_person[0].contains("`seats.ada`") && seat_person[0].contains("`people.grace`"),
        "{text}"
    );
    let two_people = at("people.kay.identities.slack");
    assert!(
        two_people[0].contains("`people.grace`") && two_people[0].contains("`people.kay`"),
        "{text}"
    );
}

#[test]
fn bad_identities_and_people_are_refused_at_their_path() {
    let err = Company::parse(&with_identities(
        r#"
        [seats.ada]
        role = "eng"
        identities = { slack = "<@U04ABCDEF>", github = [], "bad surface" = "x" }
        [people.grace]
        name = " "
        identities = { jira = "two words" }
        "#,
    ))
    .unwrap_err();
    let paths: Vec<&str> = err.errors.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "seats.ada.identities.bad surface",
            "seats.ada.identities.github",
            "seats.ada.identities.slack",
            "people.grace.name",
            "people.grace.identities.jira",
        ],
        "{err}"
    );
    assert!(err.errors[2].message.contains("\"U04ABCDEF\""), "{err}");
    let unknown = Company::parse(&with_identities(
        "[people.grace]\nname = \"Grace\"\nemail = \"g@acme\"\n",
    ))
    .unwrap_err();
    assert_eq!(unknown.errors[0].path, "people.grace.email", "{unknown}");
}

#[test]
fn a_server_maps_the_turns_own_calls_by_name_by_template_or_not_at_all() {
    use crate::surface::{SurfaceTool, default_arguments};
    let doc = |server: &str| {
        format!(
            r#"
        [org]
        name = "A"
        [roles.r]
        system_prompt = "p"
        executor = [{{ provider = "scripted", model = "m" }}]
        reviewer = {{ provider = "scripted", model = "m" }}
        [roles.r.mcp.chat]
        command = "chat"
        {server}
        [seats]
        a = {{ role = "r" }}
    "#
        )
    };
    let c = Company::parse(&doc("")).unwrap_or_else(|e| panic!("{e}"));
    let s = &c.roles["r"].mcp["chat"].surface;
    assert_eq!(
        s.read_thread,
        SurfaceTool::ByName,
        "unset: the tool's own name"
    );
    assert!(
        s.serves("slack") && s.serves("github"),
        "no sources: every one"
    );

    let mapped = doc(
        r#"read_thread = { tool = "get_replies", arguments = { channel_id = "{channel}", ts = "{thread}", limit = 50 } }
        raise_working = "add_eyes"
        clear_working = false
        notice = "send_note"
        sources = ["slack"]"#,
    );
    let c = Company::parse(&mapped).unwrap_or_else(|e| panic!("{e}"));
    let s = &c.roles["r"].mcp["chat"].surface;
    let SurfaceTool::Tool { tool, arguments } = &s.read_thread else {
        panic!("{:?}", s.read_thread)
    };
    assert_eq!(tool, "get_replies");
    assert_eq!(arguments["channel_id"], "{channel}");
    assert_eq!(arguments["limit"], 50);
    assert_eq!(
        s.raise_working,
        SurfaceTool::Tool {
            tool: "add_eyes".into(),
            arguments: default_arguments()
        },
        "a name alone takes channel and thread"
    );
    assert_eq!(s.clear_working, SurfaceTool::Off);
    assert_eq!(
        s.notice,
        SurfaceTool::Tool {
            tool: "send_note".into(),
            arguments: crate::surface::notice_arguments()
        },
        "a notice's name alone takes channel, thread and the text"
    );
    assert!(s.serves("slack") && !s.serves("github"));

    let bad = doc(r#"read_thread = true
        raise_working = { tool = "" }
        sources = [""]"#);
    let errors = Company::parse(&bad).unwrap_err().errors;
    let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "roles.r.mcp.chat.read_thread",
            "roles.r.mcp.chat.raise_working.tool",
            "roles.r.mcp.chat.sources[0]"
        ],
        "{errors:?}"
    );
}

#[test]
fn a_seat_route_verifies_with_the_seats_own_signing_secret_else_the_sources() {
    let c = Company::parse(&with_identities(
        r#"
        [seats.ada]
        role = "eng"
        signing_secrets = { slack = "${ADA_SLACK_SIGNING_SECRET}" }
        [seats.linus]
        role = "eng"
        [integrations.slack]
        plugin = "slack"
        secret = "SLACK_SIGNING_SECRET"
        "#,
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let secret = |handle| c.route_secret("slack", handle).map(SecretRef::name_str);
    assert_eq!(secret(Some("ada")), Some("ADA_SLACK_SIGNING_SECRET"));
    assert_eq!(secret(Some("linus")), Some("SLACK_SIGNING_SECRET"));
    assert_eq!(secret(None), Some("SLACK_SIGNING_SECRET"));
    assert_eq!(secret(Some("nobody")), Some("SLACK_SIGNING_SECRET"));
    assert_eq!(c.route_secret("github", Some("ada")), None);

    let err = Company::parse(&with_identities(
        r#"
        [seats.ada]
        role = "eng"
        signing_secrets = { github = "ADA_GH", slack = "not a name" }
        [integrations.slack]
        plugin = "slack"
        secret = "SLACK_SIGNING_SECRET"
        "#,
    ))
    .unwrap_err();
    let at = |path: &str| {
        err.errors
            .iter()
            .find(|e| e.path == path)
            .unwrap_or_else(|| panic!("no error at {path}: {err}"))
            .message
            .clone()
    };
    assert!(at("seats.ada.signing_secrets.github").contains("integrated: slack"));
    at("seats.ada.signing_secrets.slack");
}
