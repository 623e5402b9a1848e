//! The catalogue: every manifest under a plugins directory, checked together.
//!
//! Rules, and why:
//! - The directory is walked for `plugin.toml` files (skipping `target` and
//!   hidden directories), so a plugin is wherever its manifest is.
//! - Two plugins may not share a name (buckets and logs are keyed by it),
//!   nor two webhooks a route (a delivery must have one parser).
//! - A `reads` entry whose owner is in the catalogue must name a bucket the
//!   owner declares (ADR 202); one whose owner is absent is allowed — the
//!   bucket is created from the reader's side and can be watched before the
//!   owner is ever loaded.
//! - Likewise a `topic` subscription whose owner is in the catalogue must
//!   name a topic the owner `publishes`: otherwise it never fires.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use crate::manifest::{
    BucketDecl, MANIFEST_FILE, Manifest, ManifestError, Permission, Permissions, ReadDecl, Source,
    bucket_name,
};

/// A catalogue-level problem (between manifests).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogueError {
    #[error("{}: field `name`: `{name}` is also the name of {}; rename one", file.display(), other.display())]
    DuplicateName {
        name: String,
        file: PathBuf,
        other: PathBuf,
    },
    #[error("{}: field `webhook.routes`: route `{route}` is also served by {}; a route has one parser", file.display(), other.display())]
    DuplicateRoute {
        route: String,
        file: PathBuf,
        other: PathBuf,
    },
    #[error("{}: field `module.reads`: `{read}` names a bucket module `{}` does not declare (it declares: {declared}); fix the name or add [module.state.{}] to {}", file.display(), read.module, read.bucket, owner_file.display())]
    UndeclaredRead {
        read: ReadDecl,
        file: PathBuf,
        owner_file: PathBuf,
        declared: String,
    },
    #[error("{}: field `module.subscribe[{index}].topic`: `{module}.{topic}` names a topic module `{module}` does not publish (it publishes: {declared}); fix the name or add \"{topic}\" to `publishes` in {}", file.display(), owner_file.display())]
    UndeclaredTopic {
        index: usize,
        module: String,
        topic: String,
        file: PathBuf,
        owner_file: PathBuf,
        declared: String,
    },
}

/// Every bucket the catalogue declares or reads, by mesh-wide name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketSpec {
    /// Mesh-wide name (`mod_<module>_<local>`).
    pub name: String,
    /// The owning module.
    pub owner: String,
    /// The owner's local name for it.
    pub local: String,
    /// The owner's options, when the owner is in the catalogue; a bucket
    /// only read so far is created with the defaults.
    pub decl: Option<BucketDecl>,
}

/// The manifests under one directory, checked together.
#[derive(Debug, Clone, Default)]
pub struct Catalogue {
    pub plugins: Vec<Manifest>,
}

/// Finds every `plugin.toml` under `dir`, sorted by path. Build output
/// (`target`), hidden directories and `testdata` (plugins that exist to be
/// refused) are not part of a catalogue. Symbolic links are followed (a
/// plugin folder linked in from elsewhere is a plugin like any other); a
/// folder reached twice, through a loop or a second link, is read once; a
/// link that leads nowhere is an error naming it, never skipped.
pub fn manifest_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut seen = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        if !seen.insert(std::fs::canonicalize(&current)?) {
            continue;
        }
        for entry in std::fs::read_dir(&current)? {
            let entry = entry?;
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let kind = entry.file_type()?;
            let is_dir = if kind.is_symlink() {
                std::fs::metadata(&path)
                    .map_err(|e| {
                        std::io::Error::new(
                            e.kind(),
                            format!("{}: a link that leads nowhere ({e}); remove it or point it at a plugin folder", path.display()),
                        )
                    })?
                    .is_dir()
            } else {
                kind.is_dir()
            };
            if is_dir {
                if name != "target" && name != "testdata" && !name.starts_with('.') {
                    stack.push(path);
                }
            } else if name == MANIFEST_FILE {
                found.push(path);
            }
        }
    }
    found.sort();
    Ok(found)
}

/// A plugins directory the catalogue cannot be read from.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    #[error("cannot read the plugins directory {}: {source}", dir.display())]
    Unreadable {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{} holds {entries} entr{} but no {MANIFEST_FILE} under it (target, testdata and hidden folders are skipped); pass the folder that holds the plugins' folders",
        dir.display(),
        if *entries == 1 { "y" } else { "ies" }
    )]
    NoManifests { dir: PathBuf, entries: usize },
}

impl Catalogue {
    /// Loads every manifest under `dir`. Manifests that fail are returned
    /// beside the catalogue of those that parsed, so one bad plugin does not
    /// hide the others.
    pub fn load(dir: &Path) -> std::io::Result<(Catalogue, Vec<ManifestError>)> {
        let mut catalogue = Catalogue::default();
        let mut errors = Vec::new();
        for file in manifest_files(dir)? {
            match Manifest::load(&file) {
                Ok(m) => catalogue.plugins.push(m),
                Err(e) => errors.push(e),
            }
        }
        Ok((catalogue, errors))
    }

    /// One catalogue from several directories, in order (a name or route
    /// two of them share is a [`CatalogueError`], as within one). A
    /// directory that holds entries but no manifest is refused: it is a
    /// wrong path, and "0 plugins, all pass" would hide it.
    pub fn load_dirs(dirs: &[PathBuf]) -> Result<(Catalogue, Vec<ManifestError>), DirError> {
        let mut catalogue = Catalogue::default();
        let mut errors = Vec::new();
        for dir in dirs {
            let unreadable = |source| DirError::Unreadable {
                dir: dir.clone(),
                source,
            };
            let (found, invalid) = Catalogue::load(dir).map_err(unreadable)?;
            if found.plugins.is_empty() && invalid.is_empty() {
                let entries = std::fs::read_dir(dir).map_err(unreadable)?.count();
                if entries > 0 {
                    return Err(DirError::NoManifests {
                        dir: dir.clone(),
                        entries,
                    });
                }
            }
            catalogue.plugins.extend(found.plugins);
            errors.extend(invalid);
        }
        Ok((catalogue, errors))
    }

    /// The plugin named `name`.
    pub fn get(&self, name: &str) -> Option<&Manifest> {
        self.plugins.iter().find(|m| m.name == name)
    }

    /// Problems between manifests.
    pub fn problems(&self) -> Vec<CatalogueError> {
        let mut problems = Vec::new();
        let mut names: BTreeMap<&str, &Path> = BTreeMap::new();
        let mut routes: BTreeMap<&str, &Path> = BTreeMap::new();
        for m in &self.plugins {
            if let Some(other) = names.insert(&m.name, &m.file) {
                problems.push(CatalogueError::DuplicateName {
                    name: m.name.clone(),
                    file: m.file.clone(),
                    other: other.to_path_buf(),
                });
            }
            if let Permissions::Webhook { routes: rs, .. } = &m.permissions {
                for r in rs {
                    if let Some(other) = routes.insert(r, &m.file) {
                        problems.push(CatalogueError::DuplicateRoute {
                            route: r.clone(),
                            file: m.file.clone(),
                            other: other.to_path_buf(),
                        });
                    }
                }
            }
        }
        for m in &self.plugins {
            let Permissions::Module { reads, .. } = &m.permissions else {
                continue;
            };
            for read in reads {
                let Some(owner) = self.get(&read.module) else {
                    continue;
                };
                let declared: Vec<&str> = match &owner.permissions {
                    Permissions::Module { state, .. } => {
                        state.iter().map(|b| b.local.as_str()).collect()
                    }
                    _ => Vec::new(),
                };
                if !declared.contains(&read.bucket.as_str()) {
                    problems.push(CatalogueError::UndeclaredRead {
                        read: read.clone(),
                        file: m.file.clone(),
                        owner_file: owner.file.clone(),
                        declared: if declared.is_empty() {
                            "nothing".to_string()
                        } else {
                            declared.join(", ")
                        },
                    });
                }
            }
        }
        for m in &self.plugins {
            let Permissions::Module { subscribes, .. } = &m.permissions else {
                continue;
            };
            for (index, sub) in subscribes.iter().enumerate() {
                let Source::Topic { module, topic } = &sub.source else {
                    continue;
                };
                let Some(owner) = self.get(module) else {
                    continue;
                };
                let declared: &[String] = match &owner.permissions {
                    Permissions::Module { publishes, .. } => publishes,
                    _ => &[],
                };
                if !declared.contains(topic) {
                    problems.push(CatalogueError::UndeclaredTopic {
                        index,
                        module: module.clone(),
                        topic: topic.clone(),
                        file: m.file.clone(),
                        owner_file: owner.file.clone(),
                        declared: if declared.is_empty() {
                            "nothing".to_string()
                        } else {
                            declared.join(", ")
                        },
                    });
                }
            }
        }
        problems
    }

    /// The problems that concern `file`'s own manifest (a read or a
    /// subscription naming what its owner does not declare).
    pub fn problems_of(&self, file: &Path) -> Vec<CatalogueError> {
        self.problems()
            .into_iter()
            .filter(|p| match p {
                CatalogueError::UndeclaredRead { file: f, .. }
                | CatalogueError::UndeclaredTopic { file: f, .. } => f == file,
                _ => false,
            })
            .collect()
    }

    /// Every bucket to create: each declared one, and each read one whose
    /// owner is absent (with default options), deduplicated by name.
    pub fn buckets(&self) -> Vec<BucketSpec> {
        let mut out: BTreeMap<String, BucketSpec> = BTreeMap::new();
        for m in &self.plugins {
            if let Permissions::Module { state, .. } = &m.permissions {
                for b in state {
                    let name = bucket_name(&m.name, &b.local);
                    out.insert(
                        name.clone(),
                        BucketSpec {
                            name,
                            owner: m.name.clone(),
                            local: b.local.clone(),
                            decl: Some(b.clone()),
                        },
                    );
                }
            }
        }
        for m in &self.plugins {
            if let Permissions::Module { reads, .. } = &m.permissions {
                for r in reads {
                    let name = bucket_name(&r.module, &r.bucket);
                    out.entry(name.clone()).or_insert(BucketSpec {
                        name,
                        owner: r.module.clone(),
                        local: r.bucket.clone(),
                        decl: None,
                    });
                }
            }
        }
        out.into_values().collect()
    }

    /// Module buckets that exist (`existing`, mesh-wide names with the
    /// `mod_` prefix) but that no manifest declares or reads any more:
    /// reported, never removed.
    pub fn orphaned_buckets<'a>(&self, existing: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        let known: BTreeSet<String> = self.buckets().into_iter().map(|b| b.name).collect();
        existing
            .into_iter()
            .filter(|b| b.starts_with("mod_") && !known.contains(*b))
            .map(str::to_string)
            .collect()
    }
}

/// One plugin's line in a check report.
#[derive(Debug, Clone)]
pub struct CheckedPlugin {
    pub file: PathBuf,
    /// `None` when the manifest did not parse.
    pub name: Option<String>,
    pub problems: Vec<String>,
}

/// Directories as a report names them.
fn shown(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What `crewlet plugins check DIR` prints.
#[derive(Debug, Clone)]
pub struct CheckReport {
    pub dirs: Vec<PathBuf>,
    pub plugins: Vec<CheckedPlugin>,
    /// Problems between manifests.
    pub catalogue: Vec<String>,
}

impl CheckReport {
    /// Whether every manifest and component passed.
    pub fn is_ok(&self) -> bool {
        self.catalogue.is_empty() && self.plugins.iter().all(|p| p.problems.is_empty())
    }

    /// Every problem, one per line.
    pub fn problems(&self) -> Vec<String> {
        self.plugins
            .iter()
            .flat_map(|p| p.problems.iter().cloned())
            .chain(self.catalogue.iter().cloned())
            .collect()
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "checked {} plugin(s) under {}",
            self.plugins.len(),
            shown(&self.dirs)
        )?;
        for p in &self.plugins {
            let name = p.name.as_deref().unwrap_or("?");
            if p.problems.is_empty() {
                writeln!(f, "  ok    {name} ({})", p.file.display())?;
            } else {
                writeln!(f, "  FAIL  {name} ({})", p.file.display())?;
                for problem in &p.problems {
                    writeln!(f, "        {problem}")?;
                }
            }
        }
        for problem in &self.catalogue {
            writeln!(f, "  FAIL  catalogue: {problem}")?;
        }
        let n = self.problems().len();
        if n == 0 {
            writeln!(f, "all plugins pass")
        } else {
            writeln!(f, "{n} problem(s)")
        }
    }
}

/// What `crewlet plugins list` prints: each plugin's effective permissions.
#[derive(Debug, Clone)]
pub struct PluginList {
    pub dirs: Vec<PathBuf>,
    pub catalogue: Catalogue,
    /// Manifests that did not parse (listed so they are not missed).
    pub invalid: Vec<ManifestError>,
}

/// ` (operator grant in FILE)` when the operator added `permission`,
/// else nothing.
fn by_operator(m: &Manifest, permission: Permission) -> String {
    match m.granted.added_by(&permission) {
        Some(_) => format!(" ({})", m.granted),
        None => String::new(),
    }
}

impl fmt::Display for PluginList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "plugins under {}", shown(&self.dirs))?;
        for m in &self.catalogue.plugins {
            writeln!(
                f,
                "{} {} ({}) — {}",
                m.name,
                m.version,
                m.kind,
                m.file.display()
            )?;
            writeln!(
                f,
                "  limits: memory {} MiB, deadline {} ms per call",
                m.limits.memory_bytes / (1024 * 1024),
                m.limits.deadline.as_millis()
            )?;
            writeln!(
                f,
                "  ambient: no env, no sockets, no clock{}",
                if m.scratch {
                    ", a private scratch directory"
                } else {
                    ", no filesystem"
                }
            )?;
            match &m.permissions {
                Permissions::Webhook { routes, secrets } => {
                    let served: Vec<String> = routes
                        .iter()
                        .map(|r| format!("{r}{}", by_operator(m, Permission::Route(r.clone()))))
                        .collect();
                    writeln!(f, "  serves: {}", served.join(", "))?;
                    let limit = m.limits.max_body_bytes;
                    writeln!(
                        f,
                        "  body limit: {limit} bytes{}",
                        by_operator(m, Permission::BodyLimit(limit))
                    )?;
                    writeln!(
                        f,
                        "  secrets: {}",
                        if secrets.is_empty() {
                            "none".to_string()
                        } else {
                            secrets.join(", ")
                        }
                    )?;
                }
                Permissions::Provider {
                    base_url,
                    allowed_outbound_hosts,
                    options,
                } => {
                    writeln!(
                        f,
                        "  base url: {base_url}{}",
                        by_operator(m, Permission::BaseUrl(base_url.clone()))
                    )?;
                    if !options.is_empty() {
                        writeln!(f, "  model options: {}", options.join(", "))?;
                    }
                    let hosts: Vec<String> = allowed_outbound_hosts
                        .iter()
                        .map(|o| format!("{o}{}", by_operator(m, Permission::Outbound(o.clone()))))
                        .collect();
                    writeln!(f, "  outbound http: {}", hosts.join(", "))?;
                }
                Permissions::Module {
                    state,
                    reads,
                    publishes,
                    subscribes,
                    tools,
                } => {
                    for b in state {
                        let ttl = b
                            .ttl
                            .map(|t| format!("{} s", t.as_secs()))
                            .unwrap_or_else(|| "none".to_string());
                        writeln!(
                            f,
                            "  read-write: {} as `{}` (history {}, ttl {ttl})",
                            bucket_name(&m.name, &b.local),
                            b.local,
                            b.history
                        )?;
                    }
                    for r in reads {
                        let owner = if self.catalogue.get(&r.module).is_some() {
                            ""
                        } else {
                            " (owner not in this catalogue)"
                        };
                        writeln!(
                            f,
                            "  read-only: {} as `{r}`{owner}{}",
                            bucket_name(&r.module, &r.bucket),
                            by_operator(m, Permission::Read(r.clone()))
                        )?;
                    }
                    if state.is_empty() && reads.is_empty() {
                        writeln!(f, "  state: none")?;
                    }
                    for topic in publishes {
                        writeln!(
                            f,
                            "  publishes: {}",
                            crewlet_bus::module_topic_kind(&m.name, topic)
                        )?;
                    }
                    for sub in subscribes {
                        writeln!(
                            f,
                            "  subscribes: {} ({})",
                            sub.source.subject_kind(),
                            match sub.delivery {
                                crate::manifest::Delivery::Once => "once",
                                crate::manifest::Delivery::EachNode => "each node",
                            }
                        )?;
                    }
                    for tool in tools {
                        writeln!(f, "  tool: {} — {}", tool.name, tool.description)?;
                    }
                }
            }
            for d in &m.granted.denied {
                let file = &m.granted.source;
                writeln!(
                    f,
                    "  denied by the operator: {} (`{}` in {file})",
                    d.permission, d.key
                )?;
            }
        }
        for e in &self.invalid {
            writeln!(f, "INVALID {e}")?;
        }
        Ok(())
    }
}
