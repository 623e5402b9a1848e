//! `crewlet agents memory HANDLE`: a seat's memory (`GET
//! /agents/{handle}/memory`) as tables — skills with every version first
//! (what it learned), then its notes, episodes and the people it knows.

use serde_json::Value;

use crate::{table, text};

/// Text cut to `max` characters for a table cell, on one line.
fn cell(v: &Value, max: usize) -> String {
    let t = text(v).replace('\n', " ");
    if t.chars().count() <= max {
        return t;
    }
    let mut s: String = t.chars().take(max.saturating_sub(1)).collect();
    s.push('…');
    s
}

fn list<'a>(v: &'a Value, key: &str) -> impl Iterator<Item = &'a Value> {
    v[key].as_array().into_iter().flatten()
}

/// The memory answer as text.
pub fn render_memory(v: &Value) -> String {
    let mut out = format!("Memory of {}\n\nSKILLS\n", text(&v["handle"]));
    let mut skills = vec![
        [
            "SKILL", "NAME", "STATE", "ORIGIN", "VERSION", "USES", "STRENGTH",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for s in list(v, "skills") {
        skills.push(vec![
            text(&s["id"]),
            cell(&s["name"], 40),
            text(&s["state"]),
            match s["promoted_from"].as_array() {
                Some(from) if s["origin"] == "promoted" => format!(
                    "promoted from {}",
                    from.iter().map(text).collect::<Vec<_>>().join(", ")
                ),
                _ => text(&s["origin"]),
            },
            text(&s["version"]),
            text(&s["uses"]),
            text(&s["strength"]),
        ]);
    }
    out.push_str(&table(&skills));
    for s in list(v, "skills") {
        for ver in list(s, "versions") {
            out.push_str(&format!(
                "  {} v{} ({}): {}\n",
                text(&s["id"]),
                text(&ver["version"]),
                text(&ver["model"]),
                cell(&ver["procedure"], 200)
            ));
        }
    }
    let mut notes = vec![["NOTE", "TEXT"].map(str::to_owned).to_vec()];
    for n in list(v, "notes") {
        notes.push(vec![text(&n["id"]), cell(&n["text"], 80)]);
    }
    out.push_str("\nNOTES\n");
    out.push_str(&table(&notes));
    let mut episodes = vec![
        ["TURN", "OUTCOME", "TOKENS", "SUMMARY"]
            .map(str::to_owned)
            .to_vec(),
    ];
    for e in list(v, "episodes") {
        episodes.push(vec![
            text(&e["turn_id"]),
            text(&e["outcome"]),
            text(&e["tokens"]),
            cell(&e["summary"], 80),
        ]);
    }
    out.push_str("\nEPISODES\n");
    out.push_str(&table(&episodes));
    let mut profiles = vec![
        ["COUNTERPARTY", "TURNS", "KNOWN"]
            .map(str::to_owned)
            .to_vec(),
    ];
    for p in list(v, "profiles") {
        profiles.push(vec![
            text(&p["counterparty"]),
            text(&p["turns"]),
            cell(&p["known"], 80),
        ]);
    }
    out.push_str("\nPROFILES\n");
    out.push_str(&table(&profiles));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_memory_table_shows_each_skill_with_every_version() {
        let v = json!({
            "handle": "ada",
            "skills": [{"id": "deploy-check", "name": "Deploy check", "state": "active",
                        "origin": "promoted", "promoted_from": ["bob", "cy"], "version": 2,
                        "uses": 3, "strength": 0.8, "versions": [
                {"version": 1, "procedure": "1. read the run", "model": "openai/exec-a"},
                {"version": 2, "procedure": "1. read the run\n2. link it", "model": "openai/exec-a"}]}],
            "notes": [{"id": "n1", "text": "the build is on Jenkins"}],
            "episodes": [{"turn_id": "t1", "outcome": "delivered", "tokens": 42, "summary": "said green"}],
            "profiles": [{"counterparty": "U1", "turns": 2, "known": "asks about builds"}],
        });
        let out = render_memory(&v);
        for want in [
            "Memory of ada",
            "deploy-check  Deploy check  active  promoted from bob, cy  2",
            "deploy-check v2 (openai/exec-a): 1. read the run 2. link it",
            "n1    the build is on Jenkins",
            "t1    delivered  42",
            "U1            2      asks about builds",
        ] {
            assert!(out.contains(want), "{want:?} not in:\n{out}");
        }
    }
}
