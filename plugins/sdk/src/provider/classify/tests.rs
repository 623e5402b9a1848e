//! Real-shaped error bodies, as the vendors document them: the same failure
//! from OpenAI, from Anthropic and from an OpenAI-compatible server gets the
//! same kind.

use super::*;

fn response(status: u16, headers: &[(&str, &str)], body: &str) -> http::Response {
    http::Response {
        status,
        headers: headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
        body: body.as_bytes().to_vec(),
    }
}

/// The WIT spelling, so kinds compare as text (the generated enum derives
/// no `PartialEq`).
fn name(kind: &ErrorKind) -> String {
    match kind {
        ErrorKind::RateLimited(ms) => format!("rate-limited({ms:?})"),
        ErrorKind::Auth => "auth".to_string(),
        ErrorKind::Overloaded => "overloaded".to_string(),
        ErrorKind::BadRequest => "bad-request".to_string(),
        ErrorKind::ContextTooLong => "context-too-long".to_string(),
        ErrorKind::Transient => "transient".to_string(),
        ErrorKind::RequestDenied => "request-denied".to_string(),
    }
}

fn kind(status: u16, headers: &[(&str, &str)], body: &str) -> String {
    name(&classify(&response(status, headers, body), None, "sk-test-key").kind)
}

const OPENAI_CONTEXT: &str = r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130314 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
const OPENAI_RESPONSES_CONTEXT: &str = r#"{"error":{"message":"Your input exceeds the context window of this model. Please adjust your input and try again.","type":"invalid_request_error","param":"input","code":"context_length_exceeded"}}"#;
const ANTHROPIC_CONTEXT: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210345 tokens > 200000 maximum"},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}"#;
const ANTHROPIC_CONTEXT_WITH_MAX_TOKENS: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"input length and `max_tokens` exceed context limit: 197000 + 8192 > 200000, decrease input length or `max_tokens` and try again"}}"#;
const VLLM_CONTEXT: &str = r#"{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}"#;

#[test]
fn a_context_window_error_is_context_too_long_from_every_vendor() {
    for body in [
        OPENAI_CONTEXT,
        OPENAI_RESPONSES_CONTEXT,
        ANTHROPIC_CONTEXT,
        ANTHROPIC_CONTEXT_WITH_MAX_TOKENS,
        VLLM_CONTEXT,
    ] {
        assert_eq!(kind(400, &[], body), "context-too-long", "{body}");
    }
}

/// An answer: its status and body.
type Answer = (u16, &'static str);
/// A failure's name, the kind expected, OpenAI's answer, Anthropic's.
type Case = (&'static str, &'static str, Answer, Answer);

#[test]
fn the_same_failure_gets_the_same_kind_from_openai_and_anthropic() {
    let cases: &[Case] = &[
        (
            "rate limit",
            "rate-limited(Some(2000))",
            (
                429,
                r#"{"error":{"message":"Rate limit reached for gpt-4o in organization org-abc on tokens per min (TPM): Limit 30000, Used 29000, Requested 2000. Please try again in 2s.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#,
            ),
            (
                429,
                r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#,
            ),
        ),
        (
            "bad key",
            "auth",
            (
                401,
                r#"{"error":{"message":"Incorrect API key provided: sk-proj-****abcd.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#,
            ),
            (
                401,
                r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
            ),
        ),
        (
            "key without permission",
            "auth",
            (
                403,
                r#"{"error":{"code":"unsupported_country_region_territory","message":"Country, region, or territory not supported","param":null,"type":"request_forbidden"}}"#,
            ),
            (
                403,
                r#"{"type":"error","error":{"type":"permission_error","message":"Your API key does not have permission to use the specified resource."}}"#,
            ),
        ),
        (
            "no money left",
            "auth",
            (
                429,
                r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#,
            ),
            (
                402,
                r#"{"type":"error","error":{"type":"billing_error","message":"Your credit balance is too low to access the Anthropic API."}}"#,
            ),
        ),
        (
            "overloaded",
            "overloaded",
            (
                503,
                r#"{"error":{"message":"The engine is currently overloaded, please try again later.","type":"server_error","param":null,"code":null}}"#,
            ),
            (
                529,
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            ),
        ),
        (
            "context window",
            "context-too-long",
            (400, OPENAI_CONTEXT),
            (400, ANTHROPIC_CONTEXT),
        ),
        (
            "bad request",
            "bad-request",
            (
                400,
                r#"{"error":{"message":"Unrecognized request argument supplied: temperatur","type":"invalid_request_error","param":null,"code":null}}"#,
            ),
            (
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required"}}"#,
            ),
        ),
        (
            "unknown model",
            "bad-request",
            (
                404,
                r#"{"error":{"message":"The model `gpt-9` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#,
            ),
            (
                404,
                r#"{"type":"error","error":{"type":"not_found_error","message":"model: claude-9"}}"#,
            ),
        ),
        (
            "server error",
            "transient",
            (
                500,
                r#"{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}"#,
            ),
            (
                500,
                r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#,
            ),
        ),
        (
            "timeout",
            "transient",
            (504, "<html><body>504 Gateway Time-out</body></html>"),
            (
                504,
                r#"{"type":"error","error":{"type":"timeout_error","message":"Request timed out"}}"#,
            ),
        ),
    ];
    let advice = [("retry-after", "2")];
    for (failure, expected, openai, anthropic) in cases {
        let headers: &[(&str, &str)] = if openai.0 == 429 { &advice } else { &[] };
        assert_eq!(
            kind(openai.0, headers, openai.1),
            *expected,
            "OpenAI {failure}"
        );
        let headers: &[(&str, &str)] = if anthropic.0 == 429 { &advice } else { &[] };
        assert_eq!(
            kind(anthropic.0, headers, anthropic.1),
            *expected,
            "Anthropic {failure}"
        );
    }
}

#[test]
fn statuses_decide_when_the_body_says_nothing() {
    assert_eq!(
        kind(429, &[("retry-after-ms", "1500")], ""),
        "rate-limited(Some(1500))"
    );
    assert_eq!(kind(429, &[], "busy"), "rate-limited(None)");
    assert_eq!(kind(401, &[], ""), "auth");
    assert_eq!(kind(408, &[], ""), "transient");
    assert_eq!(kind(413, &[], ""), "bad-request");
    assert_eq!(kind(503, &[], ""), "overloaded");
    assert_eq!(kind(502, &[], "<html>bad gateway</html>"), "transient");
    // A body's type outranks a status a proxy rewrote.
    assert_eq!(
        kind(
            500,
            &[],
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
        ),
        "overloaded"
    );
}

#[test]
fn a_context_phrase_in_a_server_error_is_still_transient() {
    let body =
        r#"{"error":{"message":"failed while counting the context length","type":"server_error"}}"#;
    assert_eq!(kind(500, &[], body), "transient");
}

#[test]
fn every_documented_shape_yields_the_vendors_words() {
    let read = |body: &str| VendorBody::read(body.as_bytes());
    assert_eq!(read(OPENAI_CONTEXT).code, "context_length_exceeded");
    assert_eq!(read(ANTHROPIC_CONTEXT).kind, "invalid_request_error");
    assert!(
        read(VLLM_CONTEXT)
            .message
            .starts_with("This model's maximum")
    );
    assert_eq!(read(VLLM_CONTEXT).code, "", "a numeric code is no code");
    assert_eq!(
        read(r#"{"error":"model \"llama9\" not found, try pulling it first"}"#).message,
        "model \"llama9\" not found, try pulling it first"
    );
    assert_eq!(read(r#"{"detail":"Not Found"}"#).message, "Not Found");
    assert_eq!(read("<html>502</html>"), VendorBody::default());
}

#[test]
fn the_message_is_redacted_and_never_the_raw_body() {
    let body = r#"{"error":{"message":"Incorrect API key provided: sk-test-key. See https://platform.openai.com/account/api-keys.","code":"invalid_api_key"}}"#;
    let error = classify(
        &response(401, &[], body),
        Some("req_1".into()),
        "sk-test-key",
    );
    assert_eq!(
        error.message,
        "Incorrect API key provided: [redacted key]. See [redacted url]"
    );
    assert_eq!(
        (error.status, error.request_id.as_deref()),
        (Some(401), Some("req_1"))
    );
    let error = classify(
        &response(502, &[], "<html>secret upstream</html>"),
        None,
        "k",
    );
    assert_eq!(error.message, "HTTP 502 without a documented error body");
}
