//! Test data: a webhook plugin that misbehaves on request. The body names
//! the misbehaviour.
//!
//! In `verify`: `verify-loop` spins for ever; `verify-secret` refuses with
//! the secret the host handed it as the reason. Anything else verifies.
//!
//! In `parse`: `loop`, `allocate-1gib`, `panic`, `recurse`;
//! `panic-secret` panics with the secret in the message; `reply-secret`
//! answers a reply carrying the secret (raw and hex); `many` returns 20,000
//! deliveries; `huge` one delivery of 8 MiB; `empty-id` and `long-id`
//! (5,000 bytes) deliveries with such ids; `alias` 12 deliveries whose
//! texts all point at one 8 MiB buffer (8 MiB of guest memory that would
//! lift as 96 MiB of host memory: past the webhook world's transfer bound,
//! under wasmtime's default one); `one` a single good delivery;
//! `ambient` reports what ambient authority it found (environment, root
//! directory, clock) and `scratch` writes a file to `/scratch`, each as a
//! parse error's text; `speak-secret` logs and writes to stderr the secret
//! (raw and hex); `speak-flood` logs 2,000 lines of 5 KiB and writes
//! 1 MiB to stderr, then parses to zero deliveries; anything else parses
//! to zero deliveries.

use std::hint::black_box;

use crewlet_plugin_sdk::webhook::log::{self, Level};
use crewlet_plugin_sdk::webhook::{
    Addressed, Delivery, Guest, ParseError, Parsed, Reply, Request, VerifyError, Wakes,
};

struct Plugin;

fn spin() -> ! {
    let mut n: u64 = 0;
    loop {
        n = black_box(n.wrapping_add(1));
    }
}

fn secret(req: &Request) -> String {
    req.secrets
        .first()
        .map(|s| String::from_utf8_lossy(&s.value).into_owned())
        .unwrap_or_default()
}

fn delivery(id: String, text: Option<String>) -> Delivery {
    Delivery {
        source: "hostile".to_string(),
        event_type: "test".to_string(),
        delivery_id: id,
        addressed: Addressed {
            mentions: Vec::new(),
            assignees: Vec::new(),
            reviewers: Vec::new(),
            channel: None,
            thread: None,
        },
        text,
        payload: Vec::new(),
        owed: None,
        sender: Vec::new(),
        wakes: Wakes::RouteAndNamed,
        message: None,
    }
}

/// `count` deliveries whose texts are all the same `len`-byte buffer.
fn aliased(count: usize, len: usize) -> Vec<Delivery> {
    let mut one = std::mem::ManuallyDrop::new("x".repeat(len));
    let ptr = one.as_mut_ptr();
    (0..count)
        .map(|i| {
            // SAFETY: nothing in this guest drops or writes these strings:
            // the bindings lower them by pointer and forget them, and the
            // host refuses the answer before its post-return would free
            // anything. Aliasing them is the whole point of the case.
            let text = unsafe { String::from_raw_parts(ptr, len, len) };
            delivery(format!("alias-{i}"), Some(text))
        })
        .collect()
}

#[inline(never)]
#[expect(unconditional_recursion, reason = "the point: overflow the stack")]
fn recurse(depth: u64) -> u64 {
    // Not a tail call: the addition after the call keeps every frame alive.
    black_box(recurse(black_box(depth + 1))) + 1
}

impl Guest for Plugin {
    fn verify(req: Request) -> Result<(), VerifyError> {
        match req.body.as_slice() {
            b"verify-loop" => spin(),
            b"verify-secret" => Err(VerifyError::MalformedHeader(secret(&req))),
            _ => Ok(()),
        }
    }

    fn parse(req: Request) -> Result<Parsed, ParseError> {
        match req.body.as_slice() {
            b"loop" => spin(),
            b"panic-secret" => panic!("leaking {}", secret(&req)),
            b"reply-secret" => {
                let s = secret(&req);
                let hex: String = s.bytes().map(|b| format!("{b:02x}")).collect();
                Ok(Parsed {
                    deliveries: Vec::new(),
                    reply: Some(Reply {
                        content_type: "text/plain".to_string(),
                        body: format!("raw={s} hex={hex}").into_bytes(),
                    }),
                })
            }
            b"many" => Ok(Parsed {
                deliveries: (0..20_000)
                    .map(|i| delivery(format!("d-{i}"), None))
                    .collect(),
                reply: None,
            }),
            b"huge" => Ok(Parsed {
                deliveries: vec![delivery("huge-1".into(), Some("x".repeat(8 << 20)))],
                reply: None,
            }),
            b"empty-id" => Ok(Parsed {
                deliveries: vec![delivery(String::new(), None)],
                reply: None,
            }),
            b"long-id" => Ok(Parsed {
                deliveries: vec![delivery("a".repeat(5000), None)],
                reply: None,
            }),
            b"alias" => Ok(Parsed {
                deliveries: aliased(12, 8 << 20),
                reply: None,
            }),
            b"one" => Ok(Parsed {
                deliveries: vec![delivery("one-1".into(), Some("hello".into()))],
                reply: None,
            }),
            b"allocate-1gib" => {
                let block = vec![1u8; 1 << 30];
                Err(ParseError::MalformedBody(format!(
                    "allocated {}",
                    black_box(block).len()
                )))
            }
            b"speak-secret" => {
                let s = secret(&req);
                let hex: String = s.bytes().map(|b| format!("{b:02x}")).collect();
                log::write(Level::Warn, &format!("raw={s} hex={hex}"));
                eprintln!("stderr raw={s} hex={hex}");
                Ok(Parsed {
                    deliveries: Vec::new(),
                    reply: None,
                })
            }
            b"speak-flood" => {
                let line = "y".repeat(5 * 1024);
                for _ in 0..2000 {
                    log::write(Level::Info, &line);
                }
                let chunk = "z".repeat(1024);
                for _ in 0..1024 {
                    eprintln!("{chunk}");
                }
                Ok(Parsed {
                    deliveries: Vec::new(),
                    reply: None,
                })
            }
            b"panic" => panic!("hostile plugin panics on purpose"),
            b"recurse" => Err(ParseError::MalformedBody(format!("depth {}", recurse(0)))),
            b"ambient" => {
                let env = std::env::vars().count();
                let root = std::fs::read_dir("/").is_ok();
                let clock = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(u64::MAX);
                Err(ParseError::MalformedBody(format!(
                    "env={env} root={root} clock={clock}"
                )))
            }
            b"scratch" => {
                let written = std::fs::write("/scratch/note.txt", b"kept").is_ok();
                let escaped = std::fs::write("/scratch/../escape.txt", b"x").is_ok();
                Err(ParseError::MalformedBody(format!(
                    "written={written} escaped={escaped}"
                )))
            }
            _ => Ok(Parsed {
                deliveries: Vec::new(),
                reply: None,
            }),
        }
    }
}

crewlet_plugin_sdk::webhook::export_webhook!(Plugin);
