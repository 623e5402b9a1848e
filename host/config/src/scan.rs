//! The one reader of `${NAME}` references, shared by every place that takes
//! them (the node configuration, an MCP server's launch values).
//!
//! The rule: `$$` is a literal `$`, `${…}` is a reference, and any other `$`
//! is kept as it is, so an operator learns one syntax. The scanner only
//! splits a template; what a reference may contain (a `:-fallback`, say) and
//! what an unresolvable one means are each caller's, because their errors
//! must name their own file, key or field.

/// A part of a template, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment<'a> {
    /// Text to keep as it is (`$$` comes out as `$`).
    Text(&'a str),
    /// What stood between `${` and `}`, unchecked.
    Reference(&'a str),
}

/// A `${` the template never closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("`${{` without a closing `}}`; close the reference, or write `$$` for a literal `$`")]
pub struct Unclosed;

/// The segments of `template`; an unclosed `${` ends them with [`Unclosed`].
pub fn segments(template: &str) -> Segments<'_> {
    Segments { rest: template }
}

/// Whether `name` is a variable name: letters, digits and `_`, at least one.
pub fn is_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The iterator [`segments`] answers.
#[derive(Debug, Clone)]
pub struct Segments<'a> {
    rest: &'a str,
}

impl<'a> Iterator for Segments<'a> {
    type Item = Result<Segment<'a>, Unclosed>;

    fn next(&mut self) -> Option<Self::Item> {
        let rest = self.rest;
        if rest.is_empty() {
            return None;
        }
        let at = rest.find('$').unwrap_or(rest.len());
        if at > 0 {
            self.rest = &rest[at..];
            return Some(Ok(Segment::Text(&rest[..at])));
        }
        let after = &rest[1..];
        if let Some(tail) = after.strip_prefix('$') {
            self.rest = tail;
            return Some(Ok(Segment::Text(&rest[..1])));
        }
        let Some(body) = after.strip_prefix('{') else {
            self.rest = after;
            return Some(Ok(Segment::Text(&rest[..1])));
        };
        match body.find('}') {
            Some(end) => {
                self.rest = &body[end + 1..];
                Some(Ok(Segment::Reference(&body[..end])))
            }
            None => {
                self.rest = "";
                Some(Err(Unclosed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(template: &str) -> Vec<Result<Segment<'_>, Unclosed>> {
        segments(template).collect()
    }

    #[test]
    fn splits_text_references_and_escapes() {
        use Segment::{Reference, Text};
        assert_eq!(
            all("a ${X} $$ $5 ${Y:-z}"),
            vec![
                Ok(Text("a ")),
                Ok(Reference("X")),
                Ok(Text(" ")),
                Ok(Text("$")),
                Ok(Text(" ")),
                Ok(Text("$")),
                Ok(Text("5 ")),
                Ok(Reference("Y:-z")),
            ]
        );
        assert_eq!(all(""), vec![]);
        assert_eq!(all("$"), vec![Ok(Text("$"))]);
        assert_eq!(all("${}"), vec![Ok(Reference(""))]);
    }

    #[test]
    fn an_unclosed_reference_ends_the_scan() {
        assert_eq!(all("a${X"), vec![Ok(Segment::Text("a")), Err(Unclosed)]);
    }

    #[test]
    fn names_are_letters_digits_and_underscores() {
        assert!(is_name("GITHUB_TOKEN_2"));
        assert!(!is_name(""));
        assert!(!is_name("A-B"));
        assert!(!is_name("A:-b"));
    }
}
