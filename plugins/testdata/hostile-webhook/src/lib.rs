//! Test data: a webhook plugin whose `parse` misbehaves on request. The body
//! names the misbehaviour: `loop`, `allocate-1gib`, `panic`, `recurse`;
//! `ambient` reports what ambient authority it found (environment, root
//! directory, clock) and `scratch` writes a file to `/scratch`, each as a
//! parse error's text; anything else parses to zero deliveries.

use std::hint::black_box;

use crewlet_plugin_sdk::webhook::{Guest, ParseError, Parsed, Request, VerifyError};

struct Plugin;

#[inline(never)]
#[expect(unconditional_recursion, reason = "the point: overflow the stack")]
fn recurse(depth: u64) -> u64 {
    // Not a tail call: the addition after the call keeps every frame alive.
    black_box(recurse(black_box(depth + 1))) + 1
}

impl Guest for Plugin {
    fn verify(_req: Request) -> Result<(), VerifyError> {
        Ok(())
    }

    fn parse(req: Request) -> Result<Parsed, ParseError> {
        match req.body.as_slice() {
            b"loop" => {
                let mut n: u64 = 0;
                loop {
                    n = black_box(n.wrapping_add(1));
                }
            }
            b"allocate-1gib" => {
                let block = vec![1u8; 1 << 30];
                Err(ParseError::MalformedBody(format!(
                    "allocated {}",
                    black_box(block).len()
                )))
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
