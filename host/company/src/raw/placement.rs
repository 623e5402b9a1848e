//! `[placement.groups.NAME]`: placement groups pinned to node labels.
//!
//! A declared group names the node labels its seats need (`labels = {
//! accel = "gpu" }`): a seat with `group = "gpu"` runs only on a node whose
//! `[node] labels` hold every pair. A group a seat names without declaring
//! it stays free-form: its own share of the fleet, on any seat node. A pin
//! with no label would pin nothing, so it is refused rather than read as
//! "anywhere".

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::PlacementGroup;
use crate::raw::{Errors, token};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPlacement {
    #[serde(default)]
    groups: BTreeMap<String, RawGroup>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGroup {
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

/// The declared groups, each pinned to at least one label.
pub fn validate(raw: RawPlacement, errors: &mut Errors) -> BTreeMap<String, PlacementGroup> {
    let mut out = BTreeMap::new();
    for (name, g) in raw.groups {
        let path = format!("placement.groups.{name}");
        errors.check(path.clone(), token(&name));
        if g.labels.is_empty() {
            errors.add(
                format!("{path}.labels"),
                "expected at least one node label the group's seats need (e.g. `labels = { accel = \"gpu\" }`); leave the group out of `[placement.groups]` to run its seats on any seat node",
            );
        }
        for key in g.labels.keys() {
            if key.trim().is_empty() {
                errors.add(
                    format!("{path}.labels"),
                    "a label key is empty: name the `[node] labels` key a node must carry",
                );
            }
        }
        out.insert(
            name.clone(),
            PlacementGroup {
                name,
                labels: g.labels,
            },
        );
    }
    out
}
