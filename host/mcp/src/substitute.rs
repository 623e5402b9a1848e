//! `${NAME}` references in a server's launch values, resolved at spawn.
//!
//! Forms: `${NAME}` (NAME of letters, digits and `_`; must resolve) and `$$`
//! for a literal `$`; any other `$` is kept as it is. The same forms as the
//! node configuration's, read by the same scanner ([`crewlet_config::scan`]);
//! no `:-fallback` here, since a credential that is missing must say so.
//! Every value that was substituted is remembered in a [`Redactor`], with its
//! hex and base64 forms ([`crewlet_secrets::forms`]), so that
//! failure reasons can be scrubbed of it before they are recorded.

use crewlet_config::scan::{Segment, Unclosed, is_name, segments};

use crewlet_secrets::Lookup;

use crate::Resolver;

/// A `${…}` that could not be substituted. Never carries a secret value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubstituteError {
    #[error(
        "`${{{name}}}` in {field} resolves to nothing; give the seat (or the company) a credential named `{name}`"
    )]
    Unresolved { name: String, field: String },
    /// Set, but this node cannot open it (its keyring lacks the key, or the
    /// envelope is corrupt); `why` names the secret, never its value.
    #[error("`${{{name}}}` in {field} cannot be used on this node: {why}")]
    Unavailable {
        name: String,
        field: String,
        why: String,
    },
    /// Not known yet (the secrets store has not answered this node): the
    /// server waits for it; it is never started without it.
    #[error("`${{{name}}}` in {field} is not known yet: {why}")]
    Unknown {
        name: String,
        field: String,
        why: String,
    },
    #[error("{field}: `${{` without a closing `}}`; write `$$` for a literal `$`")]
    Unclosed { field: String },
    #[error(
        "{field}: `${{{inner}}}` is not a reference (names are letters, digits and `_`); write `$$` for a literal `$`"
    )]
    BadName { field: String, inner: String },
}

/// Replaces every `${NAME}` in `template` through `resolve`. `field` names
/// where the template came from (for the error).
pub fn substitute(
    template: &str,
    field: &str,
    resolve: &Resolver,
) -> Result<String, SubstituteError> {
    substitute_into(template, field, resolve, &mut Redactor::default())
}

pub(crate) fn substitute_into(
    template: &str,
    field: &str,
    resolve: &Resolver,
    redactor: &mut Redactor,
) -> Result<String, SubstituteError> {
    let mut out = String::with_capacity(template.len());
    for segment in segments(template) {
        let name = match segment {
            Ok(Segment::Text(text)) => {
                out.push_str(text);
                continue;
            }
            Ok(Segment::Reference(name)) => name,
            Err(Unclosed) => {
                return Err(SubstituteError::Unclosed {
                    field: field.to_owned(),
                });
            }
        };
        if !is_name(name) {
            return Err(SubstituteError::BadName {
                field: field.to_owned(),
                inner: name.to_owned(),
            });
        }
        let value = match resolve.lookup(name) {
            Lookup::Found(value) => value,
            Lookup::Unset => {
                return Err(SubstituteError::Unresolved {
                    name: name.to_owned(),
                    field: field.to_owned(),
                });
            }
            Lookup::Unavailable(why) => {
                return Err(SubstituteError::Unavailable {
                    name: name.to_owned(),
                    field: field.to_owned(),
                    why,
                });
            }
            Lookup::Unknown(why) => {
                return Err(SubstituteError::Unknown {
                    name: name.to_owned(),
                    field: field.to_owned(),
                    why,
                });
            }
        };
        out.push_str(&value);
        redactor.remember(value);
    }
    Ok(out)
}

/// The secret values a launch used; [`Redactor::scrub`] removes them from text.
#[derive(Debug, Clone, Default)]
pub(crate) struct Redactor {
    secrets: Vec<String>,
}

impl Redactor {
    /// Learns `value` in every form it may be repeated in (raw, hex,
    /// base64): a child that prints its credential encoded leaks it too.
    fn remember(&mut self, value: String) {
        // Very short values would scrub ordinary words; they are no secret.
        if value.len() < 4 {
            return;
        }
        for form in crewlet_secrets::forms::forms(value.as_bytes()) {
            if !self.secrets.contains(&form) {
                self.secrets.push(form);
            }
        }
        self.secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }

    pub(crate) fn scrub(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for secret in &self.secrets {
            if out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), "[redacted]");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolver() -> Resolver {
        Resolver::new(|name: &str| match name {
            "TOKEN" => Lookup::Found("s3cret-token".to_owned()),
            "EMPTY" => Lookup::Found(String::new()),
            "SEALED" => Lookup::Unavailable(
                "secret SEALED is sealed with key k1, which this node's keyring lacks".into(),
            ),
            _ => Lookup::Unset,
        })
    }

    #[test]
    fn a_secret_this_node_cannot_open_is_unavailable_not_empty() {
        let err = substitute("x${SEALED}", "env.TOKEN", &resolver()).unwrap_err();
        assert!(
            matches!(err, SubstituteError::Unavailable { ref name, .. } if name == "SEALED"),
            "{err}"
        );
        assert!(err.to_string().contains("keyring lacks"), "{err}");
    }

    #[test]
    fn references_resolve_and_dollars_escape() {
        let r = resolver();
        assert_eq!(
            substitute("Bearer ${TOKEN}", "h", &r).unwrap(),
            "Bearer s3cret-token"
        );
        assert_eq!(substitute("$$5 and $x", "h", &r).unwrap(), "$5 and $x");
        assert_eq!(substitute("a${EMPTY}b", "h", &r).unwrap(), "ab");
        assert_eq!(substitute("plain", "h", &r).unwrap(), "plain");
    }

    #[test]
    fn unresolved_and_malformed_references_name_the_problem() {
        let r = resolver();
        let err = substitute("${MISSING}", "env.GITHUB_TOKEN", &r).unwrap_err();
        assert_eq!(
            err,
            SubstituteError::Unresolved {
                name: "MISSING".into(),
                field: "env.GITHUB_TOKEN".into()
            }
        );
        assert!(err.to_string().contains("MISSING"));
        assert!(err.to_string().contains("env.GITHUB_TOKEN"));
        assert!(matches!(
            substitute("${TOKEN", "args[0]", &r),
            Err(SubstituteError::Unclosed { .. })
        ));
        assert!(matches!(
            substitute("${A-B}", "args[0]", &r),
            Err(SubstituteError::BadName { .. })
        ));
        assert!(matches!(
            substitute("${}", "args[0]", &r),
            Err(SubstituteError::BadName { .. })
        ));
    }

    #[test]
    fn the_redactor_scrubs_every_value_it_substituted() {
        let r = resolver();
        let mut red = Redactor::default();
        substitute_into("${TOKEN}", "f", &r, &mut red).unwrap();
        assert_eq!(
            red.scrub("child said: bad token s3cret-token!"),
            "child said: bad token [redacted]!"
        );
        // "s3cret-token" in base64 and hex, as a child might dump it.
        assert_eq!(
            red.scrub("b64 czNjcmV0LXRva2Vu hex 733363726574"),
            "b64 [redacted] hex 733363726574"
        );
        assert_eq!(
            red.scrub("hex 733363726574 2d746f6b656e"),
            "hex 733363726574 2d746f6b656e"
        );
        assert_eq!(
            red.scrub("733363726574 2d746f6b656e".replace(' ', "").as_str()),
            "[redacted]"
        );
    }
}
