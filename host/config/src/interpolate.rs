//! `${VAR}` interpolation over the string values of a parsed TOML document.
//!
//! Interpolation runs on values, never on the raw text: a variable holding a
//! quote or a newline cannot change the shape of the document. Forms:
//! `${VAR}` (must be set), `${VAR:-fallback}` (fallback when unset or empty),
//! and `$$` for a literal `$`. The references are read by [`crate::scan`];
//! the fallback and the errors, which name file and key, are this module's.

use toml::Value;

use crate::scan::{Segment, Unclosed, is_name, segments};

/// Why a string could not be interpolated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InterpolateError {
    /// `${VAR}` names a variable that is not set.
    Unset { var: String },
    /// A `${` with no closing brace, or an empty or malformed name.
    Malformed { detail: String },
}

/// Replaces every reference in `input` using `lookup`.
pub fn interpolate_str(
    input: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String, InterpolateError> {
    let mut out = String::with_capacity(input.len());
    for segment in segments(input) {
        let expr = match segment {
            Ok(Segment::Text(text)) => {
                out.push_str(text);
                continue;
            }
            Ok(Segment::Reference(expr)) => expr,
            Err(Unclosed) => {
                return Err(InterpolateError::Malformed {
                    detail: format!("`${{` without a closing `}}` in {input:?}"),
                });
            }
        };
        let (name, fallback) = match expr.split_once(":-") {
            Some((name, fallback)) => (name, Some(fallback)),
            None => (expr, None),
        };
        if !is_name(name) {
            return Err(InterpolateError::Malformed {
                detail: format!(
                    "`${{{expr}}}` is not a variable reference (names are letters, digits and `_`)"
                ),
            });
        }
        match (lookup(name), fallback) {
            (Some(v), Some(fb)) if v.is_empty() => out.push_str(fb),
            (Some(v), _) => out.push_str(&v),
            (None, Some(fb)) => out.push_str(fb),
            (None, None) => {
                return Err(InterpolateError::Unset {
                    var: name.to_owned(),
                });
            }
        }
    }
    Ok(out)
}

/// Interpolates every string in `value` in place. On failure answers the
/// dotted key path of the offending value with the reason.
pub fn interpolate_tree(
    value: &mut Value,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(), (String, InterpolateError)> {
    walk(value, &mut String::new(), lookup)
}

fn walk(
    value: &mut Value,
    path: &mut String,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(), (String, InterpolateError)> {
    match value {
        Value::String(s) => {
            *s = interpolate_str(s, lookup).map_err(|e| (path.clone(), e))?;
        }
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                walk(item, path, lookup)?;
                path.truncate(len);
            }
        }
        Value::Table(table) => {
            for (key, item) in table.iter_mut() {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
                walk(item, path, lookup)?;
                path.truncate(len);
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "HOST" => Some("nats.internal".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn replaces_references_and_keeps_plain_dollars() {
        assert_eq!(
            interpolate_str("nats://${HOST}:4222", &env).unwrap(),
            "nats://nats.internal:4222"
        );
        assert_eq!(
            interpolate_str("cost $5 and $$x", &env).unwrap(),
            "cost $5 and $x"
        );
        assert_eq!(interpolate_str("${MISSING:-dflt}", &env).unwrap(), "dflt");
        assert_eq!(interpolate_str("${EMPTY:-dflt}", &env).unwrap(), "dflt");
    }

    #[test]
    fn unset_and_malformed_are_errors() {
        assert_eq!(
            interpolate_str("${NOPE}", &env),
            Err(InterpolateError::Unset { var: "NOPE".into() })
        );
        assert!(matches!(
            interpolate_str("${HOST", &env),
            Err(InterpolateError::Malformed { .. })
        ));
        assert!(matches!(
            interpolate_str("${A-B}", &env),
            Err(InterpolateError::Malformed { .. })
        ));
    }

    #[test]
    fn tree_errors_name_the_key_path() {
        let mut v: Value = toml::from_str("[stream]\nurl = [\"a\", \"${NOPE}\"]\n").unwrap();
        let (path, err) = interpolate_tree(&mut v, &env).unwrap_err();
        assert_eq!(path, "stream.url[1]");
        assert_eq!(err, InterpolateError::Unset { var: "NOPE".into() });
    }
}
