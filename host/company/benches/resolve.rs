//! Resolving a delivery's addressed ids to seats: 20 ids against a company
//! of 1,000 seats that each claim a Slack id and a GitHub login, through
//! the registry, against today's handle match (the rule every id went
//! through before identities: `@` stripped, folded, a seat's handle) in
//! the same run. Also what a document of that size costs to parse with
//! and without identities: the registry is built there, once per revision.
//!
//!     CARGO_TARGET_DIR=target-bench cargo bench -p crewlet-company --bench resolve
//!
//! Figures go to BENCHMARKS.md (`## Ingress`); nothing here asserts them.

use std::hint::black_box;
use std::time::{Duration, Instant};

use crewlet_company::Company;
use crewlet_company::resolve::{Addressed, Resolution, by_handle, resolve};

const SEATS: usize = 1_000;
const IDS: usize = 20;
const ROUNDS: usize = 7;
const PER_ROUND: usize = 50_000;

fn document(identities: bool) -> String {
    let mut doc = String::from(
        "[org]\nname = \"Bench\"\n\n[roles.eng]\nsystem_prompt = \"b\"\n\
         executor = [{ provider = \"openai\", model = \"m\" }]\n\
         reviewer = { provider = \"openai\", model = \"m\" }\n\n[seats]\n",
    );
    for i in 0..SEATS {
        if identities {
            doc.push_str(&format!(
                "seat-{i:04} = {{ role = \"eng\", identities = {{ slack = \"{}\", github = \"acme-seat-{i:04}-bot\" }} }}\n",
                slack_id(i)
            ));
        } else {
            doc.push_str(&format!("seat-{i:04} = {{ role = \"eng\" }}\n"));
        }
    }
    doc
}

fn slack_id(i: usize) -> String {
    format!("U{i:08X}")
}

/// Per call of each case, the median of `ROUNDS` rounds. The machine's
/// speed drifts (2 shared cores), so the cases alternate within each round,
/// their order rotating, rather than run one after the other.
fn per_call(cases: &mut [(&str, &mut dyn FnMut() -> usize)]) -> Vec<Duration> {
    let n = cases.len();
    let mut rounds: Vec<Vec<Duration>> = vec![Vec::new(); n];
    for round in 0..ROUNDS {
        for k in 0..n {
            let i = (k + round) % n;
            let f = &mut cases[i].1;
            let start = Instant::now();
            let mut woken = 0;
            for _ in 0..PER_ROUND {
                woken += f();
            }
            black_box(woken);
            rounds[i].push(start.elapsed() / PER_ROUND as u32);
        }
    }
    rounds
        .into_iter()
        .map(|mut r| {
            r.sort();
            r[ROUNDS / 2]
        })
        .collect()
}

/// Today's rule, as `notify::resolve` applied it to every id: a seat's
/// handle or nothing; each seat once.
fn handle_match(company: &Company, ids: &[String]) -> usize {
    let mut seats = Vec::new();
    for raw in ids {
        if let Some(h) = by_handle(company, raw)
            && !seats.contains(&h)
        {
            seats.push(h);
        }
    }
    seats.len()
}

fn registry(company: &Company, source: &str, ids: &[String]) -> Resolution {
    resolve(
        company,
        &Addressed {
            source,
            route_handle: None,
            mentions: ids,
            assignees: &[],
            reviewers: &[],
        },
    )
}

fn main() {
    let text = document(true);
    let plain = document(false);
    let company = Company::parse(&text).expect("bench company");
    // Two ids a seat, and its handle on the company chat.
    assert_eq!(company.registry.len(), 3 * SEATS);

    let spread = |f: &dyn Fn(usize) -> String| -> Vec<String> {
        (0..IDS).map(|k| f(k * (SEATS / IDS) + 7)).collect()
    };
    let slack = spread(&slack_id);
    let logins = spread(&|i| format!("@Acme-Seat-{i:04}-Bot"));
    let handles = spread(&|i| format!("@seat-{i:04}"));
    let nobody: Vec<String> = (0..IDS).map(|k| format!("U9{k:07X}")).collect();
    assert_eq!(registry(&company, "slack", &slack).seats.len(), IDS);
    assert_eq!(registry(&company, "github", &logins).seats.len(), IDS);
    assert_eq!(registry(&company, "slack", &handles).seats.len(), IDS);
    assert_eq!(handle_match(&company, &handles), IDS);
    assert_eq!(registry(&company, "slack", &nobody).unclaimed.len(), IDS);

    println!(
        "resolve: {IDS} addressed ids, {SEATS} seats with identities, median of {ROUNDS} rounds of {PER_ROUND}"
    );
    let mut cases: [(&str, &mut dyn FnMut() -> usize); 5] = [
        ("today's handle match, 20 handles", &mut || {
            handle_match(&company, black_box(&handles))
        }),
        ("registry, 20 Slack ids", &mut || {
            registry(&company, "slack", black_box(&slack)).seats.len()
        }),
        ("registry, 20 GitHub logins (folded)", &mut || {
            registry(&company, "github", black_box(&logins)).seats.len()
        }),
        ("registry, 20 handles (claimed by none)", &mut || {
            registry(&company, "slack", black_box(&handles)).seats.len()
        }),
        ("registry, 20 unclaimed ids", &mut || {
            registry(&company, "slack", black_box(&nobody))
                .unclaimed
                .len()
        }),
    ];
    let times = per_call(&mut cases);
    for ((name, _), t) in cases.iter().zip(times) {
        println!(
            "  {name:<42} {:>8.2} µs per delivery",
            t.as_secs_f64() * 1e6
        );
    }
    // Parsing alternates the two documents too.
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        for (doc, times) in [(&text, &mut with), (&plain, &mut without)] {
            let start = Instant::now();
            black_box(Company::parse(doc).expect("bench company"));
            times.push(start.elapsed());
        }
    }
    let median = |mut t: Vec<Duration>| {
        t.sort();
        t[ROUNDS / 2].as_secs_f64() * 1e3
    };
    println!(
        "parse: {SEATS} seats with identities {:.1} ms, without {:.1} ms",
        median(with),
        median(without)
    );
}
