//! `identities` on a seat and `[people.KEY]`: validated, and each id
//! claimed in the document's [`Registry`] (the rules are
//! [`crate::identities`]'s).

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::identities::{Claimant, Identities, Person, Registry, check_id};
use crate::raw::{Errors, non_empty, token};

/// One surface's ids as written: one, or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawIds {
    One(String),
    Many(Vec<String>),
}

/// `[people.KEY]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPerson {
    name: String,
    #[serde(default)]
    identities: BTreeMap<String, RawIds>,
}

/// Validates a claimant's `identities` at `path` and claims each id in
/// `registry`; an id another claimant holds is an error naming both.
pub(crate) fn validate(
    path: &str,
    raw: BTreeMap<String, RawIds>,
    claimant: &Claimant,
    registry: &mut Registry,
    errors: &mut Errors,
) -> Identities {
    let mut out = Identities::new();
    for (surface, ids) in raw {
        let at = format!("{path}.identities.{surface}");
        if errors.check(at.clone(), token(&surface)).is_none() {
            continue;
        }
        let ids = match ids {
            RawIds::One(id) => vec![id],
            RawIds::Many(ids) if ids.is_empty() => {
                errors.add(at, "expected at least one id, or leave the surface out");
                continue;
            }
            RawIds::Many(ids) => ids,
        };
        let mut kept = Vec::new();
        for id in ids {
            if errors.check(at.clone(), check_id(&surface, &id)).is_none() {
                continue;
            }
            if let Some(held) = registry.claim(&surface, &id, claimant) {
                errors.add(
                    at.clone(),
                    format!(
                        "{surface} id {id:?} is claimed by both `{}` and `{}`: an id names one seat or person, so remove it from one of them",
                        held.path(),
                        claimant.path()
                    ),
                );
                continue;
            }
            kept.push(id);
        }
        out.insert(surface, kept);
    }
    out
}

/// On the company chat (`docs/chat.md`) a seat is its handle: each seat
/// that names no `chat` id of its own claims its handle there, so its own
/// message is known as its own (a seat never wakes itself) and a person
/// who claims a seat's handle on the chat is refused naming both.
pub(crate) fn claim_chat_handle(
    handle: &crate::Handle,
    claimant: &Claimant,
    identities: &Identities,
    registry: &mut Registry,
) {
    if !identities.contains_key(CHAT_SURFACE) {
        // Held already only by a seat that named this handle as its chat
        // id: that seat's word stands.
        let _ = registry.claim(CHAT_SURFACE, handle.as_str(), claimant);
    }
}

/// The company chat's surface: its webhook source and identities' key.
pub const CHAT_SURFACE: &str = "chat";

/// Validates `[people]`, claiming their ids after the seats'.
pub(crate) fn people(
    raw: BTreeMap<String, RawPerson>,
    registry: &mut Registry,
    errors: &mut Errors,
) -> BTreeMap<String, Person> {
    let mut out = BTreeMap::new();
    for (key, p) in raw {
        let path = format!("people.{key}");
        errors.check(path.clone(), token(&key));
        errors.check(format!("{path}.name"), non_empty(&p.name, "a display name"));
        let claimant = Claimant::Person { key: key.clone() };
        let identities = validate(&path, p.identities, &claimant, registry, errors);
        out.insert(
            key.clone(),
            Person {
                key,
                name: p.name,
                identities,
            },
        );
    }
    out
}
