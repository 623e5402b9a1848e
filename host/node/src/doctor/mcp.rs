//! Each seat's MCP servers, as a node would start them: the program
//! resolves here and `[mcp] allowed_commands` allows it with its arguments,
//! and every credential its template names is known.
//!
//! Rule: the program is checked by the node's own [`CommandPolicy`] (the
//! one `run` accepts the company with and every spawn checks again), so a
//! refusal here is one `run` would make; it names the seats of the role,
//! since a server is a role's and each of its seats gets a child. A
//! credential is resolved as the node resolves it for the seat (its
//! `credentials` first, then the company's secrets) and is looked for in
//! this environment only: its absence is a warning, never a "no" — the
//! fleet's secrets bucket may hold it, and the doctor does not read it.

use std::collections::BTreeSet;

use crewlet_company::{Company, McpServer, McpTransport, Seat};
use crewlet_config::scan::{Segment, segments};
use crewlet_mcp::{CommandPolicy, Refused};

use super::{Finding, Verdict, bad, ok};
use crate::seats::{DATA_DIR_VARIABLE, SEAT_VARIABLE};

const CHECK: &str = "mcp";

/// The findings on every MCP server of `company`'s roles, for its seats.
pub(super) fn servers(
    company: &Company,
    policy: &CommandPolicy,
    env: &dyn Fn(&str) -> bool,
) -> Vec<Finding> {
    let mut out = Vec::new();
    for (role, r) in &company.roles {
        let seats: Vec<&Seat> = company.seats.values().filter(|s| &s.role == role).collect();
        let names = match seats.as_slice() {
            [] => format!("role {role} (no seat yet)"),
            [one] => format!("seat {}", one.handle),
            many => format!(
                "seats {}",
                many.iter()
                    .map(|s| s.handle.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        for (name, server) in &r.mcp {
            let at = format!("roles.{role}.mcp.{name}");
            out.extend(command(&names, name, &at, server, policy));
            if server.shared {
                out.extend(credentials(
                    "the node's shared child",
                    name,
                    server,
                    None,
                    env,
                ));
            } else {
                for seat in &seats {
                    out.extend(credentials(
                        &format!("seat {}", seat.handle),
                        name,
                        server,
                        Some(seat),
                        env,
                    ));
                }
            }
        }
    }
    out
}

/// Whether the server's program runs here, as `run` would judge it.
fn command(
    seats: &str,
    name: &str,
    at: &str,
    server: &McpServer,
    policy: &CommandPolicy,
) -> Option<Finding> {
    let McpTransport::Stdio {
        command,
        args,
        env,
        cwd,
    } = &server.transport
    else {
        return None;
    };
    Some(
        match policy.check(command, args, env.keys(), cwd.as_deref()) {
            Ok(allowed) => ok(
                CHECK,
                format!(
                    "{seats}: `{name}` runs {}, allowed by [mcp] allowed_commands",
                    allowed.program.display()
                ),
            ),
            Err(refused) => bad(
                CHECK,
                Verdict::Fail,
                format!("{seats}: `{name}` ({at}.{}): {refused}", refused.key()),
                match &refused {
                    Refused::NotFound { .. } => format!(
                        "install the program on this node (docs/recipes.md says how for the recipes' servers) or correct {at}.command; `crewlet run` refuses the company until it resolves"
                    ),
                    Refused::NotAllowed { resolved, .. } => format!(
                        "add \"{}\" to [mcp] allowed_commands in this node's configuration (see docs/recipes/node.toml), or name a program it allows",
                        resolved.display()
                    ),
                    other => format!(
                        "change {at}.{} as the message says, or this node's [mcp] section",
                        other.key()
                    ),
                },
            ),
        },
    )
}

/// Whether every `${NAME}` the server's template names is known for
/// `seat` (`None`: a shared server, resolved as the company's).
fn credentials(
    who: &str,
    name: &str,
    server: &McpServer,
    seat: Option<&Seat>,
    env: &dyn Fn(&str) -> bool,
) -> Vec<Finding> {
    let mut known = Vec::new();
    let mut out = Vec::new();
    for reference in references(&server.transport) {
        let own = seat.and_then(|s| s.credentials.get(&reference));
        let secret = own.map_or(reference.as_str(), |r| r.name_str());
        let said = match own {
            Some(_) => format!("{reference} (its credential {secret})"),
            None => format!("{reference} (a company secret)"),
        };
        if env(secret) {
            known.push(said);
            continue;
        }
        out.push(bad(
            CHECK,
            Verdict::Warn,
            format!("{who}: `{name}` needs {said}, which is not in this environment"),
            format!(
                "fine if the fleet's bucket holds it (`crewlet secrets list`); else `crewlet secrets set {secret}` or export it — until it is known, {who}'s `{name}` does not start"
            ),
        ));
    }
    if !known.is_empty() {
        out.insert(
            0,
            ok(
                CHECK,
                format!(
                    "{who}: `{name}`'s {} set in this environment (a value in the fleet's bucket overrides it)",
                    known.join(", ")
                        + if known.len() == 1 { " is" } else { " are" }
                ),
            ),
        );
    }
    out
}

/// The names a server's launch values reference, but the node's own
/// (`${CREWLET_SEAT}`, `${CREWLET_DATA_DIR}`, `${CREWLET_CHAT_URL}`,
/// `${CREWLET_CHAT_TOKEN}`), each once.
fn references(transport: &McpTransport) -> BTreeSet<String> {
    let values: Vec<&String> = match transport {
        McpTransport::Stdio { args, env, .. } => args.iter().chain(env.values()).collect(),
        McpTransport::Http { headers, .. } => headers.values().collect(),
    };
    values
        .into_iter()
        .flat_map(|v| segments(v))
        .filter_map(|s| match s {
            Ok(Segment::Reference(name)) => Some(name.to_owned()),
            _ => None,
        })
        .filter(|n| {
            ![
                SEAT_VARIABLE,
                DATA_DIR_VARIABLE,
                crewlet_chat::URL_VARIABLE,
                crewlet_chat::TOKEN_VARIABLE,
            ]
            .contains(&n.as_str())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn company(server: &str) -> Company {
        Company::parse(&format!(
            r#"
            [org]
            name = "Acme"
            [roles.r]
            system_prompt = "p"
            executor = [{{ provider = "openai", model = "m", credentials = "${{K}}" }}]
            reviewer = {{ provider = "openai", model = "m", credentials = "${{K}}" }}
            [roles.r.mcp.slack]
            {server}
            [seats]
            ada = {{ role = "r", credentials = {{ SLACK_BOT_TOKEN = "${{ADA_SLACK}}" }} }}
            grace = {{ role = "r", credentials = {{ SLACK_BOT_TOKEN = "${{GRACE_SLACK}}" }} }}
            "#
        ))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn each_seat_is_named_with_the_secret_it_lacks_and_the_node_s_own_names_are_no_secrets() {
        let c = company(
            r#"command = "/bin/sh"
            args = ["${CREWLET_DATA_DIR}/x"]
            env = { SLACK_BOT_TOKEN = "${SLACK_BOT_TOKEN}", TEAM = "${SLACK_TEAM}", WHO = "${CREWLET_SEAT}", CHAT = "${CREWLET_CHAT_TOKEN}" }"#,
        );
        let set = |name: &str| ["ADA_SLACK", "SLACK_TEAM"].contains(&name);
        let of = |seat: &str| {
            let who = format!("seat {seat}");
            credentials(
                &who,
                "slack",
                &c.roles["r"].mcp["slack"],
                c.seat(seat),
                &set,
            )
        };
        let f = of("ada");
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].verdict, Verdict::Ok);
        assert!(
            f[0].detail.contains("its credential ADA_SLACK"),
            "{}",
            f[0].detail
        );
        assert!(
            f[0].detail.contains("SLACK_TEAM (a company secret)"),
            "{}",
            f[0].detail
        );
        let f = of("grace");
        let lacking = f.iter().find(|x| x.verdict == Verdict::Warn).unwrap();
        assert!(
            lacking.detail.starts_with(
                "seat grace: `slack` needs SLACK_BOT_TOKEN (its credential GRACE_SLACK)"
            ),
            "{}",
            lacking.detail
        );
        assert!(
            lacking
                .fix
                .as_deref()
                .unwrap()
                .contains("crewlet secrets set GRACE_SLACK"),
            "{lacking:?}"
        );
        let refs = references(&c.roles["r"].mcp["slack"].transport);
        assert_eq!(
            refs.into_iter().collect::<Vec<_>>(),
            ["SLACK_BOT_TOKEN", "SLACK_TEAM"]
        );
    }
}
