//! Who is who on each surface: the ids a seat or a person has on Slack,
//! GitHub, Jira, … (`[seats.X] identities`, `[people.X]`), and the
//! registry that maps an addressed id back to its claimant.
//!
//! Rules, and why:
//! - **An id is written as the vendor sends it** once its mention syntax is
//!   taken off (`U04ABCDEF`, not `<@U04ABCDEF>`; `acme-ada-bot`, not
//!   `@acme-ada-bot`), because the webhook plugins report ids that way.
//! - **One claimant per id and surface.** An id claimed twice (two seats, a
//!   seat and a person, two people) is refused naming both: a mention
//!   would otherwise wake whichever the registry happened to keep.
//! - **GitHub and GitLab logins are case-insensitive** there, so they are
//!   compared folded; every other surface's ids compare exactly (a Slack
//!   `U…` and a Jira account id are opaque).
//! - **The registry is derived from the document alone**, once per parsed
//!   document, so every node serving a revision answers the same, with no
//!   lookup and no state; a lookup is two hash probes.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::Handle;

/// A claimant's ids per surface (`slack`, `github`, …), each as the vendor
/// sends it.
pub type Identities = BTreeMap<String, Vec<String>>;

/// The longest id accepted, in bytes.
const MAX_ID_BYTES: usize = 128;

/// A person the company knows (`[people.KEY]`): not a seat, but someone a
/// turn can name when they talk to one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Person {
    pub key: String,
    /// The name a turn and the roster show.
    pub name: String,
    pub identities: Identities,
}

/// Who claims an identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Claimant {
    Seat { handle: Handle },
    Person { key: String },
}

impl Claimant {
    /// The claimant as the document names it: `seats.ada`, `people.grace`.
    pub fn path(&self) -> String {
        match self {
            Claimant::Seat { handle } => format!("seats.{handle}"),
            Claimant::Person { key } => format!("people.{key}"),
        }
    }
}

/// Surface → id (folded where the surface folds) → claimant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registry {
    by_surface: HashMap<String, HashMap<String, Claimant>>,
}

impl Registry {
    /// Who claims `id` on `surface`, if anyone.
    pub fn claimant(&self, surface: &str, id: &str) -> Option<&Claimant> {
        self.by_surface
            .get(surface)?
            .get(fold(surface, id).as_ref())
    }

    /// How many ids are claimed, over every surface.
    pub fn len(&self) -> usize {
        self.by_surface.values().map(HashMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records `id` for `claimant`; the claimant that holds it already,
    /// when another does.
    pub(crate) fn claim(
        &mut self,
        surface: &str,
        id: &str,
        claimant: &Claimant,
    ) -> Option<&Claimant> {
        let ids = self.by_surface.entry(surface.to_owned()).or_default();
        let key = fold(surface, id).into_owned();
        if ids.contains_key(&key) {
            return ids.get(&key).filter(|held| *held != claimant);
        }
        ids.insert(key, claimant.clone());
        None
    }
}

/// The form an id is compared in on `surface`.
fn fold<'a>(surface: &str, id: &'a str) -> Cow<'a, str> {
    let folds = matches!(surface, "github" | "gitlab");
    if folds && id.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(id.to_ascii_lowercase())
    } else {
        Cow::Borrowed(id)
    }
}

/// Checks one id as written in a document.
pub(crate) fn check_id(surface: &str, id: &str) -> Result<(), String> {
    let bare = id
        .trim_start_matches("<@")
        .trim_start_matches("[~accountid:")
        .trim_start_matches('@')
        .trim_end_matches(['>', ']']);
    let bare = bare.split('|').next().unwrap_or_default();
    if id.is_empty() || id.len() > MAX_ID_BYTES {
        return Err(format!(
            "an identity is 1 to {MAX_ID_BYTES} bytes, found {}",
            id.len()
        ));
    }
    if bare != id {
        return Err(format!(
            "write the {surface} id as the vendor sends it without its mention syntax: {bare:?}, not {id:?}"
        ));
    }
    if let Some(c) = id
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || "<>[]|@~".contains(*c))
    {
        return Err(format!(
            "{id:?} is not a {surface} id: it holds {c:?} (an id is one word, as the vendor sends it)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seat(h: &str) -> Claimant {
        Claimant::Seat {
            handle: Handle::parse(h).unwrap(),
        }
    }

    #[test]
    fn logins_fold_and_opaque_ids_do_not() {
        let mut r = Registry::default();
        assert_eq!(r.claim("github", "Acme-Ada-Bot", &seat("ada")), None);
        assert_eq!(r.claim("slack", "U04ABCDEF", &seat("ada")), None);
        assert_eq!(r.claimant("github", "acme-ada-bot"), Some(&seat("ada")));
        assert_eq!(r.claimant("github", "ACME-ADA-BOT"), Some(&seat("ada")));
        assert_eq!(r.claimant("slack", "U04ABCDEF"), Some(&seat("ada")));
        assert_eq!(r.claimant("slack", "u04abcdef"), None);
        assert_eq!(r.claimant("gitlab", "acme-ada-bot"), None, "per surface");
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn a_second_claimant_is_named_and_the_first_keeps_the_id() {
        let mut r = Registry::default();
        r.claim("slack", "U1", &seat("ada"));
        assert_eq!(r.claim("slack", "U1", &seat("ada")), None, "same claimant");
        assert_eq!(r.claim("slack", "U1", &seat("linus")), Some(&seat("ada")));
        assert_eq!(r.claimant("slack", "U1"), Some(&seat("ada")));
    }

    #[test]
    fn ids_in_mention_syntax_or_with_spaces_are_refused_with_the_bare_form() {
        assert!(check_id("slack", "U04ABCDEF").is_ok());
        assert!(check_id("jira", "557058:f58131cb-b67d-43c7-b30d-6b58d40bd077").is_ok());
        let e = check_id("slack", "<@U04ABCDEF>").unwrap_err();
        assert!(e.contains("\"U04ABCDEF\""), "{e}");
        let e = check_id("github", "@acme-ada-bot").unwrap_err();
        assert!(e.contains("\"acme-ada-bot\""), "{e}");
        let e = check_id("jira", "[~accountid:5b10]").unwrap_err();
        assert!(e.contains("\"5b10\""), "{e}");
        assert!(check_id("slack", "").is_err());
        assert!(check_id("slack", "U1 U2").is_err());
        assert!(check_id("slack", &"U".repeat(129)).is_err());
    }
}
