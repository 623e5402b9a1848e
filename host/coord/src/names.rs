//! Resource names and the keys they become.
//!
//! Rule: a resource is `class:id[:more]`; every segment is non-empty and
//! becomes one subject token of its own, so a class (`seat`, `node`,
//! `worker`, ...) is a wildcard that addresses its members and nothing else.
//! Why: an empty segment builds a key no listing can decode, so the lease
//! would be written and then returned by no listing at all — which every
//! node reads as a free seat. And the encoding is injective, so two
//! resources can never share a key.
//!
//! Encoding: bytes in `[A-Za-z0-9-]` stand for themselves; every other byte
//! (including `_`, `.` and non-ASCII) is `_` followed by two upper-case hex
//! digits. The result is a valid NATS KV token and decodes back exactly.

use crate::answer::CoordError;

/// Longest encoded key accepted (well under the broker's subject limits).
pub const MAX_KEY_LEN: usize = 512;

/// A parsed `class:id` resource name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceName {
    raw: String,
}

impl ResourceName {
    /// Parses a name, refusing empty segments and names without a class.
    pub fn parse(name: &str) -> Result<ResourceName, CoordError> {
        let invalid = |why| CoordError::InvalidName {
            name: name.to_owned(),
            why,
        };
        let Some((class, id)) = name.split_once(':') else {
            return Err(invalid("no class: a name is `class:id`"));
        };
        check_class(class).map_err(|_| invalid("the class is empty or not [a-z0-9_-]"))?;
        if id.is_empty() || id.split(':').any(str::is_empty) {
            return Err(invalid("an empty segment addresses no key"));
        }
        let n = ResourceName {
            raw: name.to_owned(),
        };
        if n.key().len() > MAX_KEY_LEN {
            return Err(invalid("the encoded key is too long"));
        }
        Ok(n)
    }

    /// `seat:{handle}`.
    pub fn seat(handle: &str) -> Result<ResourceName, CoordError> {
        ResourceName::parse(&format!("seat:{handle}"))
    }

    /// `node:{id}` — a node's presence lease.
    pub fn node(id: &str) -> Result<ResourceName, CoordError> {
        ResourceName::parse(&format!("node:{id}"))
    }

    /// `worker:{duty}` — a singleton duty.
    pub fn worker(duty: &str) -> Result<ResourceName, CoordError> {
        ResourceName::parse(&format!("worker:{duty}"))
    }

    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// The class: the segment before the first colon.
    pub fn class(&self) -> &str {
        self.raw.split_once(':').map(|(c, _)| c).unwrap_or("")
    }

    /// The id: everything after the first colon.
    pub fn id(&self) -> &str {
        self.raw.split_once(':').map(|(_, i)| i).unwrap_or("")
    }

    /// The KV key: each `:`-separated segment encoded as one token.
    pub fn key(&self) -> String {
        self.raw
            .split(':')
            .map(encode_token)
            .collect::<Vec<_>>()
            .join(".")
    }

    /// The name a key encodes, if it is one this module produced.
    pub fn from_key(key: &str) -> Option<ResourceName> {
        let segs: Option<Vec<String>> = key.split('.').map(decode_token).collect();
        let name = segs?.join(":");
        ResourceName::parse(&name).ok()
    }
}

impl std::fmt::Display for ResourceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.raw)
    }
}

/// Checks that a class can address keys: non-empty, `[a-z0-9_-]`.
/// There is no all-classes listing: the empty class is refused.
pub fn check_class(class: &str) -> Result<(), CoordError> {
    if class.is_empty()
        || !class
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    {
        return Err(CoordError::InvalidName {
            name: class.to_owned(),
            why: "a class must be non-empty [a-z0-9_-]; there is no all-classes listing",
        });
    }
    Ok(())
}

/// Encodes any string as one KV token (injective, reversible).
pub fn encode_token(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' {
            out.push(b as char);
        } else {
            out.push('_');
            out.push_str(&format!("{b:02X}"));
        }
    }
    out
}

/// The first 64 characters of an untrusted name, for an error message: a
/// refused name may be kilobytes long.
pub(crate) fn preview(name: &str) -> String {
    let mut out: String = name.chars().take(64).collect();
    if out.len() < name.len() {
        out.push_str("...");
    }
    out
}

/// Reverses [`encode_token`]; `None` for anything it did not produce.
pub fn decode_token(t: &str) -> Option<String> {
    let bytes = t.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'_' => {
                let hex = t.get(i + 1..i + 3)?;
                if hex.bytes().any(|c| c.is_ascii_lowercase()) {
                    return None;
                }
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b if b.is_ascii_alphanumeric() || b == b'-' => {
                out.push(b);
                i += 1;
            }
            _ => return None,
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_segments_and_classless_names_are_refused() {
        for bad in [
            "seat:",
            ":x",
            "seat",
            "seat:a::b",
            "seat:a:",
            "",
            "Seat:x",
            "se.at:x",
        ] {
            assert!(ResourceName::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn awkward_names_round_trip_and_stay_distinct() {
        let names = [
            "seat:a.b",
            "seat:a_2Eb",
            "seat:a_b",
            "seat:a b",
            "seat:ünï",
            "seat:a/b",
            "seat:a:b",
            "seat:a",
            "seat:A",
            "seat:*",
            "seat:>",
            "seat:a_",
            "worker:x=y",
        ];
        let mut keys = std::collections::HashSet::new();
        for n in names {
            let r = ResourceName::parse(n).unwrap();
            let k = r.key();
            assert!(keys.insert(k.clone()), "{n} collides at {k}");
            assert_eq!(ResourceName::from_key(&k).unwrap(), r, "{n} round trip");
            assert!(
                k.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)),
                "{k} has a byte a KV key cannot hold"
            );
        }
    }
}
