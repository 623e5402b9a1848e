//! What a plugin says, made safe to repeat.
//!
//! A plugin's error text, its reply body and what it wrote to stderr go to
//! an unauthenticated sender and to the log. A hostile (or careless) plugin
//! could echo a secret the host handed it, so everything it says passes
//! through a [`Scrub`] built from that call's secrets: each value, and its
//! hex and base64 forms, is replaced by `[redacted]`, and the text is cut
//! to a bound.

/// The longest plugin text the host repeats.
pub const MAX_PLUGIN_TEXT: usize = 240;
/// Secrets shorter than this are not searched for: a 1–3 byte needle would
/// redact ordinary words.
const MIN_NEEDLE: usize = 4;
const REDACTED: &str = "[redacted]";

/// The secret forms one call must never leak.
#[derive(Debug, Clone, Default)]
pub struct Scrub {
    needles: Vec<String>,
}

impl Scrub {
    /// Nothing to remove.
    pub fn none() -> Scrub {
        Scrub::default()
    }

    /// The forms of every value in `secrets`.
    pub fn of<'a>(secrets: impl IntoIterator<Item = &'a [u8]>) -> Scrub {
        let mut needles = Vec::new();
        for value in secrets {
            if value.len() < MIN_NEEDLE {
                continue;
            }
            needles.extend(crewlet_secrets::forms(value));
        }
        // Longest first, so a form is not half-replaced by a shorter one.
        needles.sort_by_key(|n| std::cmp::Reverse(n.len()));
        needles.dedup();
        Scrub { needles }
    }

    /// `text` with every secret form removed, cut to [`MAX_PLUGIN_TEXT`].
    pub fn text(&self, text: &str) -> String {
        bound(&self.replace(text), MAX_PLUGIN_TEXT)
    }

    /// `text` with every secret form removed, not cut.
    pub fn replace(&self, text: &str) -> String {
        let mut out = text.to_string();
        for n in &self.needles {
            if out.contains(n.as_str()) {
                out = out.replace(n.as_str(), REDACTED);
            }
        }
        out
    }

    /// A reply body: scrubbed when it is text; refused (`None`) when it is
    /// not text and contains a raw secret, since bytes cannot be redacted
    /// in place without changing their meaning.
    pub fn body(&self, body: Vec<u8>) -> Option<Vec<u8>> {
        match String::from_utf8(body) {
            Ok(text) => Some(self.replace(&text).into_bytes()),
            Err(e) => {
                let bytes = e.into_bytes();
                let leaks = self
                    .needles
                    .iter()
                    .any(|n| bytes.windows(n.len().max(1)).any(|w| w == n.as_bytes()));
                (!leaks).then_some(bytes)
            }
        }
    }
}

/// `text` cut at a character boundary to at most `max` bytes, marked when cut.
pub fn bound(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut cut = max.saturating_sub(3);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &text[..cut])
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;

    use super::*;

    #[test]
    fn every_form_of_a_secret_is_removed() {
        let secret = b"s3cr3t-value\x01";
        let s = Scrub::of([secret.as_slice(), b"ab".as_slice()]);
        let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        let b64 = base64::engine::general_purpose::STANDARD.encode(secret);
        let said = format!(
            "raw={} hex={hex} HEX={} b64={b64} ab",
            String::from_utf8_lossy(secret),
            hex.to_uppercase()
        );
        let out = s.replace(&said);
        assert!(!out.contains(&hex) && !out.contains(&b64), "{out}");
        assert!(!out.contains(&hex.to_uppercase()), "{out}");
        assert!(out.ends_with(" ab"), "short values are not needles: {out}");
        let utf8 = Scrub::of([b"hunter2-password".as_slice()]);
        assert_eq!(utf8.text("leaked hunter2-password!"), "leaked [redacted]!");
    }

    #[test]
    fn text_is_bounded_at_a_char_boundary() {
        let long = "é".repeat(500);
        let out = Scrub::none().text(&long);
        assert!(out.len() <= MAX_PLUGIN_TEXT, "{}", out.len());
        assert!(out.ends_with("..."));
    }

    #[test]
    fn a_binary_body_with_a_raw_secret_is_refused() {
        let s = Scrub::of([b"k3y-material".as_slice()]);
        let mut body = vec![0xff, 0xfe];
        body.extend_from_slice(b"k3y-material");
        assert_eq!(s.body(body), None);
        assert_eq!(s.body(vec![0xff, 1, 2]), Some(vec![0xff, 1, 2]));
        assert_eq!(
            s.body(b"{\"k\":\"k3y-material\"}".to_vec()).unwrap(),
            b"{\"k\":\"[redacted]\"}".to_vec()
        );
    }
}
