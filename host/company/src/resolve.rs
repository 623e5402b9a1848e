//! Which seats a delivery is for: the ids it addresses, mapped to seats
//! through the company's registry of identities. Here, beside the registry,
//! rather than in the notification service: what an id names is the
//! document's to say, and the service only carries the answer out.
//!
//! Rules, and why:
//! - **The registry first, then the handle.** An id a seat or person
//!   claims on the delivery's source (`slack`: `U04ABCDEF`) names that
//!   claimant (a leading `@` aside: no id holds one); any other id that
//!   is a seat's handle (leading `@` stripped, case folded) names that
//!   seat, as before identities existed. A route's handle is always a
//!   handle.
//! - **Derived from the document alone**, built once per parsed company
//!   ([`crate::Registry`]): every node serving a revision gives
//!   the same answer, with no lookup and no state, in a few hash probes
//!   per id.
//! - **A person is not woken.** An id a person claims addresses nobody
//!   here; an unrouted delivery says who it did address.

use serde::Serialize;

use crate::{Claimant, Company, Handle};

/// The ids a delivery addresses, by why: as the delivery gave them.
#[derive(Debug, Clone, Copy)]
pub struct Addressed<'a> {
    /// The delivery's source (`slack`, `github`, …): the surface its ids
    /// are on.
    pub source: &'a str,
    /// The handle its route named (`/webhooks/SOURCE/HANDLE`).
    pub route_handle: Option<&'a str>,
    pub mentions: &'a [String],
    pub assignees: &'a [String],
    pub reviewers: &'a [String],
}

/// What a delivery's ids came to.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Resolution {
    /// The seats it wakes, each with why; first reason wins.
    pub seats: Vec<(Handle, &'static str)>,
    /// Ids no seat claims and no handle matches, as the delivery gave them.
    pub unclaimed: Vec<String>,
    /// People it addressed (their keys): known, but not seats.
    pub people: Vec<String>,
}

/// Everything a delivery's ids came to (see the module docs).
pub fn resolve(company: &Company, to: &Addressed<'_>) -> Resolution {
    let mut out = Resolution::default();
    let candidates = to
        .route_handle
        .into_iter()
        .map(|h| (h, "route"))
        .chain(to.mentions.iter().map(|h| (h.as_str(), "mention")))
        .chain(to.assignees.iter().map(|h| (h.as_str(), "assignee")))
        .chain(to.reviewers.iter().map(|h| (h.as_str(), "reviewer")));
    for (raw, why) in candidates {
        let claimed = (why != "route")
            .then(|| company.claimant(to.source, raw.trim().trim_start_matches('@')))
            .flatten();
        let seat = match claimed {
            Some(Claimant::Seat { handle }) => Some(handle.clone()),
            Some(Claimant::Person { key }) => {
                if !out.people.contains(key) {
                    out.people.push(key.clone());
                }
                continue;
            }
            None => by_handle(company, raw),
        };
        match seat {
            Some(h) if !out.seats.iter().any(|(o, _)| o == &h) => out.seats.push((h, why)),
            Some(_) => {}
            None if !out.unclaimed.iter().any(|u| u == raw) => out.unclaimed.push(raw.to_owned()),
            None => {}
        }
    }
    out
}

/// Who wrote a delivery: the claimant of the first of its author's ids
/// (`sender`, as the vendor sent them) that a seat or person claims on
/// `source`.
pub fn sender<'c>(company: &'c Company, source: &str, ids: &[String]) -> Option<&'c Claimant> {
    ids.iter().find_map(|id| company.claimant(source, id))
}

/// Who wrote a delivery, in words a prompt can carry; `None` when the
/// vendor named no author.
pub fn sender_words(company: &Company, source: &str, ids: &[String]) -> Option<String> {
    let first = ids.first()?;
    Some(match sender(company, source, ids) {
        Some(Claimant::Seat { handle }) => format!("seat {handle}, one of this company's agents"),
        Some(Claimant::Person { key }) => match company.people.get(key) {
            Some(p) => format!("{} (person {key})", p.name),
            None => format!("person {key}"),
        },
        None => format!("{source} user {first}, whom no seat or person of the company claims"),
    })
}

/// The seat whose handle `raw` is (leading `@` stripped, case folded):
/// how ids resolved before seats had identities.
pub fn by_handle(company: &Company, raw: &str) -> Option<Handle> {
    let name = raw.trim().trim_start_matches('@').to_ascii_lowercase();
    let h = Handle::parse(&name).ok()?;
    company.seats.contains_key(&h).then_some(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn company() -> Company {
        Company::parse(
            r#"
            [org]
            name = "Acme"
            [roles.eng]
            system_prompt = "x"
            executor = [{ provider = "openai", model = "m" }]
            reviewer = { provider = "openai", model = "m" }
            [seats.ada]
            role = "eng"
            identities = { slack = "U04ABCDEF", github = "acme-ada-bot", jira = "5b10ac8d82e05b22cc7d4ef5" }
            [seats.linus]
            role = "eng"
            [people.grace]
            name = "Grace Hopper"
            identities = { slack = "U07GRACE1" }
            "#,
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn addressed(
        c: &Company,
        source: &str,
        route: Option<&str>,
        mentions: &[&str],
        assignees: &[&str],
    ) -> Resolution {
        let owned = |ids: &[&str]| ids.iter().map(|m| (*m).to_owned()).collect::<Vec<_>>();
        let (mentions, assignees) = (owned(mentions), owned(assignees));
        resolve(
            c,
            &Addressed {
                source,
                route_handle: route,
                mentions: &mentions,
                assignees: &assignees,
                reviewers: &[],
            },
        )
    }

    fn seats(r: &Resolution) -> Vec<(&str, &str)> {
        r.seats.iter().map(|(h, w)| (h.as_str(), *w)).collect()
    }

    #[test]
    fn claimed_ids_name_their_seat_on_their_own_surface_only() {
        let c = company();
        let slack = addressed(
            &c,
            "slack",
            None,
            &["U04ABCDEF", "U07GRACE1", "U0NOBODY"],
            &[],
        );
        assert_eq!(seats(&slack), [("ada", "mention")]);
        assert_eq!(slack.people, ["grace"]);
        assert_eq!(slack.unclaimed, ["U0NOBODY"]);
        let github = addressed(&c, "github", None, &["Acme-Ada-Bot", "@acme-ada-bot"], &[]);
        assert_eq!(seats(&github), [("ada", "mention")]);
        let jira = addressed(&c, "jira", None, &[], &["5b10ac8d82e05b22cc7d4ef5"]);
        assert_eq!(seats(&jira), [("ada", "assignee")]);
        // Ada's Slack id means nothing on GitHub.
        let elsewhere = addressed(&c, "github", None, &["U04ABCDEF"], &[]);
        assert!(elsewhere.seats.is_empty());
        assert_eq!(elsewhere.unclaimed, ["U04ABCDEF"]);
    }

    #[test]
    fn the_sender_is_named_by_the_first_claimed_id() {
        let c = company();
        let ids = |ids: &[&str]| ids.iter().map(|i| (*i).to_owned()).collect::<Vec<_>>();
        let ada = sender(&c, "slack", &ids(&["B0BOT", "U04ABCDEF"]));
        assert_eq!(ada.map(Claimant::path).as_deref(), Some("seats.ada"));
        assert_eq!(
            sender_words(&c, "slack", &ids(&["U07GRACE1"])).as_deref(),
            Some("Grace Hopper (person grace)")
        );
        let stranger = sender_words(&c, "slack", &ids(&["U0NOBODY", "B1"])).unwrap();
        assert!(stranger.contains("U0NOBODY") && stranger.contains("no seat or person"));
        assert_eq!(sender_words(&c, "slack", &[]), None);
        assert_eq!(
            sender(&c, "github", &ids(&["U04ABCDEF"])),
            None,
            "per surface"
        );
    }

    #[test]
    fn handles_resolve_as_before_and_each_seat_is_woken_once() {
        let c = company();
        let r = addressed(
            &c,
            "slack",
            Some("linus"),
            &["@Ada", "U04ABCDEF", "linus"],
            &["ada"],
        );
        assert_eq!(seats(&r), [("linus", "route"), ("ada", "mention")]);
        assert!(r.unclaimed.is_empty() && r.people.is_empty());
        let nobody = addressed(&c, "github", None, &["@nobody", "a b"], &[]);
        assert!(nobody.seats.is_empty());
        assert_eq!(nobody.unclaimed, ["@nobody", "a b"]);
    }
}
