//! Named buckets (module state) on JetStream: the same primitives as the
//! coordination buckets, opened or adopted by name. An owner's spec is
//! applied to an existing bucket only where it differs (one stream update,
//! not one per start), and never to its replica count.

use super::*;

impl NatsKv {
    /// A named bucket opened here, or adopted as it is on first use: a
    /// bucket another node (or an older catalogue) created is served
    /// without being rewritten.
    async fn named(&self, name: &BucketName) -> NamedResult<Arc<Opened>> {
        if let Some(o) = self.named.lock().expect("named lock").get(name) {
            return Ok(o.clone());
        }
        let stream = match self.js.get_stream(format!("KV_{name}")).await {
            Ok(s) => s,
            Err(e) if is_stream_not_found(&e) => return Err(NamedError::NoBucket(name.clone())),
            Err(e) => return Err(unavailable("open bucket", e).into()),
        };
        let o = Arc::new(Opened::new(name.to_string(), stream));
        self.named
            .lock()
            .expect("named lock")
            .insert(name.clone(), o.clone());
        Ok(o)
    }

    async fn named_write(
        &self,
        bucket: &BucketName,
        key: &str,
        value: Bytes,
        removed: bool,
        expect: Expect,
    ) -> NamedWrite {
        let o = self.named(bucket).await?;
        Ok(self.publish_to(&o, key, value, removed, expect).await?)
    }
}

impl NamedKv for NatsKv {
    fn open<'a>(&'a self, spec: &'a NamedSpec) -> BoxFuture<'a, Result<NamedOpened, OpenError>> {
        Box::pin(async move {
            let config = kv::Config {
                bucket: spec.name.to_string(),
                description: spec.description.clone(),
                history: i64::from(spec.history.max(1)),
                max_age: spec.age.unwrap_or_default(),
                max_bytes: i64::try_from(spec.max_bytes).unwrap_or(i64::MAX),
                max_value_size: i32::try_from(spec.max_value_size).unwrap_or(i32::MAX),
                num_replicas: spec.replicas.max(1),
                storage: stream::StorageType::File,
                ..Default::default()
            };
            let (mut stream, created) = open_bucket(&self.js, &config).await?;
            let mut reconfigured = Vec::new();
            if !created && spec.existing == Existing::Reconfigure {
                let (update, changed) = differing(&stream.cached_info().config, &config);
                if !changed.is_empty() {
                    let why = |e: String| OpenError::Bucket {
                        bucket: spec.name.to_string(),
                        why: e,
                    };
                    self.js
                        .update_stream(&update)
                        .await
                        .map_err(|e| why(format!("applying the owner's {changed:?}: {e}")))?;
                    stream = self
                        .js
                        .get_stream(&update.name)
                        .await
                        .map_err(|e| why(format!("reading it back: {e}")))?;
                    reconfigured = changed;
                }
            }
            until_reachable(&self.js, &config.bucket).await?;
            let replicas = stream.cached_info().config.num_replicas.max(1);
            self.named.lock().expect("named lock").insert(
                spec.name.clone(),
                Arc::new(Opened::new(spec.name.to_string(), stream)),
            );
            Ok(NamedOpened {
                created,
                reconfigured,
                replicas,
            })
        })
    }

    fn names(&self) -> BoxFuture<'_, NamedResult<Vec<BucketName>>> {
        Box::pin(async move {
            let mut names = self.js.stream_names();
            let mut out = Vec::new();
            while let Some(name) = names.next().await {
                let name = name.map_err(|e| unavailable("stream names", e))?;
                if let Some(b) = name
                    .strip_prefix("KV_")
                    .and_then(|b| BucketName::new(b).ok())
                {
                    out.push(b);
                }
            }
            out.sort();
            Ok(out)
        })
    }

    fn get<'a>(
        &'a self,
        bucket: &'a BucketName,
        key: &'a str,
    ) -> BoxFuture<'a, NamedResult<Option<Entry>>> {
        Box::pin(async move {
            let o = self.named(bucket).await?;
            Ok(self.leader_get(&o, key).await?)
        })
    }

    fn put<'a>(
        &'a self,
        bucket: &'a BucketName,
        key: &'a str,
        value: Bytes,
        expect: Expect,
    ) -> BoxFuture<'a, NamedWrite> {
        Box::pin(self.named_write(bucket, key, value, false, expect))
    }

    fn remove<'a>(
        &'a self,
        bucket: &'a BucketName,
        key: &'a str,
        expect: Expect,
    ) -> BoxFuture<'a, NamedWrite> {
        Box::pin(self.named_write(bucket, key, Bytes::new(), true, expect))
    }

    fn list<'a>(
        &'a self,
        bucket: &'a BucketName,
        filter: Option<&'a str>,
    ) -> BoxFuture<'a, NamedResult<Vec<Entry>>> {
        Box::pin(async move {
            let o = self.named(bucket).await?;
            Ok(self.list_in(o, filter).await?)
        })
    }

    fn watch<'a>(
        &'a self,
        bucket: &'a BucketName,
        filter: Option<&'a str>,
    ) -> BoxFuture<'a, NamedResult<Watch>> {
        Box::pin(async move {
            let o = self.named(bucket).await?;
            Ok(self.watch_in(o, filter).await?)
        })
    }

    fn usage<'a>(&'a self, bucket: &'a BucketName) -> BoxFuture<'a, NamedResult<NamedUsage>> {
        Box::pin(async move {
            let o = self.named(bucket).await?;
            let mut stream = o.stream.clone();
            let info = stream
                .info()
                .await
                .map_err(|e| unavailable("bucket usage", e))?;
            Ok(NamedUsage {
                bytes: info.state.bytes,
                max_bytes: u64::try_from(info.config.max_bytes).ok().filter(|b| *b > 0),
            })
        })
    }
}

/// The existing stream's config with the owner's options where they
/// differ, and which options those were. The replica count, subjects,
/// storage and description stay as they are.
fn differing(held: &stream::Config, wanted: &kv::Config) -> (stream::Config, Vec<&'static str>) {
    let mut update = held.clone();
    let mut changed = Vec::new();
    if held.max_messages_per_subject != wanted.history {
        update.max_messages_per_subject = wanted.history;
        changed.push("history");
    }
    if held.max_age != wanted.max_age {
        update.max_age = wanted.max_age;
        // The broker refuses a duplicate window longer than the age.
        if !wanted.max_age.is_zero() && update.duplicate_window > wanted.max_age {
            update.duplicate_window = wanted.max_age;
        }
        changed.push("age");
    }
    if held.max_bytes != wanted.max_bytes {
        update.max_bytes = wanted.max_bytes;
        changed.push("max_bytes");
    }
    if held.max_message_size != wanted.max_value_size {
        update.max_message_size = wanted.max_value_size;
        changed.push("max_value_size");
    }
    (update, changed)
}
