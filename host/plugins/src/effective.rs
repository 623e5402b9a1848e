//! Each permission an operator's grant can change, with where it came
//! from: what `crewlet plugins list --effective` prints and `GET /plugins`
//! answers (`effective`), from one list, so the two never disagree.
//!
//! Rule: a row is `manifest`, `operator_added` or `operator_denied`, and
//! an operator's row names its key and file. A denied row is not held.
//! Kinds an operator cannot change (secrets, owned buckets, limits) are
//! the manifest's alone and listed by `plugins list` without `--effective`.

use serde::{Deserialize, Serialize};

use crate::manifest::{Manifest, Origin, Permission, Permissions};

/// Where a permission came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provenance {
    Manifest,
    OperatorAdded,
    OperatorDenied,
}

/// One permission of one plugin, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// `base_url`, `outbound`, `route`, `body_limit` or `read`.
    pub permission: String,
    pub value: String,
    pub from: Provenance,
    /// The operator's key (`plugins.grants.openai.denied_outbound_hosts[0]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The file the key is in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

impl Held {
    fn of(m: &Manifest, permission: Permission) -> Held {
        let granted = &m.granted;
        let (from, key) = match (
            granted.denied_by(&permission),
            granted.added_by(&permission),
        ) {
            (Some(key), _) => (Provenance::OperatorDenied, Some(key.to_string())),
            (None, Some(key)) => (Provenance::OperatorAdded, Some(key.to_string())),
            (None, None) => (Provenance::Manifest, None),
        };
        Held {
            permission: permission.kind().to_string(),
            value: permission.value(),
            from,
            file: key.as_ref().map(|_| granted.source.clone()),
            key,
        }
    }

    /// How `GET /plugins`' `permissions` lines mark it: nothing for the
    /// manifest's, else ` (operator grant in FILE)` or ` (denied by the
    /// operator: `KEY` in FILE)`.
    pub fn marked(&self) -> String {
        let file = self.file.as_deref().unwrap_or("-");
        match self.from {
            Provenance::Manifest => String::new(),
            Provenance::OperatorAdded => format!(" (operator grant in {file})"),
            Provenance::OperatorDenied => format!(
                " (denied by the operator: `{}` in {file})",
                self.key.as_deref().unwrap_or("-")
            ),
        }
    }
}

/// Every permission of `m` an operator's grant can change, held or
/// denied, with where each came from: the base URL (denied when the
/// operator denies its origin) and origins of a provider, the routes and
/// body limit of a webhook, the reads of a module.
pub fn rows(m: &Manifest) -> Vec<Held> {
    pairs(m).into_iter().map(|(_, held)| held).collect()
}

/// [`rows`] as `GET /plugins`' `permissions` lines (`outbound X (operator
/// grant in FILE)`), each with its kind (`outbound`).
pub fn lines(m: &Manifest) -> Vec<(&'static str, String)> {
    let pairs = pairs(m).into_iter();
    pairs
        .map(|(p, held)| (p.kind(), format!("{p}{}", held.marked())))
        .collect()
}

fn pairs(m: &Manifest) -> Vec<(Permission, Held)> {
    let row = |p: Permission| (p.clone(), Held::of(m, p));
    let mut out = Vec::new();
    match &m.permissions {
        Permissions::Provider {
            base_url,
            allowed_outbound_hosts,
            ..
        } => {
            let (base, mut held) = row(Permission::BaseUrl(base_url.clone()));
            let origin = Origin::parse(base_url).map(Permission::Outbound);
            if let Some(key) = origin.ok().and_then(|o| m.granted.denied_by(&o)) {
                held.from = Provenance::OperatorDenied;
                held.key = Some(key.to_string());
                held.file = Some(m.granted.source.clone());
            }
            out.push((base, held));
            let hosts = allowed_outbound_hosts.iter().cloned();
            out.extend(hosts.map(|o| row(Permission::Outbound(o))));
        }
        Permissions::Webhook { routes, .. } => {
            out.extend(routes.iter().map(|r| row(Permission::Route(r.clone()))));
            out.push(row(Permission::BodyLimit(m.limits.max_body_bytes)));
        }
        Permissions::Module { reads, .. } => {
            out.extend(reads.iter().map(|r| row(Permission::Read(r.clone()))));
        }
    }
    let denied = m.granted.denied.iter().map(|d| d.permission.clone());
    out.extend(denied.map(row));
    out
}

/// One plugin's rows, as `GET /plugins` carries them.
#[derive(Debug, Clone, Deserialize)]
pub struct PluginRows {
    pub name: String,
    pub version: String,
    pub kind: String,
    #[serde(default)]
    pub effective: Vec<Held>,
}

impl PluginRows {
    /// `m`'s rows.
    pub fn of(m: &Manifest) -> PluginRows {
        PluginRows {
            name: m.name.clone(),
            version: m.version.clone(),
            kind: m.kind.world().to_string(),
            effective: rows(m),
        }
    }
}

/// What `crewlet plugins list --effective` prints: per plugin, one line
/// per permission and where it came from.
pub fn render(plugins: &[PluginRows]) -> String {
    let mut out = String::new();
    for p in plugins {
        out.push_str(&format!("{} {} ({})\n", p.name, p.version, p.kind));
        if p.effective.is_empty() {
            out.push_str("  nothing an operator's grant changes\n");
        }
        for row in &p.effective {
            let from = match row.from {
                Provenance::Manifest => "manifest".to_string(),
                Provenance::OperatorAdded => "operator added".to_string(),
                Provenance::OperatorDenied => "operator denied".to_string(),
            };
            let by = match (&row.key, &row.file) {
                (Some(key), Some(file)) => format!(" (`{key}` in {file})"),
                _ => String::new(),
            };
            let what = format!("{} {}", row.permission, row.value);
            out.push_str(&format!("  {what:<52} {from}{by}\n"));
        }
    }
    out
}
