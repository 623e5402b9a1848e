//! Every webhook plugin, as a real component in wasmtime, against the
//! vendors' published vectors and against forged, missing, truncated and
//! malformed headers and stale or future timestamps.

use crate::common;

use common::{hmac_hex, manifest, runtime};
use crewlet_plugins::webhook::{ParseError, ReplyTo, Request, VerifyError, Wakes, WebhookPlugin};

fn load(rel: &str) -> (WebhookPlugin, tempfile::TempDir) {
    let (rt, data) = runtime();
    (
        WebhookPlugin::load(&rt, manifest(rel)).unwrap_or_else(|e| panic!("{e}")),
        data,
    )
}

fn owed_at(channel: &str, thread: Option<&str>) -> ReplyTo {
    ReplyTo {
        channel: channel.to_string(),
        thread: thread.map(str::to_string),
    }
}

async fn verify(p: &WebhookPlugin, req: &Request) -> Result<(), VerifyError> {
    p.verify(req).await.expect("verify must not fault")
}

// GitHub's documented example ("Validating webhook deliveries").
const GH_SECRET: &[u8] = b"It's a Secret to Everybody";
const GH_BODY: &[u8] = b"Hello, World!";
const GH_SIG: &str = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

#[tokio::test]
async fn github_documented_vector_and_bad_headers() {
    let (p, _d) = load("webhooks/github");
    let secrets: &[(&str, &[u8])] = &[("github_webhook_secret", GH_SECRET)];
    let req = |sig: Option<&str>| {
        let headers: Vec<(&str, &str)> = sig
            .map(|s| ("X-Hub-Signature-256", s))
            .into_iter()
            .collect();
        Request::new("/webhooks/github", &headers, GH_BODY, secrets, 0)
    };
    assert_eq!(verify(&p, &req(Some(GH_SIG))).await, Ok(()));
    let forged = GH_SIG.replace("757107ea", "757107eb");
    assert_eq!(
        verify(&p, &req(Some(&forged))).await,
        Err(VerifyError::Mismatch)
    );
    assert_eq!(
        verify(&p, &req(None)).await,
        Err(VerifyError::MissingHeader("x-hub-signature-256".into()))
    );
    let malformed = VerifyError::MalformedHeader("x-hub-signature-256".into());
    assert_eq!(
        verify(&p, &req(Some(&GH_SIG[..30]))).await,
        Err(malformed.clone()),
        "truncated"
    );
    assert_eq!(
        verify(&p, &req(Some(&GH_SIG[7..]))).await,
        Err(malformed.clone()),
        "no prefix"
    );
    assert_eq!(
        verify(
            &p,
            &req(Some(
                "sha256=zz57107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e1"
            ))
        )
        .await,
        Err(malformed.clone())
    );
    assert_eq!(
        verify(&p, &req(Some("sha256=ünïcödé"))).await,
        Err(malformed)
    );
    let no_secret = Request::new(
        "/webhooks/github",
        &[("x-hub-signature-256", GH_SIG)],
        GH_BODY,
        &[],
        0,
    );
    assert_eq!(
        verify(&p, &no_secret).await,
        Err(VerifyError::MissingSecret("github_webhook_secret".into()))
    );
    // A secret the manifest does not declare never reaches the plugin.
    let other = Request::new(
        "/webhooks/github",
        &[("x-hub-signature-256", GH_SIG)],
        GH_BODY,
        &[("slack_signing_secret", GH_SECRET)],
        0,
    );
    assert_eq!(
        verify(&p, &other).await,
        Err(VerifyError::MissingSecret("github_webhook_secret".into()))
    );
    // A body changed after signing.
    let tampered = Request::new(
        "/webhooks/github",
        &[("x-hub-signature-256", GH_SIG)],
        b"Hello, World?",
        secrets,
        0,
    );
    assert_eq!(verify(&p, &tampered).await, Err(VerifyError::Mismatch));
}

#[tokio::test]
async fn github_parse_normalises_an_issue_comment() {
    let (p, _d) = load("webhooks/github");
    let body = br#"{"action":"created","issue":{"number":42,"body":"x","assignees":[{"login":"ada"},{"login":"bob"}]},
        "comment":{"body":"@crew-bot please look, cc @ada."},"repository":{"full_name":"acme/app"}}"#;
    let req = Request::new(
        "/webhooks/github",
        &[
            ("x-github-event", "issue_comment"),
            ("x-github-delivery", "d-1"),
        ],
        body,
        &[],
        0,
    );
    let parsed = p.parse(&req).await.unwrap().unwrap();
    assert_eq!(parsed.deliveries.len(), 1);
    let d = &parsed.deliveries[0];
    assert_eq!(d.source, "github");
    assert_eq!(d.event_type, "issue_comment.created");
    assert_eq!(d.delivery_id, "d-1");
    assert_eq!(d.addressed.mentions, vec!["crew-bot", "ada"]);
    assert_eq!(d.addressed.assignees, vec!["ada", "bob"]);
    assert_eq!(d.addressed.channel.as_deref(), Some("acme/app"));
    assert_eq!(d.addressed.thread.as_deref(), Some("42"));
    assert_eq!(
        d.owed,
        Some(owed_at("acme/app", Some("42"))),
        "a comment waits for an answer"
    );
    assert_eq!(d.text.as_deref(), Some("@crew-bot please look, cc @ada."));
    assert_eq!(d.payload, body.to_vec());

    let broken = Request::new(
        "/webhooks/github",
        &[("x-github-event", "push"), ("x-github-delivery", "d")],
        b"{\"trunc",
        &[],
        0,
    );
    assert!(matches!(
        p.parse(&broken).await.unwrap(),
        Err(ParseError::MalformedBody(_))
    ));
    let no_event = Request::new(
        "/webhooks/github",
        &[("x-github-delivery", "d")],
        b"{}",
        &[],
        0,
    );
    assert_eq!(
        p.parse(&no_event).await.unwrap(),
        Err(ParseError::MissingField("header x-github-event".into()))
    );
}

#[tokio::test]
async fn github_parse_reads_a_full_delivery_and_a_review_request() {
    let (p, _d) = load("webhooks/github");
    // A delivery of the real size and shape (~10 KB), signed: verify runs
    // the host's `crypto` import over the whole body.
    let body = crewlet_testkit::github::issue_comment("acme/robot", 7, "@ada have a look");
    let secret = b"full-size";
    let sig = format!("sha256={}", hmac_hex(secret, &[&body]));
    let headers = [
        ("x-github-event", "issue_comment"),
        ("x-github-delivery", "d-full"),
        ("x-hub-signature-256", sig.as_str()),
    ];
    let secrets: &[(&str, &[u8])] = &[("github_webhook_secret", secret)];
    let req = Request::new("/webhooks/github", &headers, &body, secrets, 0);
    assert_eq!(verify(&p, &req).await, Ok(()));
    let mut tampered = body.clone();
    tampered[body.len() / 2] ^= 1;
    let req_tampered = Request::new("/webhooks/github", &headers, &tampered, secrets, 0);
    assert_eq!(verify(&p, &req_tampered).await, Err(VerifyError::Mismatch));
    let d = &p.parse(&req).await.unwrap().unwrap().deliveries[0];
    assert_eq!(d.event_type, "issue_comment.created");
    assert_eq!(d.addressed.mentions, vec!["ada"]);
    assert_eq!(d.addressed.channel.as_deref(), Some("acme/robot"));
    assert_eq!(d.addressed.thread.as_deref(), Some("7"));
    assert!(d.addressed.assignees.is_empty());

    // A review request: a team among the reviewers has no login and is
    // skipped; the pull request's number is the thread; an empty body
    // yields to the next one.
    let review = br#"{"action":"review_requested","pull_request":{"number":12,"body":"",
        "assignees":[{"login":"bob"}],
        "requested_reviewers":[{"login":"ada"},{"name":"core","slug":"core"}]},
        "requested_reviewer":{"login":"cy"},"assignee":{"login":"bob"},
        "review":{"body":null},"repository":{"full_name":"acme/app"}}"#;
    let req = Request::new(
        "/webhooks/github",
        &[
            ("x-github-event", "pull_request"),
            ("x-github-delivery", "d-2"),
        ],
        review,
        &[],
        0,
    );
    let d = &p.parse(&req).await.unwrap().unwrap().deliveries[0];
    assert_eq!(d.event_type, "pull_request.review_requested");
    assert_eq!(d.addressed.reviewers, vec!["ada", "cy"]);
    assert_eq!(d.addressed.assignees, vec!["bob"]);
    assert_eq!(d.addressed.thread.as_deref(), Some("12"));
    assert_eq!(d.owed, None, "a review request asks for work");
    assert_eq!(d.text, None);

    // A field of the wrong type is a malformed body, not a fault.
    let wrong = Request::new(
        "/webhooks/github",
        &[
            ("x-github-event", "issue_comment"),
            ("x-github-delivery", "d-3"),
        ],
        br#"{"comment":"not an object"}"#,
        &[],
        0,
    );
    assert!(matches!(
        p.parse(&wrong).await.unwrap(),
        Err(ParseError::MalformedBody(_))
    ));
}

// Slack's documented signing example ("Verifying requests from Slack").
const SLACK_SECRET: &[u8] = b"8f742231b10e8888abcd99yyyzzz85a5";
const SLACK_TS: i64 = 1531420618;
const SLACK_BODY: &[u8] = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
const SLACK_SIG: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";

fn slack_req(sig: &str, ts: &str, body: &[u8], now: i64) -> Request {
    Request::new(
        "/webhooks/slack",
        &[
            ("X-Slack-Signature", sig),
            ("X-Slack-Request-Timestamp", ts),
        ],
        body,
        &[("slack_signing_secret", SLACK_SECRET)],
        now,
    )
}

#[tokio::test]
async fn slack_documented_vector_window_and_bad_headers() {
    let (p, _d) = load("webhooks/slack");
    let ts = SLACK_TS.to_string();
    assert_eq!(
        verify(&p, &slack_req(SLACK_SIG, &ts, SLACK_BODY, SLACK_TS + 12)).await,
        Ok(())
    );
    assert_eq!(
        verify(&p, &slack_req(SLACK_SIG, &ts, SLACK_BODY, SLACK_TS + 300)).await,
        Ok(())
    );
    assert_eq!(
        verify(&p, &slack_req(SLACK_SIG, &ts, SLACK_BODY, SLACK_TS + 301)).await,
        Err(VerifyError::StaleTimestamp(SLACK_TS)),
        "stale"
    );
    assert_eq!(
        verify(&p, &slack_req(SLACK_SIG, &ts, SLACK_BODY, SLACK_TS - 301)).await,
        Err(VerifyError::StaleTimestamp(SLACK_TS)),
        "from the future"
    );
    assert_eq!(
        verify(&p, &slack_req(SLACK_SIG, &ts, b"token=forged", SLACK_TS)).await,
        Err(VerifyError::Mismatch)
    );
    // A replay with a fresh timestamp but the old signature.
    let later = (SLACK_TS + 100).to_string();
    assert_eq!(
        verify(
            &p,
            &slack_req(SLACK_SIG, &later, SLACK_BODY, SLACK_TS + 100)
        )
        .await,
        Err(VerifyError::Mismatch)
    );
    assert_eq!(
        verify(&p, &slack_req(SLACK_SIG, "yesterday", SLACK_BODY, SLACK_TS)).await,
        Err(VerifyError::MalformedHeader(
            "x-slack-request-timestamp".into()
        ))
    );
    assert_eq!(
        verify(&p, &slack_req(&SLACK_SIG[..40], &ts, SLACK_BODY, SLACK_TS)).await,
        Err(VerifyError::MalformedHeader("x-slack-signature".into()))
    );
    assert_eq!(
        verify(
            &p,
            &slack_req(&SLACK_SIG.replace("v0=", "v1="), &ts, SLACK_BODY, SLACK_TS)
        )
        .await,
        Err(VerifyError::MalformedHeader("x-slack-signature".into()))
    );
    let missing = Request::new(
        "/webhooks/slack",
        &[("x-slack-signature", SLACK_SIG)],
        SLACK_BODY,
        &[("slack_signing_secret", SLACK_SECRET)],
        SLACK_TS,
    );
    assert_eq!(
        verify(&p, &missing).await,
        Err(VerifyError::MissingHeader(
            "x-slack-request-timestamp".into()
        ))
    );

    // The documented body is a slash command.
    let parsed = p
        .parse(&slack_req(SLACK_SIG, &ts, SLACK_BODY, SLACK_TS))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        parsed.deliveries[0].event_type,
        "slash_command/webhook-collect"
    );
    assert_eq!(
        parsed.deliveries[0].addressed.channel.as_deref(),
        Some("G8PSS9T3V")
    );
    assert_eq!(
        parsed.deliveries[0].owed, None,
        "a slash command is not owed"
    );
}

#[tokio::test]
async fn slack_url_verification_and_mentions() {
    let (p, _d) = load("webhooks/slack");
    let challenge = br#"{"token":"t","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    let parsed = p
        .parse(&slack_req("", "0", challenge, 0))
        .await
        .unwrap()
        .unwrap();
    assert!(parsed.deliveries.is_empty());
    let reply = parsed.reply.expect("a challenge reply");
    assert_eq!(reply.content_type, "text/plain");
    assert_eq!(
        reply.body,
        b"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"
    );

    let event = br#"{"type":"event_callback","event_id":"Ev1","event":{"type":"app_mention","text":"<@U0BOT> hi <@U2|ann>","channel":"C1","ts":"1.2","thread_ts":"1.0"}}"#;
    let parsed = p
        .parse(&slack_req("", "0", event, 0))
        .await
        .unwrap()
        .unwrap();
    let d = &parsed.deliveries[0];
    assert_eq!(
        (d.event_type.as_str(), d.delivery_id.as_str()),
        ("app_mention", "Ev1")
    );
    assert_eq!(d.addressed.mentions, vec!["U0BOT", "U2"]);
    assert_eq!(d.addressed.thread.as_deref(), Some("1.0"));
    assert_eq!(d.owed, Some(owed_at("C1", Some("1.0"))));
}

// The Standard Webhooks reference vector.
const SW_SECRET: &[u8] = b"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SW_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const SW_TS: i64 = 1614265330;
const SW_BODY: &[u8] = br#"{"test": 2432232314}"#;
const SW_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

#[tokio::test]
async fn gitlab_standard_webhooks_vector_and_classic_token() {
    let (p, _d) = load("webhooks/gitlab");
    let secrets: &[(&str, &[u8])] = &[
        ("gitlab_signing_token", SW_SECRET),
        ("gitlab_webhook_token", b"classic-token"),
    ];
    let ts = SW_TS.to_string();
    let signed = |sig: &str, now: i64| {
        Request::new(
            "/webhooks/gitlab",
            &[
                ("webhook-id", SW_ID),
                ("webhook-timestamp", &ts),
                ("webhook-signature", sig),
            ],
            SW_BODY,
            secrets,
            now,
        )
    };
    assert_eq!(verify(&p, &signed(SW_SIG, SW_TS)).await, Ok(()));
    assert_eq!(
        verify(&p, &signed(&format!("v1,AAAA {SW_SIG}"), SW_TS)).await,
        Ok(()),
        "one of several"
    );
    assert_eq!(
        verify(&p, &signed(SW_SIG, SW_TS + 301)).await,
        Err(VerifyError::StaleTimestamp(SW_TS))
    );
    assert_eq!(
        verify(&p, &signed(SW_SIG, SW_TS - 301)).await,
        Err(VerifyError::StaleTimestamp(SW_TS))
    );
    assert_eq!(
        verify(
            &p,
            &signed("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OF=", SW_TS)
        )
        .await,
        Err(VerifyError::Mismatch)
    );
    assert_eq!(
        verify(&p, &signed("v1a,zzz", SW_TS)).await,
        Err(VerifyError::MalformedHeader("webhook-signature".into()))
    );
    let no_id = Request::new(
        "/webhooks/gitlab",
        &[("webhook-timestamp", &ts), ("webhook-signature", SW_SIG)],
        SW_BODY,
        secrets,
        SW_TS,
    );
    assert_eq!(
        verify(&p, &no_id).await,
        Err(VerifyError::MissingHeader("webhook-id".into()))
    );

    let classic = |token: Option<&str>| {
        let headers: Vec<(&str, &str)> = token.map(|t| ("X-Gitlab-Token", t)).into_iter().collect();
        Request::new("/webhooks/gitlab", &headers, b"{}", secrets, 0)
    };
    assert_eq!(verify(&p, &classic(Some("classic-token"))).await, Ok(()));
    assert_eq!(
        verify(&p, &classic(Some("classic-tokeN"))).await,
        Err(VerifyError::Mismatch)
    );
    assert_eq!(
        verify(&p, &classic(Some("classic"))).await,
        Err(VerifyError::Mismatch),
        "truncated"
    );
    assert_eq!(
        verify(&p, &classic(None)).await,
        Err(VerifyError::MissingHeader("x-gitlab-token".into()))
    );

    let note = br#"{"object_kind":"note","user":{"username":"ann"},"project":{"path_with_namespace":"acme/app"},
        "object_attributes":{"note":"@crew-bot ship it","action":"create"},"merge_request":{"iid":7},"assignees":[{"username":"bo"}]}"#;
    let req = Request::new(
        "/webhooks/gitlab",
        &[
            ("x-gitlab-event", "Note Hook"),
            ("x-gitlab-event-uuid", "u-1"),
        ],
        note,
        &[],
        0,
    );
    let d = &p.parse(&req).await.unwrap().unwrap().deliveries[0];
    assert_eq!(
        (d.event_type.as_str(), d.delivery_id.as_str()),
        ("note.create", "u-1")
    );
    assert_eq!(d.addressed.mentions, vec!["crew-bot"]);
    assert_eq!(d.addressed.thread.as_deref(), Some("7"));
    assert_eq!(d.addressed.assignees, vec!["bo"]);
    assert!(d.owed.is_some(), "a note waits for an answer");
}

#[tokio::test]
async fn jira_and_confluence_hub_signature() {
    let (p, _d) = load("webhooks/atlassian");
    let body = br#"{"webhookEvent":"comment_created","comment":{"body":"[~accountid:557058:abc] please check"},
        "issue":{"key":"OPS-9","fields":{"project":{"key":"OPS"},"assignee":{"accountId":"557058:def"}}}}"#;
    let sig = format!("sha256={}", hmac_hex(b"jira-secret", &[body]));
    let secrets: &[(&str, &[u8])] = &[
        ("jira_webhook_secret", b"jira-secret"),
        ("confluence_webhook_secret", b"conf-secret"),
    ];
    let req = |route: &str, sig: &str| {
        Request::new(
            route,
            &[
                ("X-Hub-Signature", sig),
                ("X-Atlassian-Webhook-Identifier", "w-1"),
            ],
            body,
            secrets,
            0,
        )
    };
    assert_eq!(verify(&p, &req("/webhooks/jira", &sig)).await, Ok(()));
    assert_eq!(
        verify(&p, &req("/webhooks/confluence", &sig)).await,
        Err(VerifyError::Mismatch),
        "the other product's secret"
    );
    assert_eq!(
        verify(&p, &req("/webhooks/jira", &sig.replace("sha256=", "sha1="))).await,
        Err(VerifyError::MalformedHeader("x-hub-signature".into()))
    );
    assert_eq!(
        verify(&p, &req("/webhooks/jira", &sig[..20])).await,
        Err(VerifyError::MalformedHeader("x-hub-signature".into()))
    );
    let d = &p
        .parse(&req("/webhooks/jira", &sig))
        .await
        .unwrap()
        .unwrap()
        .deliveries[0];
    assert_eq!(
        (
            d.source.as_str(),
            d.event_type.as_str(),
            d.delivery_id.as_str()
        ),
        ("jira", "comment_created", "w-1")
    );
    assert_eq!(d.addressed.mentions, vec!["557058:abc"]);
    assert_eq!(d.addressed.assignees, vec!["557058:def"]);
    assert_eq!(d.addressed.thread.as_deref(), Some("OPS-9"));
    assert_eq!(
        d.owed.as_ref().map(|o| o.thread.as_deref()),
        Some(Some("OPS-9")),
        "a comment waits for an answer"
    );

    let page =
        br#"{"eventType":"page_created","page":{"id":"123","title":"Runbook","spaceKey":"ENG"}}"#;
    let sig = format!("sha256={}", hmac_hex(b"conf-secret", &[page]));
    let req = Request::new(
        "/webhooks/confluence",
        &[
            ("x-hub-signature", sig.as_str()),
            ("x-atlassian-webhook-identifier", "w-2"),
        ],
        page,
        secrets,
        0,
    );
    assert_eq!(verify(&p, &req).await, Ok(()));
    let d = &p.parse(&req).await.unwrap().unwrap().deliveries[0];
    assert_eq!(
        (d.source.as_str(), d.event_type.as_str()),
        ("confluence", "page_created")
    );
    assert_eq!(d.addressed.channel.as_deref(), Some("ENG"));
    assert_eq!(d.owed, None, "a new page asks for nothing");
}

#[tokio::test]
async fn datadog_shared_token() {
    let (p, _d) = load("webhooks/datadog");
    let body = br#"{"id":"123","event_type":"metric_alert_monitor","title":"CPU high","body":"@crew-sre look","alert_id":"9"}"#;
    let req = |token: Option<&str>| {
        let headers: Vec<(&str, &str)> = token
            .map(|t| ("x-crewlet-webhook-token", t))
            .into_iter()
            .collect();
        Request::new(
            "/webhooks/datadog",
            &headers,
            body,
            &[("datadog_webhook_token", b"dd-token-1")],
            0,
        )
    };
    assert_eq!(verify(&p, &req(Some("dd-token-1"))).await, Ok(()));
    assert_eq!(
        verify(&p, &req(Some("dd-token-2"))).await,
        Err(VerifyError::Mismatch)
    );
    assert_eq!(verify(&p, &req(Some(""))).await, Err(VerifyError::Mismatch));
    assert_eq!(
        verify(&p, &req(None)).await,
        Err(VerifyError::MissingHeader("x-crewlet-webhook-token".into()))
    );
    let d = &p.parse(&req(None)).await.unwrap().unwrap().deliveries[0];
    assert_eq!(
        (d.event_type.as_str(), d.delivery_id.as_str()),
        ("metric_alert_monitor", "123")
    );
    assert_eq!(d.addressed.mentions, vec!["crew-sre"]);
    assert_eq!(d.text.as_deref(), Some("CPU high\n\n@crew-sre look"));
    assert_eq!(d.owed, None, "an alert asks for work");
}

/// A webhook component built against WIT 0.4.0 (the custom source as it
/// was built at that version, kept as a fixture) still loads and runs: its
/// deliveries name no sender and wake their route's seat and whom they
/// name, as every delivery did before 0.4.1 — and the same source built
/// today says the same through the current bindings.
#[tokio::test]
async fn a_webhook_component_of_wit_0_4_0_still_loads_and_parses() {
    let manifest = |component: &str| {
        common::manifest_text(
            "testdata/custom-source",
            &format!(
                "name = \"custom-source\"\nversion = \"0.1.0\"\nkind = \"webhook\"\ncomponent = \"{component}\"\n\
                 [limits]\nmemory_mib = 32\ndeadline_ms = 500\n\
                 [webhook]\nroutes = [\"/webhooks/tickets\"]\nsecrets = [\"custom_token\"]\n"
            ),
        )
    };
    let body = br#"{"id":"T-1","kind":"comment","to":"ada","text":"hi","asks":true,"channel":"tickets","thread":"T-1"}"#;
    let secrets: &[(&str, &[u8])] = &[("custom_token", b"tok")];
    let req = Request::new(
        "/webhooks/tickets",
        &[("x-tickets-token", "tok")],
        body,
        secrets,
        0,
    );
    let mut seen = Vec::new();
    for component in [
        "../../../host/plugins/tests/fixtures/custom-source-wit-0.4.0.wasm",
        "../../target/wasm32-wasip2/release/crewlet_test_custom_source.wasm",
    ] {
        let (rt, _data) = runtime();
        let p = WebhookPlugin::load(&rt, manifest(component)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(verify(&p, &req).await, Ok(()), "{component}");
        let wrong = Request::new(
            "/webhooks/tickets",
            &[("x-tickets-token", "no")],
            body,
            secrets,
            0,
        );
        assert_eq!(
            verify(&p, &wrong).await,
            Err(VerifyError::Mismatch),
            "{component}"
        );
        let parsed = p.parse(&req).await.expect("no fault").expect("parsed");
        assert_eq!(parsed.deliveries.len(), 1, "{component}");
        let d = &parsed.deliveries[0];
        assert!(
            d.sender.is_empty() && d.wakes == Wakes::RouteAndNamed,
            "{component}: {d:?}"
        );
        assert_eq!(d.addressed.mentions, ["ada"]);
        assert_eq!(d.owed, Some(owed_at("tickets", Some("T-1"))));
        seen.push(parsed);
    }
    assert_eq!(seen[0], seen[1], "0.4.0 and today's build say the same");
}
