//! The `[module]` section: the buckets a module owns and reads, the topics
//! it publishes, the events it subscribes to and the tools it offers.
//!
//! Rules, and why:
//! - A module names topics and buckets by local names and other modules'
//!   by `module.name`; the host builds every subject (`module.<name>.<topic>`
//!   on the event broadcast), so a manifest can never reach a subject it
//!   was not given.
//! - A subscription names exactly one source: a company event kind from
//!   [`crewlet_bus::EVENT_KINDS`] (a misspelt kind would otherwise be a
//!   subscription that never fires) or another module's topic.
//! - A tool's `arguments` is a JSON Schema whose top-level `type` is
//!   `object` (what every model API takes as a tool's parameters), checked
//!   against its meta-schema here, so a schema the host could not compile
//!   at load is refused at `crewlet plugins check`.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{BucketDecl, MAX_HISTORY, Permissions, ReadDecl, valid_name};

/// The longest tool name a manifest may declare.
pub const MAX_TOOL_NAME: usize = 48;
/// The longest `MODULE__TOOL` a seat may be offered: OpenAI's and
/// Anthropic's limit on a tool's name.
pub const MAX_OFFERED_NAME: usize = 64;
/// The longest tool description a manifest may declare, in bytes.
pub const MAX_TOOL_DESCRIPTION: usize = 1024;

/// One `[[module.subscribe]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    pub source: Source,
    pub delivery: Delivery,
}

/// What a subscription listens to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A company event kind (`turn_ended`).
    Event(String),
    /// Another module's topic (`notebook.changed`).
    Topic { module: String, topic: String },
}

impl Source {
    /// The event kind it matches: `turn_ended`, or `module.notebook.changed`
    /// (its subject is `crewlet_bus::event_subject` of it).
    pub fn subject_kind(&self) -> String {
        match self {
            Source::Event(kind) => kind.clone(),
            Source::Topic { module, topic } => crewlet_bus::module_topic_kind(module, topic),
        }
    }
}

/// Where a subscribed event is delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Delivery {
    /// To one node running the module, once per event.
    #[default]
    Once,
    /// To every node running the module.
    EachNode,
}

/// One `[module.tools.NAME]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolDecl {
    pub name: String,
    pub description: String,
    /// The arguments' JSON Schema (top-level `type = "object"`).
    pub arguments: serde_json::Value,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawModule {
    #[serde(default)]
    state: BTreeMap<String, RawBucket>,
    #[serde(default)]
    reads: Vec<String>,
    #[serde(default)]
    publishes: Vec<String>,
    #[serde(default)]
    subscribe: Vec<RawSubscription>,
    #[serde(default)]
    tools: BTreeMap<String, RawTool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawBucket {
    history: Option<u8>,
    ttl_seconds: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSubscription {
    event: Option<String>,
    topic: Option<String>,
    #[serde(default)]
    delivery: Delivery,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTool {
    description: String,
    arguments: Option<toml::Value>,
}

/// A refusal: the field and the problem (the caller adds the file).
type Refusal = (String, String);

/// Whether `name` is a tool name: 1–48 of `a-z 0-9 - _`.
pub fn valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TOOL_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// Validates the section of module `module`.
pub(super) fn parse(module: &str, section: RawModule) -> Result<Permissions, Refusal> {
    let mut state = Vec::new();
    for (local, bucket) in section.state {
        let field = format!("module.state.{local}");
        if !valid_name(&local) {
            return Err((
                field,
                format!("bucket name `{local}` must be a-z, 0-9 and -, starting with a letter"),
            ));
        }
        let history = bucket.history.unwrap_or(1);
        if !(1..=MAX_HISTORY).contains(&history) {
            return Err((
                format!("{field}.history"),
                format!("{history} must be between 1 and {MAX_HISTORY}"),
            ));
        }
        let ttl = match bucket.ttl_seconds {
            None | Some(0) => None,
            Some(s) => Some(std::time::Duration::from_secs(s)),
        };
        state.push(BucketDecl {
            local,
            history,
            ttl,
        });
    }
    let mut reads = Vec::new();
    for (i, read) in section.reads.iter().enumerate() {
        let field = format!("module.reads[{i}]");
        reads.push(read_of(module, read).map_err(|p| (field, p))?);
    }
    let mut publishes: Vec<String> = Vec::new();
    for (i, topic) in section.publishes.into_iter().enumerate() {
        let field = format!("module.publishes[{i}]");
        if !valid_name(&topic) {
            return Err((
                field,
                format!("topic `{topic}` must be 1–63 of a-z, 0-9 and -, starting with a letter"),
            ));
        }
        if publishes.contains(&topic) {
            return Err((field, format!("topic `{topic}` is listed twice")));
        }
        publishes.push(topic);
    }
    let mut subscribes = Vec::new();
    for (i, raw) in section.subscribe.into_iter().enumerate() {
        let field = format!("module.subscribe[{i}]");
        let source = match (raw.event, raw.topic) {
            (Some(event), None) => Source::Event(event_kind(&event).map_err(|p| {
                let field = format!("{field}.event");
                (field, p)
            })?),
            (None, Some(topic)) => {
                let (owner, topic) = other_module(module, &topic)
                    .map_err(|p| (format!("{field}.topic"), p.replace("NAME", "topic")))?;
                Source::Topic {
                    module: owner,
                    topic,
                }
            }
            (Some(_), Some(_)) => {
                return Err((
                    field,
                    "name either `event` (a company event kind) or `topic` (MODULE.TOPIC), not both"
                        .to_string(),
                ));
            }
            (None, None) => {
                return Err((
                    field,
                    "name the source: `event` (a company event kind) or `topic` (MODULE.TOPIC)"
                        .to_string(),
                ));
            }
        };
        subscribes.push(Subscription {
            source,
            delivery: raw.delivery,
        });
    }
    let mut tools = Vec::new();
    for (name, raw) in section.tools {
        let field = format!("module.tools.{name}");
        if !valid_tool_name(&name) {
            return Err((
                field,
                format!("tool name `{name}` must be 1–{MAX_TOOL_NAME} of a-z, 0-9, - and _"),
            ));
        }
        let offered = module.len() + 2 + name.len();
        if offered > MAX_OFFERED_NAME {
            return Err((
                field,
                format!(
                    "seats are offered this tool as `{module}__{name}` ({offered} characters), past the {MAX_OFFERED_NAME} model APIs accept for a tool's name; shorten the tool's or the module's name"
                ),
            ));
        }
        let description = raw.description.trim().to_string();
        if description.is_empty() || description.len() > MAX_TOOL_DESCRIPTION {
            return Err((
                format!("{field}.description"),
                format!(
                    "say what the tool does in 1–{MAX_TOOL_DESCRIPTION} bytes: the model reads it"
                ),
            ));
        }
        let arguments =
            arguments_schema(raw.arguments).map_err(|p| (format!("{field}.arguments"), p))?;
        tools.push(ToolDecl {
            name,
            description,
            arguments,
        });
    }
    Ok(Permissions::Module {
        state,
        reads,
        publishes,
        subscribes,
        tools,
    })
}

/// `owner.name`, both parts valid names, `owner` another module; problems
/// say `NAME` for the caller to fill in (bucket, topic).
/// `text` (`module.bucket`) as a read of `module`, another module's
/// bucket; else why not.
pub(crate) fn read_of(module: &str, text: &str) -> Result<ReadDecl, String> {
    let (owner, bucket) = other_module(module, text).map_err(|p| p.replace("NAME", "bucket"))?;
    Ok(ReadDecl {
        module: owner,
        bucket,
    })
}

fn other_module(module: &str, text: &str) -> Result<(String, String), String> {
    let (owner, name) = text
        .split_once('.')
        .ok_or_else(|| format!("`{text}` must be `module.NAME`"))?;
    if !valid_name(owner) || !valid_name(name) {
        return Err(format!("`{text}`: both parts must be a-z, 0-9 and -"));
    }
    if owner == module {
        return Err(format!(
            "`{text}` is this module's own NAME; a module names only other modules' this way"
        ));
    }
    Ok((owner.to_string(), name.to_string()))
}

fn event_kind(event: &str) -> Result<String, String> {
    if crewlet_bus::EVENT_KINDS.contains(&event) {
        return Ok(event.to_string());
    }
    let prefix = format!("{}.", crewlet_bus::MODULE_TOPIC_PREFIX);
    if let Some(rest) = event.strip_prefix(&prefix) {
        return Err(format!(
            "`{event}` is a module's topic: write `topic = \"{rest}\"` instead of `event`"
        ));
    }
    Err(format!(
        "`{event}` is not an event kind the node records; use one of: {}",
        crewlet_bus::EVENT_KINDS.join(", ")
    ))
}

/// The `arguments` table as JSON, checked to be a JSON Schema of an object.
fn arguments_schema(raw: Option<toml::Value>) -> Result<serde_json::Value, String> {
    let schema = match raw {
        None => serde_json::json!({ "type": "object" }),
        Some(value) => {
            serde_json::to_value(value).map_err(|e| format!("cannot be read as JSON: {e}"))?
        }
    };
    if schema.get("type").and_then(|t| t.as_str()) != Some("object") {
        return Err(
            "the top-level `type` must be \"object\": a tool's arguments are a JSON object"
                .to_string(),
        );
    }
    jsonschema::meta::validate(&schema)
        .map_err(|e| format!("is not a valid JSON Schema: {e} (at {})", e.instance_path()))?;
    compile(&schema)?;
    Ok(schema)
}

/// Compiles a tool's arguments schema (remote and file references are not
/// fetched: a schema must be whole).
pub(crate) fn compile(schema: &serde_json::Value) -> Result<jsonschema::Validator, String> {
    jsonschema::validator_for(schema).map_err(|e| format!("cannot be compiled: {e}"))
}
