//! Small accessors over `serde_json::Value` for optional nested fields.

use serde_json::Value;

/// The value at a path of object keys, if every step exists.
pub fn at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a Value> {
    let mut current = value;
    for key in path {
        current = current.get(key)?;
    }
    Some(current)
}

/// The string at a path; numbers are rendered as their decimal text.
pub fn string_at(value: &Value, path: &[&str]) -> Option<String> {
    match at(value, path)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The first non-empty string among several paths.
pub fn first_string(value: &Value, paths: &[&[&str]]) -> Option<String> {
    paths
        .iter()
        .filter_map(|p| string_at(value, p))
        .find(|s| !s.is_empty())
}

/// `field` of every object in the array at `path` (e.g. every assignee's
/// `login`), skipping entries without it.
pub fn names_in(value: &Value, path: &[&str], field: &str) -> Vec<String> {
    match at(value, path) {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|item| item.get(field).and_then(Value::as_str))
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    }
}

/// Appends `more` to `list`, keeping order and dropping duplicates.
pub fn extend_unique(list: &mut Vec<String>, more: impl IntoIterator<Item = String>) {
    for name in more {
        if !list.contains(&name) {
            list.push(name);
        }
    }
}
