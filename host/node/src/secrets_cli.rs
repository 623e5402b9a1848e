//! `crewlet secrets set|list|rm|rotate-key` against a running node — or
//! `set --data-dir` against a stopped one, which seals the value into that
//! node's store (`crewlet_secrets::admin::adopt_pending` moves it onto the
//! fleet at the next start, through [`PendingRows`]). What the routes
//! answer is `crewlet_secrets::admin`'s; this file is the CLI's side and
//! the node store's port.

use std::time::Duration;

use crewlet_secrets::admin::{Pending, PendingStore};
use crewlet_secrets::{Keyring, Record, SecretsError, check_name};

/// The node store's `pending_secrets` table as `crewlet-secrets` reads it.
pub(crate) struct PendingRows<'a>(pub(crate) &'a crewlet_store::Store);

impl PendingStore for PendingRows<'_> {
    type Error = crewlet_store::StoreError;

    fn pending(&self) -> Result<Vec<Pending>, Self::Error> {
        Ok(self
            .0
            .pending_secrets()?
            .into_iter()
            .map(|row| Pending {
                name: row.name,
                record: row.record,
            })
            .collect())
    }

    fn delete(&self, name: &str, record: &str) -> Result<(), Self::Error> {
        self.0.delete_pending_secret(name, record).map(|_| ())
    }
}

/// Why a `crewlet secrets` command did not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum SecretsCliError {
    #[error(transparent)]
    BadName(SecretsError),
    #[error("cannot read the secret's value from stdin: {0}")]
    Stdin(std::io::Error),
    #[error(
        "the value on stdin is empty; pipe the secret in, e.g. `printf %s \"$VALUE\" | crewlet secrets set NAME`"
    )]
    Empty,
    #[error("{0}{hint}", hint = .0.offline_hint())]
    Http(#[from] crate::client::ClientError),
    #[error("the node at {api} answered {status}: {body}")]
    Refused {
        api: String,
        status: u16,
        body: String,
    },
    #[error(transparent)]
    Keyring(#[from] crewlet_secrets::KeyringError),
    #[error(transparent)]
    Sealing(SecretsError),
    #[error("cannot write the secret into the stopped node's store: {0}")]
    Store(#[from] crewlet_store::StoreError),
    #[error("cannot tell whether a node holds {dir}: {source}")]
    Lock {
        dir: String,
        #[source]
        source: crewlet_stream::LockError,
    },
    #[error("--data-dir {0}: not a directory; pass the data dir of the node the secret is for")]
    NoDataDir(String),
}

impl SecretsCliError {
    /// 2 for a request the node (or the CLI) refused as wrong, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            SecretsCliError::BadName(_)
            | SecretsCliError::Empty
            | SecretsCliError::Sealing(_)
            | SecretsCliError::NoDataDir(_)
            | SecretsCliError::Keyring(_) => 2,
            SecretsCliError::Refused { status, .. } if (400..500).contains(status) => 2,
            _ => 1,
        }
    }
}

/// The value as read from stdin: one trailing newline (`\n` or `\r\n`)
/// trimmed, so `echo VALUE |` sets `VALUE`.
pub fn value_from(raw: &str) -> &str {
    raw.strip_suffix('\n')
        .map(|v| v.strip_suffix('\r').unwrap_or(v))
        .unwrap_or(raw)
}

/// A stopped node to write into: its data dir and its keyring file.
#[derive(Debug, Clone)]
pub struct Offline {
    pub data_dir: std::path::PathBuf,
    /// Defaults to `<data_dir>/keyring` (the node's own default).
    pub keyring: Option<std::path::PathBuf>,
}

/// `crewlet secrets set NAME` with the value read from `input`: through the
/// API, or — with `offline` naming a data dir no node holds — sealed into
/// that node's store.
pub fn cli_set(
    api: &str,
    name: &str,
    input: &mut impl std::io::Read,
    offline: Option<&Offline>,
) -> Result<String, SecretsCliError> {
    check_name(name).map_err(SecretsCliError::BadName)?;
    let mut raw = String::new();
    input
        .read_to_string(&mut raw)
        .map_err(SecretsCliError::Stdin)?;
    let value = value_from(&raw);
    if value.is_empty() {
        return Err(SecretsCliError::Empty);
    }
    if let Some(offline) = offline
        && let Some(done) = set_offline(offline, name, value)?
    {
        return Ok(done);
    }
    // A node holding the data dir gets that data dir's own token.
    let node = crate::client::NodeApi {
        api,
        data_dir: offline.map(|o| o.data_dir.as_path()),
    };
    expect_ok(
        api,
        crate::client::request_to(
            node,
            "PUT",
            &format!("/secrets/{name}"),
            &[],
            value.as_bytes(),
        )?,
    )?;
    Ok(format!("set {name} through {api}"))
}

/// Seals `value` into the store of the stopped node at `offline`; `None`
/// when a node holds the data dir (the caller goes through its API).
fn set_offline(
    offline: &Offline,
    name: &str,
    value: &str,
) -> Result<Option<String>, SecretsCliError> {
    let dir = &offline.data_dir;
    if !dir.is_dir() {
        return Err(SecretsCliError::NoDataDir(dir.display().to_string()));
    }
    let owner = format!("crewlet secrets set {name}");
    let _lock =
        match crewlet_stream::DirLock::acquire(dir, ".crewlet-node.lock", "data dir", &owner) {
            Ok(lock) => lock,
            Err(crewlet_stream::LockError::Held { .. }) => return Ok(None),
            Err(source) => {
                return Err(SecretsCliError::Lock {
                    dir: dir.display().to_string(),
                    source,
                });
            }
        };
    let path = offline
        .keyring
        .clone()
        .unwrap_or_else(|| dir.join("keyring"));
    let keyring = Keyring::open_or_create(&path)?;
    let record = Record::seal(&keyring, name, value).map_err(SecretsCliError::Sealing)?;
    let store = crewlet_store::Store::open_in(dir)?;
    store.put_pending_secret(name, &String::from_utf8_lossy(&record.to_bytes()))?;
    Ok(Some(format!(
        "no node is running on {}: sealed {name} under key {} into its node store; the node moves it onto the fleet when it starts",
        dir.display(),
        keyring.current()
    )))
}

/// `crewlet secrets rotate-key`: the node adds a key to its keyring,
/// re-seals every value and retires keys nothing uses.
pub fn cli_rotate(api: &str) -> Result<String, SecretsCliError> {
    let body = expect_ok(
        api,
        crate::client::request(api, "POST", "/secrets/rotate-key", &[], b"")?,
    )?;
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let r = &answer["rotation"];
    let mut out = format!(
        "new key {}: re-sealed {} secret(s); retired {}\n",
        r["key"].as_str().unwrap_or("?"),
        r["resealed"].as_array().map_or(0, Vec::len),
        match r["retired"].as_array() {
            Some(ids) if !ids.is_empty() => ids
                .iter()
                .filter_map(|i| i.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            _ => "none".to_owned(),
        },
    );
    for (key, names) in r["kept"].as_object().into_iter().flatten() {
        out.push_str(&format!(
            "kept key {key}: still seals {} (not openable on this node); copy the fleet's keyring here and rotate again\n",
            names
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    out.push_str("copy the keyring file to every node of the fleet\n");
    Ok(out)
}

/// `crewlet secrets rm NAME`.
pub fn cli_remove(api: &str, name: &str) -> Result<String, SecretsCliError> {
    check_name(name).map_err(SecretsCliError::BadName)?;
    expect_ok(
        api,
        crate::client::request(api, "DELETE", &format!("/secrets/{name}"), &[], b"")?,
    )?;
    Ok(format!("removed {name} through {api}"))
}

/// `crewlet secrets list`: one line per secret, name and update time.
pub fn cli_list(api: &str) -> Result<String, SecretsCliError> {
    let body = expect_ok(
        api,
        crate::client::request(api, "GET", "/secrets", &[], b"")?,
    )?;
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let mut out = String::new();
    for s in answer["secrets"].as_array().into_iter().flatten() {
        let name = s["name"].as_str().unwrap_or("?");
        let updated = s["updated_ms"]
            .as_u64()
            .map(|ms| {
                let at = time::OffsetDateTime::UNIX_EPOCH + Duration::from_millis(ms);
                at.format(&time::format_description::well_known::Rfc3339)
                    .unwrap_or_default()
            })
            .unwrap_or_default();
        let key = s["key"].as_str().unwrap_or("-");
        let shadow = if s["environment_too"] == true {
            "\tbucket (overrides this node's environment)"
        } else {
            "\tbucket"
        };
        match s["problem"].as_str() {
            Some(problem) => out.push_str(&format!(
                "{name}\t{updated}\t{key}{shadow}\tUNAVAILABLE: {problem}\n"
            )),
            None => out.push_str(&format!("{name}\t{updated}\t{key}{shadow}\n")),
        }
    }
    for s in answer["outside_bucket"].as_array().into_iter().flatten() {
        let name = s["name"].as_str().unwrap_or("?");
        match s["source"].as_str() {
            Some("environment") => out.push_str(&format!("{name}\t-\t-\tthe node's environment\n")),
            _ => out.push_str(&format!(
                "{name}\t-\t-\tUNSET: the company uses it; `crewlet secrets set {name}`\n"
            )),
        }
    }
    if let Some(rule) = answer["precedence"].as_str() {
        out.push_str(&format!("precedence: {rule}\n"));
    }
    Ok(out)
}

fn expect_ok(api: &str, (status, body): (u16, String)) -> Result<String, SecretsCliError> {
    if (200..300).contains(&status) {
        Ok(body)
    } else {
        Err(SecretsCliError::Refused {
            api: api.to_owned(),
            status,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_trailing_newline_is_trimmed_and_nothing_else() {
        assert_eq!(value_from("abc\n"), "abc");
        assert_eq!(value_from("abc\r\n"), "abc");
        assert_eq!(value_from("abc"), "abc");
        assert_eq!(value_from("abc\n\n"), "abc\n");
        assert_eq!(value_from(" abc \n"), " abc ");
    }

    #[test]
    fn a_bad_name_is_refused_before_any_request() {
        let err = cli_set("http://127.0.0.1:1", "1BAD", &mut "v".as_bytes(), None).unwrap_err();
        assert!(matches!(err, SecretsCliError::BadName(_)), "{err}");
        assert_eq!(err.exit_code(), 2);
        let err = cli_set("http://127.0.0.1:1", "GOOD", &mut "\n".as_bytes(), None).unwrap_err();
        assert!(matches!(err, SecretsCliError::Empty), "{err}");
    }
}
