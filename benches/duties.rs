//! The scheduler's figures: fire instant → wake on the seat's inbox
//! (p50/p99 over 100+ fires) against a plain publish → consume on the same
//! broker, and the duty's hand-over after SIGKILL of its holder against the
//! duty's TTL — release binaries, one nats-server, all in one run.
//!
//! `cargo bench --bench duties` (`DUTIES_FIRES`, default 102).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crewlet_testkit::{NatsServer, free_port, http};
use futures::StreamExt;

struct Node {
    child: Child,
    addr: String,
}

impl Drop for Node {
    fn drop(&mut self) {
        // SAFETY: our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

fn start(server: &NatsServer, dir: &Path, id: &str, lease: u64) -> Node {
    let port = free_port();
    let config = dir.join(format!("{id}.toml"));
    std::fs::write(
        &config,
        format!(
            "[node]\nid = \"{id}\"\nroles = [\"data\", \"ingress\", \"workers\"]\n[api]\nport = {port}\n[stream]\nurl = \"{}\"\n[duties]\nscheduler_lease_seconds = {lease}\n",
            server.url()
        ),
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_crewlet"))
        .arg("run")
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.join(id))
        .env("CREWLET_LOG", "error")
        .env("CREWLET_BOOTSTRAP_TOKEN", http::OPERATOR_TOKEN)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let node = Node {
        child,
        addr: format!("127.0.0.1:{port}"),
    };
    let t = Instant::now();
    while !http::get(&node.addr, "/ready").is_ok_and(|r| r.status == 200) {
        assert!(t.elapsed() < Duration::from_secs(60), "never ready");
        std::thread::sleep(Duration::from_millis(10));
    }
    node
}

fn holds(node: &Node, duty: &str) -> bool {
    http::get(&node.addr, "/health").is_ok_and(|r| {
        r.json()["duties"]["held_here"]
            .as_array()
            .is_some_and(|rows| rows.iter().any(|r| r["duty"] == duty))
    })
}

fn activate(node: &Node, doc: &str) {
    let put = http::request(&node.addr, "PUT", "/config", &[], doc.as_bytes()).unwrap();
    assert_eq!(put.status, 201, "{}", put.text());
    let epoch = put.json()["epoch"].as_u64().unwrap();
    let t = Instant::now();
    while http::get(&node.addr, "/health").unwrap().json()["applied_epoch"].as_u64() != Some(epoch)
    {
        assert!(t.elapsed() < Duration::from_secs(30), "never applied");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn main() {
    let fires: usize = std::env::var("DUTIES_FIRES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(102);
    let server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(async_nats::connect(server.url())).unwrap();
    let js = {
        let _inside = rt.enter();
        async_nats::jetstream::new(client.clone())
    };

    // Fire → wake: one schedule per second over every seat of the example.
    let one = start(&server, dir.path(), "bench-1", 30);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("examples/company.toml")).unwrap();
    let doc = format!(
        "{doc}\n[schedules.bench_eng]\ncron = \"* * * * * *\"\nrole = \"engineer\"\nprompt = \"tick\"\n\n[schedules.bench_support]\ncron = \"* * * * * *\"\nrole = \"support\"\nprompt = \"tick\"\n"
    );
    let seats = ["ada", "linus", "grace"];
    activate(&one, &doc);
    let fire_lat: Vec<f64> = rt.block_on(async {
        let stream = js.get_stream(crewlet_bus::AGENT_STREAM).await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut readers = Vec::new();
        for seat in seats {
            let c: async_nats::jetstream::consumer::PullConsumer = stream
                .get_consumer(&crewlet_bus::mailbox_durable(seat))
                .await
                .unwrap();
            let tx = tx.clone();
            readers.push(tokio::spawn(async move {
                let mut msgs = c.messages().await.unwrap();
                while let Some(Ok(m)) = msgs.next().await {
                    let at = now_ms();
                    let _ = m.ack().await;
                    let w: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
                    let due: i64 = w["delivery_id"]
                        .as_str()
                        .and_then(|d| d.rsplit(':').next())
                        .and_then(|ms| ms.parse().ok())
                        .unwrap_or(at);
                    let _ = tx.send((at - due) as f64);
                }
            }));
        }
        let mut out = Vec::new();
        // The first second may be a partial one: skip three wakes.
        for i in 0..fires + 3 {
            let l = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("a fire every second")
                .unwrap();
            if i >= 3 {
                out.push(l);
            }
        }
        for r in readers {
            r.abort();
        }
        out
    });
    // The floor: the same broker, a publish straight to an inbox and its
    // consume, timed the same way.
    let base_lat: Vec<f64> = rt.block_on(async {
        let stream = js.get_stream(crewlet_bus::AGENT_STREAM).await.unwrap();
        // A mailbox of its own: the scheduler keeps firing into the seats'.
        let c: async_nats::jetstream::consumer::PullConsumer = stream
            .get_or_create_consumer(
                "bench-floor",
                async_nats::jetstream::consumer::pull::Config {
                    durable_name: Some("bench-floor".into()),
                    filter_subject: crewlet_bus::inbox_subject("bench-floor"),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let mut msgs = c.messages().await.unwrap();
        let mut out = Vec::new();
        for _ in 0..fires {
            let sent = Instant::now();
            js.publish(crewlet_bus::inbox_subject("bench-floor"), "{}".into())
                .await
                .unwrap()
                .await
                .unwrap();
            let m = msgs.next().await.unwrap().unwrap();
            out.push(sent.elapsed().as_secs_f64() * 1000.0);
            m.ack().await.unwrap();
        }
        out
    });
    drop(one);

    // Hand-over: two nodes, SIGKILL the holder, time until the other holds.
    let mut handovers = Vec::new();
    for lease in [30u64, 6] {
        let sub = tempfile::tempdir().unwrap();
        let a = start(&server, sub.path(), &format!("ho-a-{lease}"), lease);
        let b = start(&server, sub.path(), &format!("ho-b-{lease}"), lease);
        let t = Instant::now();
        while !(holds(&a, "scheduler") || holds(&b, "scheduler")) {
            assert!(
                t.elapsed() < Duration::from_secs(2 * lease + 30),
                "nobody holds"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let (holder, other) = if holds(&a, "scheduler") {
            (a, b)
        } else {
            (b, a)
        };
        let killed = Instant::now();
        drop(holder);
        while !holds(&other, "scheduler") {
            assert!(
                killed.elapsed() < Duration::from_secs(3 * lease + 10),
                "no hand-over"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        handovers.push((lease, killed.elapsed().as_secs_f64()));
    }

    let mut f = fire_lat;
    f.sort_by(f64::total_cmp);
    let mut b = base_lat;
    b.sort_by(f64::total_cmp);
    let (fp50, fp99, bp50, bp99) = (pct(&f, 0.5), pct(&f, 0.99), pct(&b, 0.5), pct(&b, 0.99));
    println!("fire instant -> wake on the inbox, {} fires:", f.len());
    println!("  scheduler      p50 {fp50:7.2} ms  p99 {fp99:7.2} ms");
    println!("  publish floor  p50 {bp50:7.2} ms  p99 {bp99:7.2} ms");
    println!(
        "  ratio          p50 {:7.1}x    p99 {:7.1}x",
        fp50 / bp50.max(0.001),
        fp99 / bp99.max(0.001)
    );
    println!("duty hand-over after SIGKILL of the holder:");
    for (lease, secs) in handovers {
        println!(
            "  lease {lease:>3} s  hand-over {secs:6.2} s  = {:.2}x the TTL",
            secs / lease as f64
        );
    }
}
