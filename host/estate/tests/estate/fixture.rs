//! One node's handles on a real nats-server: its coordination, store,
//! company and config, and the estate started from them.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crewlet_company::{Active, ActiveCompany, Company};
use crewlet_config::{NodeConfig, Role};
use crewlet_coord::{Coord, CoordOptions, Owner};
use crewlet_estate::{EstateSlot, Running, UsageAsk, UsageEvents};
use crewlet_store::Store;

pub struct Node {
    pub id: String,
    pub client: async_nats::Client,
    pub coord: Coord,
    pub store: Arc<Store>,
    pub config: NodeConfig,
    pub active: ActiveCompany,
    pub slot: EstateSlot,
}

impl Node {
    /// Node `id` on `url`, its files in `dir`, holding the estate with `data`.
    pub async fn open(id: &str, url: &str, dir: &Path, data: bool) -> Node {
        let client = async_nats::connect(url).await.unwrap();
        let coord = Coord::open(client.clone(), CoordOptions::new(Owner::incarnation(id)))
            .await
            .unwrap();
        let mut config =
            NodeConfig::from_toml("test", "", dir, &Default::default(), &|_| None).unwrap();
        config.data_dir = dir.to_owned();
        config.roles = if data {
            vec![Role::Data]
        } else {
            vec![Role::Seats]
        };
        let company = Company::parse(
            "[org]\nname = \"Estate Test\"\n\n[roles.eng]\nsystem_prompt = \"test\"\n\
             executor = [{ provider = \"openai\", model = \"m\", credentials = \"${K}\" }]\n\
             reviewer = { provider = \"openai\", model = \"m\", credentials = \"${K}\" }\n\n\
             [seats]\nalice = { role = \"eng\" }\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        Node {
            id: id.into(),
            client,
            coord,
            store: Arc::new(Store::open_in(dir).unwrap()),
            config,
            active: ActiveCompany::new(Some(Active::local(company))),
            slot: EstateSlot::default(),
        }
    }

    /// Starts this node's estate reading usage events from `events`.
    pub async fn start(&self, events: UsageEvents) -> Running {
        crewlet_estate::start(
            crewlet_estate::Parts {
                usage_events: events,
                node_id: &self.id,
                client: &self.client,
                coord: &self.coord,
                store: &self.store,
                active: &self.active,
                config: &self.config,
            },
            &self.slot,
        )
        .await
    }

    pub fn backup_parts(&self) -> crewlet_estate::backup::Parts<'_> {
        crewlet_estate::backup::Parts {
            node_id: &self.id,
            client: &self.client,
            coord: &self.coord,
            store: &self.store,
            config: &self.config,
            estate: &self.slot,
        }
    }

    /// Waits (up to 30 s) until this node's `GET /usage?by=BY` holds a
    /// row keyed `key` with `input` input tokens; answers that row.
    pub async fn until_usage(&self, by: &str, key: &str, input: u64) -> serde_json::Value {
        let ask = || UsageAsk {
            by: Some(by.into()),
            ..UsageAsk::default()
        };
        let mut last = None;
        for _ in 0..300 {
            let answer = crewlet_estate::usage(&self.slot, ask());
            if let Ok(v) = &answer {
                let row = v["rows"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|r| r["key"] == key && r["input_tokens"].as_u64() == Some(input));
                if let Some(row) = row {
                    return row.clone();
                }
            }
            last = Some(answer);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "no usage row {by}={key} with {input} input tokens within 30 s; last answer {last:?}"
        );
    }
}

/// A model call of `alice`'s, as the node's publisher keeps it.
pub fn model_call(node: &str, id: &str, input: u64) -> crewlet_store::EventRecord {
    let mut e = crewlet_store::EventRecord::new(
        format!("{node}-{id}"),
        "model_call",
        node,
        serde_json::json!({"phase": "executor", "model": "m", "input_tokens": input, "output_tokens": 1}),
    );
    e.seat = Some("alice".into());
    e
}
