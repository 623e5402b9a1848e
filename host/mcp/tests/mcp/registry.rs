//! Seat registries over real children of the chat server: each seat acts as
//! itself, shared children are shared, failures stay inside their server.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use crewlet_mcp::{McpError, McpOptions, SeatTools, ServerState, SharedChildren, merge_status};
use crewlet_os::ConfigEpoch;
use serde_json::json;

fn opts() -> McpOptions {
    McpOptions {
        start_timeout: Duration::from_secs(20),
        policy: test_policy(),
        ..McpOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_seats_of_one_template_each_act_as_themselves() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("chat.jsonl");
    let role = BTreeMap::from([("chat".to_owned(), chat_spec(false, "SEAT_CHAT_TOKEN", &log))]);
    let shared = SharedChildren::new(opts());
    let opts = opts();
    let (ana, bo) = tokio::join!(
        SeatTools::start(
            "ana",
            &role,
            &shared,
            resolver(&[("SEAT_CHAT_TOKEN", "ana-chat-token")]),
            &opts
        ),
        SeatTools::start(
            "bo",
            &role,
            &shared,
            resolver(&[("SEAT_CHAT_TOKEN", "bo-chat-token")]),
            &opts
        ),
    );
    let (ana, bo) = (ana.expect("equipped"), bo.expect("equipped"));
    let (ana_servers, bo_servers) = (ana.servers(), bo.servers());
    assert_eq!(
        summary(&ana_servers, "chat").state,
        ServerState::Started { tools: 5 },
        "{ana_servers:?}"
    );
    assert_eq!(
        summary(&ana_servers, "chat").instructions.as_deref(),
        Some(
            "A team chat. Post with post_message, read a thread with read_thread, show you are working with raise_working / clear_working, and ask whoami for the name you post as."
        )
    );
    let (ana_pid, bo_pid) = (pid_of(&ana_servers, "chat"), pid_of(&bo_servers, "chat"));
    assert_ne!(ana_pid, bo_pid, "each seat has its own child");

    let mut names: Vec<String> = ana
        .tools("chat")
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "clear_working",
            "post_message",
            "raise_working",
            "read_thread",
            "whoami"
        ]
    );
    let post = ana
        .tools("chat")
        .unwrap()
        .into_iter()
        .find(|t| t.name == "post_message")
        .unwrap();
    assert_eq!(post.server, "chat");
    assert!(post.description.unwrap().contains("Post a message"));
    assert_eq!(post.input_schema["type"], "object");
    assert!(post.input_schema["properties"]["channel"].is_object());

    let who = ana.call("chat", "whoami", json!({})).await.unwrap();
    assert_eq!(who.text, "ana-chat-token");
    assert!(!who.is_error);
    assert_eq!(
        bo.call("chat", "whoami", json!(null)).await.unwrap().text,
        "bo-chat-token"
    );

    let posted = ana
        .call(
            "chat",
            "post_message",
            json!({"channel": "eng", "thread": "t1", "text": "hello from ana"}),
        )
        .await
        .unwrap();
    assert_eq!(
        posted.structured,
        Some(json!({"posted": true, "id": "1", "duplicate": false}))
    );
    let posted = bo
        .call(
            "chat",
            "post_message",
            json!({"channel": "eng", "thread": "t1", "text": "hi ana"}),
        )
        .await
        .unwrap();
    assert_eq!(
        posted.structured,
        Some(json!({"posted": true, "id": "2", "duplicate": false}))
    );

    let thread = bo
        .call(
            "chat",
            "read_thread",
            json!({"channel": "eng", "thread": "t1"}),
        )
        .await
        .unwrap();
    let messages = thread.structured.unwrap()["messages"].clone();
    let authors: Vec<(&str, &str)> = messages
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["as"].as_str().unwrap(), m["text"].as_str().unwrap()))
        .collect();
    assert_eq!(
        authors,
        [
            ("ana-chat-token", "hello from ana"),
            ("bo-chat-token", "hi ana")
        ]
    );
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["as"], "ana-chat-token");
    assert_eq!(lines[1]["as"], "bo-chat-token");
    assert_eq!(lines[1]["channel"], "eng");
    assert_eq!(lines[1]["thread"], "t1");
    assert!(lines[1]["at_ms"].as_u64().unwrap() > 0);

    // The working indicator: each change a line of the working log, as
    // the seat; the message log holds messages only.
    let at = json!({"channel": "eng", "thread": "t1"});
    let raised = bo.call("chat", "raise_working", at.clone()).await.unwrap();
    assert_eq!((raised.text.as_str(), raised.is_error), ("raised", false));
    let cleared = bo.call("chat", "clear_working", at).await.unwrap();
    assert_eq!(
        (cleared.text.as_str(), cleared.is_error),
        ("cleared", false)
    );
    let working_log = crewlet_mcp::chat::working_log(&log);
    assert_eq!(working_log.file_name().unwrap(), "chat.working.jsonl");
    let changes: Vec<(String, bool)> = std::fs::read_to_string(&working_log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<crewlet_mcp::chat::Working>(l).unwrap())
        .map(|w| {
            (
                format!("{}:{}#{}", w.author, w.channel, w.thread.unwrap()),
                w.working,
            )
        })
        .collect();
    assert_eq!(
        changes,
        [
            ("bo-chat-token:eng#t1".to_owned(), true),
            ("bo-chat-token:eng#t1".to_owned(), false)
        ]
    );
    assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 2);

    // A tool's own refusal is an answer, not an error.
    let refused = ana
        .call(
            "chat",
            "post_message",
            json!({"channel": "eng", "text": "  "}),
        )
        .await
        .unwrap();
    assert!(refused.is_error);
    assert!(refused.text.contains("`text` is empty"), "{}", refused.text);

    // Shutting one seat down ends its child (reaped) and leaves the other.
    ana.shutdown().await;
    assert!(!process_exists(ana_pid), "ana's child is gone and reaped");
    assert!(process_exists(bo_pid));
    assert_eq!(
        bo.call("chat", "whoami", json!({})).await.unwrap().text,
        "bo-chat-token"
    );
    bo.shutdown().await;
    assert!(!process_exists(bo_pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_server_is_one_child_for_every_seat_and_follows_the_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("chat.jsonl");
    let spec = chat_spec(true, "COMPANY_CHAT_TOKEN", &log);
    let role = BTreeMap::from([("chat".to_owned(), spec.clone())]);
    let shared = SharedChildren::new(opts());
    assert_eq!(shared.epoch(), None);

    let company = resolver(&[("COMPANY_CHAT_TOKEN", "company-bot")]);
    shared
        .apply(ConfigEpoch(1), role.clone(), company.clone())
        .await;
    assert_eq!(shared.epoch(), Some(ConfigEpoch(1)));
    let pid = shared.pid("chat").expect("the shared child started");

    // A seat resolver that would give another identity is not consulted.
    let seat_resolver = resolver(&[("COMPANY_CHAT_TOKEN", "not-used")]);
    let ana = SeatTools::start("ana", &role, &shared, seat_resolver.clone(), &opts())
        .await
        .expect("equipped");
    let bo = SeatTools::start("bo", &role, &shared, seat_resolver.clone(), &opts())
        .await
        .expect("equipped");
    assert_eq!(pid_of(&ana.servers(), "chat"), pid);
    assert_eq!(pid_of(&bo.servers(), "chat"), pid);
    assert!(summary(&ana.servers(), "chat").shared);
    assert_eq!(
        ana.call("chat", "whoami", json!({})).await.unwrap().text,
        "company-bot"
    );
    assert_eq!(
        bo.call("chat", "whoami", json!({})).await.unwrap().text,
        "company-bot"
    );

    let rows = merge_status(
        ana.status()
            .into_iter()
            .chain(bo.status())
            .chain(shared.status()),
    );
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].started, rows[0].failed, rows[0].tools), (1, 0, 5));
    assert!(rows[0].shared);

    // A seat's shutdown lets go of the shared child; it keeps running.
    ana.shutdown().await;
    assert!(process_exists(pid));
    assert_eq!(
        bo.call("chat", "whoami", json!({})).await.unwrap().text,
        "company-bot"
    );

    // Same spec and secrets at the next epoch: the child is kept.
    shared
        .apply(ConfigEpoch(2), role.clone(), company.clone())
        .await;
    assert_eq!(shared.pid("chat"), Some(pid));

    // A rotated secret: a new child; the old one lives while bo holds it.
    shared
        .apply(
            ConfigEpoch(3),
            role.clone(),
            resolver(&[("COMPANY_CHAT_TOKEN", "company-bot-2")]),
        )
        .await;
    let pid3 = shared.pid("chat").unwrap();
    assert_ne!(pid3, pid);
    assert!(process_exists(pid), "still held by bo");
    assert_eq!(
        bo.call("chat", "whoami", json!({})).await.unwrap().text,
        "company-bot"
    );
    let carol = SeatTools::start("carol", &role, &shared, seat_resolver.clone(), &opts())
        .await
        .expect("equipped");
    assert_eq!(
        carol.call("chat", "whoami", json!({})).await.unwrap().text,
        "company-bot-2"
    );
    bo.shutdown().await;
    // bo held the last handle: dropping it closes the old child.
    until(
        "the replaced shared child exits",
        Duration::from_secs(10),
        || !process_exists(pid),
    )
    .await;

    // A role giving the shared name another spec is refused for that seat.
    let other = BTreeMap::from([("chat".to_owned(), chat_spec(true, "OTHER_TOKEN", &log))]);
    let dave = SeatTools::start("dave", &other, &shared, seat_resolver.clone(), &opts())
        .await
        .expect("equipped");
    let reason = failure(&dave.servers(), "chat");
    assert!(reason.contains("another spec"), "{reason}");

    // Removed at the next epoch, with no seat holding it: stopped at once.
    carol.shutdown().await;
    shared
        .apply(ConfigEpoch(4), BTreeMap::new(), company.clone())
        .await;
    assert!(
        !process_exists(pid3),
        "a removed, unused shared child is stopped"
    );
    let eve = SeatTools::start("eve", &role, &shared, seat_resolver.clone(), &opts())
        .await
        .expect("equipped");
    let reason = failure(&eve.servers(), "chat");
    assert!(reason.contains("no shared server `chat`"), "{reason}");
    assert!(matches!(
        eve.call("chat", "whoami", json!({})).await,
        Err(McpError::NotStarted { .. })
    ));

    // A per-seat template is never run node-wide.
    let template = BTreeMap::from([(
        "chat".to_owned(),
        chat_spec(false, "COMPANY_CHAT_TOKEN", &log),
    )]);
    shared
        .apply(ConfigEpoch(5), template, company.clone())
        .await;
    let rows = shared.status();
    assert_eq!((rows[0].started, rows[0].failed), (0, 1));
    assert!(
        rows[0]
            .last_failure
            .as_ref()
            .unwrap()
            .contains("per-seat template")
    );

    shared
        .apply(ConfigEpoch(6), role.clone(), company.clone())
        .await;
    let pid6 = shared.pid("chat").unwrap();
    let frank = SeatTools::start("frank", &role, &shared, seat_resolver, &opts())
        .await
        .expect("equipped");
    shared.shutdown().await;
    assert!(
        !process_exists(pid6),
        "shutdown stops and reaps shared children"
    );
    match frank.call("chat", "whoami", json!({})).await {
        Err(McpError::ServerGone { server, .. }) => assert_eq!(server, "chat"),
        other => panic!("expected ServerGone, got {other:?}"),
    }
    shared.apply(ConfigEpoch(7), role, company).await;
    assert_eq!(shared.pid("chat"), None, "no applies after shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_servers_are_recorded_and_the_seat_runs_with_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("chat.jsonl");
    let mut role = BTreeMap::from([
        ("good".to_owned(), chat_spec(false, "SEAT_CHAT_TOKEN", &log)),
        ("unresolved".to_owned(), chat_spec(false, "NOT_GIVEN", &log)),
        (
            "missing".to_owned(),
            stdio("/nonexistent/crewlet-no-such-mcp", &[], &[]),
        ),
        (
            "exits".to_owned(),
            stdio(
                "sh",
                &["-c", "echo 'boom: config file unreadable' >&2; exit 3"],
                &[],
            ),
        ),
        (
            "no-identity".to_owned(),
            stdio(CHAT, &[], &[("CHAT_LOG", "/dev/null")]),
        ),
        ("silent".to_owned(), stdio("sleep", &["1000"], &[])),
        // Not on the node's allow-list: refused at spawn, never started.
        (
            "not-allowed".to_owned(),
            stdio("/bin/cat", &["/etc/passwd"], &[]),
        ),
        (
            "loader".to_owned(),
            stdio("sh", &["-c", "exit 0"], &[("LD_PRELOAD", "/tmp/x.so")]),
        ),
    ]);
    // A secret a dying child prints is scrubbed from the recorded reason.
    role.insert(
        "leaky".to_owned(),
        stdio(
            "sh",
            &["-c", "echo \"bad token: $TOKEN\" >&2; exit 1"],
            &[("TOKEN", "${SEAT_CHAT_TOKEN}")],
        ),
    );
    let shared = SharedChildren::new(McpOptions {
        policy: test_policy(),
        ..McpOptions::default()
    });
    let opts = McpOptions {
        start_timeout: Duration::from_secs(3),
        policy: test_policy(),
        ..McpOptions::default()
    };
    let started = Instant::now();
    let seat = SeatTools::start(
        "ana",
        &role,
        &shared,
        resolver(&[("SEAT_CHAT_TOKEN", "ana-secret-token")]),
        &opts,
    )
    .await
    .expect("equipped");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "servers start concurrently, bounded: {took:?}"
    );

    let servers = seat.servers();
    assert_eq!(
        summary(&servers, "good").state,
        ServerState::Started { tools: 5 }
    );
    let reasons: BTreeMap<&str, String> = [
        "unresolved",
        "missing",
        "not-allowed",
        "loader",
        "exits",
        "no-identity",
        "silent",
        "leaky",
    ]
    .into_iter()
    .map(|name| (name, failure(&servers, name)))
    .collect();
    for (name, reason) in &reasons {
        println!("{name}: {reason}");
        assert!(reason.len() <= crewlet_mcp::REASON_MAX, "{name}: {reason}");
        assert!(
            !reason.contains("ana-secret-token"),
            "{name} leaks: {reason}"
        );
    }
    assert!(
        reasons["unresolved"].contains("${NOT_GIVEN}"),
        "{}",
        reasons["unresolved"]
    );
    assert!(reasons["unresolved"].contains("env.CHAT_IDENTITY"));
    assert!(
        reasons["missing"].contains("\"/nonexistent/crewlet-no-such-mcp\" cannot be run here"),
        "{}",
        reasons["missing"]
    );
    assert!(
        reasons["not-allowed"].contains("refused by this node (command)")
            && reasons["not-allowed"].contains("allowed_commands"),
        "{}",
        reasons["not-allowed"]
    );
    assert!(
        reasons["loader"].contains("(env.LD_PRELOAD)"),
        "{}",
        reasons["loader"]
    );
    assert!(children_named("cat").is_empty(), "a refused server ran");
    assert!(
        reasons["missing"].contains("No such file"),
        "{}",
        reasons["missing"]
    );
    assert!(
        reasons["exits"].contains("boom: config file unreadable"),
        "{}",
        reasons["exits"]
    );
    assert!(
        reasons["no-identity"].contains("CHAT_IDENTITY is not set"),
        "{}",
        reasons["no-identity"]
    );
    assert!(
        reasons["silent"].contains("within 3s"),
        "{}",
        reasons["silent"]
    );
    assert!(
        reasons["leaky"].contains("bad token: [redacted]"),
        "{}",
        reasons["leaky"]
    );
    until(
        "the silent child is killed and reaped",
        Duration::from_secs(10),
        || children_named("sleep").is_empty(),
    )
    .await;

    // Errors, each distinct.
    match seat.call("missing", "anything", json!({})).await {
        Err(McpError::NotStarted { server, reason }) => {
            assert_eq!(server, "missing");
            assert_eq!(reason, reasons["missing"]);
        }
        other => panic!("expected NotStarted, got {other:?}"),
    }
    assert!(matches!(
        seat.tools("silent"),
        Err(McpError::NotStarted { .. })
    ));
    match seat.call("nope", "whoami", json!({})).await {
        Err(e @ McpError::UnknownServer { .. }) => {
            assert!(e.to_string().contains("exits, good, leaky"), "{e}")
        }
        other => panic!("expected UnknownServer, got {other:?}"),
    }
    assert!(matches!(
        seat.call("good", "delete_everything", json!({})).await,
        Err(McpError::UnknownTool { .. })
    ));
    assert!(matches!(
        seat.call("good", "whoami", json!([1])).await,
        Err(McpError::BadArguments {
            got: "an array",
            ..
        })
    ));
    // Arguments the tool's schema refuses: the server answers, never a hang.
    let wrong = seat
        .call("good", "post_message", json!({"channel": 5}))
        .await;
    match wrong {
        Err(McpError::CallRefused { .. }) => {}
        Ok(result) => assert!(result.is_error, "{result:?}"),
        other => panic!("expected a refusal, got {other:?}"),
    }

    let rows = seat.status();
    let good = rows.iter().find(|r| r.server == "good").unwrap();
    assert_eq!((good.started, good.failed, good.tools), (1, 0, 5));
    let silent = rows.iter().find(|r| r.server == "silent").unwrap();
    assert_eq!((silent.started, silent.failed), (0, 1));
    assert_eq!(silent.last_failure.as_ref(), Some(&reasons["silent"]));

    // The good child dies mid-life: calls fail clearly and at once.
    let pid = pid_of(&servers, "good");
    assert_eq!(
        seat.call("good", "whoami", json!({})).await.unwrap().text,
        "ana-secret-token"
    );
    // SAFETY: signalling a child this test started.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) }, 0);
    for _ in 0..2 {
        let answer = tokio::time::timeout(
            Duration::from_secs(10),
            seat.call("good", "whoami", json!({})),
        )
        .await
        .expect("a dead child answers at once, it never hangs");
        match answer {
            Err(e @ McpError::ServerGone { .. }) => {
                assert!(e.to_string().contains("`good` is gone"), "{e}")
            }
            other => panic!("expected ServerGone, got {other:?}"),
        }
    }
    seat.shutdown().await;
    until(
        "the killed child is reaped",
        Duration::from_secs(10),
        || !process_exists(pid),
    )
    .await;
}

/// Prints the time to start 20 seats with one chat child each
/// (spawn + handshake + tools/list), and to stop them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_seats_start_their_own_children() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("chat.jsonl");
    let role = BTreeMap::from([("chat".to_owned(), chat_spec(false, "SEAT_CHAT_TOKEN", &log))]);
    let shared = SharedChildren::new(opts());
    let started = Instant::now();
    let seats = futures::future::join_all((0..20).map(|i| {
        let role = &role;
        let shared = &shared;
        async move {
            let token = format!("seat-{i}");
            SeatTools::start(
                &format!("s{i}"),
                role,
                shared,
                resolver(&[("SEAT_CHAT_TOKEN", &token)]),
                &opts(),
            )
            .await
            .expect("equipped")
        }
    }))
    .await;
    let start_time = started.elapsed();
    let mut pids: Vec<u32> = seats.iter().map(|s| pid_of(&s.servers(), "chat")).collect();
    pids.sort();
    pids.dedup();
    assert_eq!(pids.len(), 20, "twenty distinct children");
    let answers = futures::future::join_all(
        seats
            .iter()
            .map(|s| async { s.call("chat", "whoami", json!({})).await.unwrap().text }),
    )
    .await;
    for (i, who) in answers.iter().enumerate() {
        assert_eq!(who, &format!("seat-{i}"));
    }
    // Twenty children post at once into one log: whole lines, distinct ids.
    let posted = futures::future::join_all(seats.iter().map(|s| async {
        let answer = s
            .call(
                "chat",
                "post_message",
                json!({"channel": "all", "text": "present"}),
            )
            .await
            .unwrap();
        answer.structured.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned()
    }))
    .await;
    let mut ids: Vec<u32> = posted.iter().map(|id| id.parse().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, (1..=20).collect::<Vec<u32>>());
    let text = std::fs::read_to_string(&log).unwrap();
    let mut authors: Vec<String> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["as"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    authors.sort();
    let mut expected: Vec<String> = (0..20).map(|i| format!("seat-{i}")).collect();
    expected.sort();
    assert_eq!(authors, expected);
    let rows = merge_status(seats.iter().flat_map(|s| s.status()));
    assert_eq!((rows[0].started, rows[0].failed), (20, 0));
    let stopping = Instant::now();
    futures::future::join_all(seats.into_iter().map(SeatTools::shutdown)).await;
    let stop_time = stopping.elapsed();
    assert!(pids.iter().all(|p| !process_exists(*p)));
    println!(
        "mcp figure: 20 seats × 1 stdio chat child started (spawn+handshake+tools/list) in {start_time:?}; stopped in {stop_time:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_runs_in_its_allowed_working_directory_by_the_checked_path() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let mut spec = stdio("sh", &["-c", "echo \"in $(pwd) as $0\" >&2; exit 1"], &[]);
    if let crewlet_company::McpTransport::Stdio { cwd, .. } = &mut spec.transport {
        *cwd = Some(work.display().to_string());
    }
    let role = BTreeMap::from([("where".to_owned(), spec)]);
    let sh = std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|d| d.join("sh"))
        .find(|p| p.is_file())
        .unwrap();
    let cfg = crewlet_config::McpConfig {
        allowed_commands: vec![crewlet_config::AllowedCommand {
            program: Some(sh),
            args_prefix: Vec::new(),
        }],
        allowed_dirs: vec![dir.path().to_owned()],
    };
    let opts = McpOptions {
        start_timeout: Duration::from_secs(5),
        policy: std::sync::Arc::new(crewlet_mcp::CommandPolicy::new(&cfg, None)),
        ..McpOptions::default()
    };
    let shared = SharedChildren::new(opts.clone());
    let seat = SeatTools::start("ana", &role, &shared, resolver(&[]), &opts)
        .await
        .expect("equipped");
    let servers = seat.servers();
    let reason = match &summary(&servers, "where").state {
        ServerState::Failed { reason } => reason.clone(),
        other => panic!("{other:?}"),
    };
    let canonical = std::fs::canonicalize(&work).unwrap();
    assert!(
        reason.contains(&format!("in {} as sh", canonical.display())),
        "{reason}"
    );
    seat.shutdown().await;
}

/// A resolver that answers "not known yet" for `unknown`, else `pairs`.
fn knowing(unknown: &'static str, pairs: &[(&str, &str)]) -> crewlet_mcp::Resolver {
    let known = resolver(pairs);
    crewlet_mcp::Resolver::new(move |name: &str| {
        if name == unknown {
            crewlet_secrets::Lookup::Unknown("the secrets bucket has not answered".into())
        } else {
            known.lookup(name)
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_not_known_yet_starts_nothing_and_the_seat_is_equipped_once_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("chat.jsonl");
    // A seat's own server, a plain one beside it, and a shared one.
    let role = BTreeMap::from([
        ("chat".to_owned(), chat_spec(false, "SEAT_CHAT_TOKEN", &log)),
        ("plain".to_owned(), chat_spec(false, "PLAIN_TOKEN", &log)),
    ]);
    let shared = SharedChildren::new(opts());
    let waiting = SeatTools::start(
        "ana",
        &role,
        &shared,
        knowing("SEAT_CHAT_TOKEN", &[("PLAIN_TOKEN", "plain-bot")]),
        &opts(),
    )
    .await;
    match waiting {
        Err(e) => {
            assert_eq!(e.server, "chat");
            assert!(e.to_string().contains("SEAT_CHAT_TOKEN"), "{e}");
        }
        Ok(tools) => panic!("equipped without its credential: {:?}", tools.servers()),
    }
    let ana = SeatTools::start(
        "ana",
        &role,
        &shared,
        resolver(&[("SEAT_CHAT_TOKEN", "ana-bot"), ("PLAIN_TOKEN", "plain-bot")]),
        &opts(),
    )
    .await
    .expect("equipped once the credential is known");
    assert_eq!(
        ana.call("chat", "whoami", json!({})).await.unwrap().text,
        "ana-bot"
    );
    ana.shutdown().await;

    // A shared server whose credential is unknown: the node's set waits,
    // a seat naming it is not equipped, and the next apply of the same
    // epoch starts it.
    let spec = chat_spec(true, "COMPANY_CHAT_TOKEN", &log);
    let role = BTreeMap::from([("company".to_owned(), spec)]);
    shared
        .apply(
            ConfigEpoch(1),
            role.clone(),
            knowing("COMPANY_CHAT_TOKEN", &[]),
        )
        .await;
    assert!(shared.waiting());
    assert_eq!(shared.pid("company"), None, "nothing started");
    let err = SeatTools::start("bo", &role, &shared, resolver(&[]), &opts())
        .await
        .err()
        .expect("not equipped while the shared server waits");
    assert_eq!(err.server, "company");
    shared
        .apply(
            ConfigEpoch(1),
            role.clone(),
            resolver(&[("COMPANY_CHAT_TOKEN", "company-bot")]),
        )
        .await;
    assert!(!shared.waiting());
    let bo = SeatTools::start("bo", &role, &shared, resolver(&[]), &opts())
        .await
        .expect("equipped");
    assert_eq!(
        bo.call("company", "whoami", json!({})).await.unwrap().text,
        "company-bot"
    );
    bo.shutdown().await;
    shared.shutdown().await;
}
