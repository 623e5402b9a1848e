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
    let Permissions::Module { state, reads, .. } = m.permissions else {
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

fn module(section: &str) -> Result<Manifest, ManifestError> {
    parse(&format!("{HEAD}kind = \"module\"\n{section}"))
}

#[test]
fn a_module_declares_topics_subscriptions_and_tools() {
    let m = module(
        "[module]\npublishes = [\"changed\", \"gone\"]\n\
         [[module.subscribe]]\nevent = \"turn_ended\"\n\
         [[module.subscribe]]\ntopic = \"notebook.changed\"\ndelivery = \"each-node\"\n\
         [module.tools.add-note]\ndescription = \"Write a note\"\n\
         arguments = { type = \"object\", properties = { text = { type = \"string\" } }, required = [\"text\"] }\n\
         [module.tools.list_notes]\ndescription = \"List the notes\"\n",
    )
    .unwrap();
    let Permissions::Module {
        publishes,
        subscribes,
        tools,
        ..
    } = m.permissions
    else {
        panic!("not a module")
    };
    assert_eq!(publishes, ["changed", "gone"]);
    assert_eq!(subscribes[0].source.subject_kind(), "turn_ended");
    assert_eq!(subscribes[0].delivery, Delivery::Once);
    assert_eq!(
        subscribes[1].source,
        Source::Topic {
            module: "notebook".into(),
            topic: "changed".into()
        }
    );
    assert_eq!(
        subscribes[1].source.subject_kind(),
        "module.notebook.changed"
    );
    assert_eq!(subscribes[1].delivery, Delivery::EachNode);
    assert_eq!(tools[0].name, "add-note");
    assert_eq!(
        tools[0].arguments,
        serde_json::json!({
            "type": "object",
            "properties": { "text": { "type": "string" } },
            "required": ["text"]
        })
    );
    assert_eq!(tools[1].name, "list_notes");
    assert_eq!(tools[1].arguments, serde_json::json!({ "type": "object" }));
}

#[test]
fn a_module_section_is_refused_naming_the_field() {
    let tool = |arguments: &str| {
        format!(
            "[module.tools.add-note]\ndescription = \"Write a note\"\narguments = {arguments}\n"
        )
    };
    let long_field = format!("module.tools.{}", "a".repeat(49));
    let cases = [
        (
            "[module]\npublishes = [\"ok\", \"Not_Ok\"]\n".to_string(),
            "module.publishes[1]",
            "a-z",
        ),
        (
            "[module]\npublishes = [\"a\", \"a\"]\n".to_string(),
            "module.publishes[1]",
            "twice",
        ),
        (
            "[[module.subscribe]]\nevent = \"turn_ended\"\n[[module.subscribe]]\nevent = \"turn_endd\"\n".to_string(),
            "module.subscribe[1].event",
            "not an event kind",
        ),
        (
            "[[module.subscribe]]\nevent = \"module.notebook.changed\"\n".to_string(),
            "module.subscribe[0].event",
            "topic = \"notebook.changed\"",
        ),
        (
            "[[module.subscribe]]\nevent = \"turn_ended\"\ntopic = \"a.b\"\n".to_string(),
            "module.subscribe[0]",
            "not both",
        ),
        (
            "[[module.subscribe]]\ndelivery = \"once\"\n".to_string(),
            "module.subscribe[0]",
            "name the source",
        ),
        (
            "[[module.subscribe]]\ntopic = \"notebook\"\n".to_string(),
            "module.subscribe[0].topic",
            "module.topic",
        ),
        (
            "[[module.subscribe]]\ntopic = \"x.changed\"\n".to_string(),
            "module.subscribe[0].topic",
            "own topic",
        ),
        (
            "[[module.subscribe]]\nevent = \"turn_ended\"\ndelivery = \"twice\"\n".to_string(),
            "module.subscribe[0].delivery",
            "",
        ),
        (
            "[module.tools.Add]\ndescription = \"x\"\n".to_string(),
            "module.tools.Add",
            "a-z",
        ),
        (
            format!("[module.tools.{}]\ndescription = \"x\"\n", "a".repeat(49)),
            long_field.as_str(),
            "1–48",
        ),
        (
            "[module.tools.add-note]\ndescription = \" \"\n".to_string(),
            "module.tools.add-note.description",
            "model reads it",
        ),
        (
            tool("{ type = \"string\" }"),
            "module.tools.add-note.arguments",
            "\"object\"",
        ),
        (
            tool("{ properties = { text = { type = \"string\" } } }"),
            "module.tools.add-note.arguments",
            "\"object\"",
        ),
        (
            tool("{ type = \"object\", properties = { text = { type = \"strng\" } } }"),
            "module.tools.add-note.arguments",
            "not a valid JSON Schema",
        ),
        (
            tool("{ type = \"object\", required = \"text\" }"),
            "module.tools.add-note.arguments",
            "not a valid JSON Schema",
        ),
        (
            tool("{ type = \"object\", \"$ref\" = \"https://example.com/schema.json\" }"),
            "module.tools.add-note.arguments",
            "",
        ),
        (
            tool("{ type = \"object\", \"$schema\" = \"https://example.com/meta\" }"),
            "module.tools.add-note.arguments",
            "",
        ),
    ];
    for (section, field, needle) in &cases {
        let e = module(section).expect_err(section);
        assert_eq!(e.field, *field, "{section}: {e}");
        assert!(e.problem.contains(needle), "{section}: {e}");
    }
    // MODULE__TOOL past the 64 characters model APIs take for a name.
    let name = "n".repeat(40);
    let long = HEAD.replacen("name = \"x\"", &format!("name = \"{name}\""), 1);
    assert!(long.contains(&name), "the test's HEAD names its plugin `x`");
    let tool = "t".repeat(23);
    let e = parse(&format!(
        "{long}kind = \"module\"\n[module.tools.{tool}]\ndescription = \"x\"\n"
    ))
    .unwrap_err();
    assert_eq!(e.field, format!("module.tools.{tool}"), "{e}");
    assert!(e.problem.contains("65 characters"), "{e}");
    let ok = "t".repeat(22);
    parse(&format!(
        "{long}kind = \"module\"\n[module.tools.{ok}]\ndescription = \"x\"\n"
    ))
    .unwrap();
}

#[test]
fn a_provider_declares_the_model_options_it_reads() {
    let provider = |options: &str| {
        parse(&format!(
            "{HEAD}kind = \"provider\"\n[provider]\nbase_url = \"https://api.example.com/v1\"\nallowed_outbound_hosts = [\"https://api.example.com\"]\n{options}"
        ))
    };
    let m = provider("options = [\"steps\", \"top_k\"]\n").unwrap();
    let Permissions::Provider { options, .. } = &m.permissions else {
        panic!("{m:?}")
    };
    assert_eq!(options, &["steps", "top_k"]);
    let Permissions::Provider { options, .. } = provider("").unwrap().permissions else {
        panic!()
    };
    assert!(options.is_empty(), "none unless declared");
    let e = provider("options = [\"Base-URL\"]\n").unwrap_err();
    assert_eq!(e.field, "provider.options");
    assert!(e.problem.contains("`Base-URL`"), "{e}");
}
