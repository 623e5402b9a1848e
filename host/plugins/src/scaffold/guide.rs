//! What a new plugin ships to be used without reading crewlet's source: a
//! README with the commands that build, check and try it, a request for
//! `crewlet plugins try` that its own code accepts, and the toolchain pin.
//!
//! Rule: every name in them is the one the host uses — a module's tool is
//! written as a seat's model calls it (`MODULE__TOOL`, the tool's name as
//! the manifest spells it) — and the toolchain is crewlet's own
//! `rust-toolchain.toml` (the one its bootstrap installs, with the
//! `wasm32-wasip2` target), so a plugin built beside crewlet builds with
//! the compiler and target crewlet's plugins were tested with.

/// The repository's toolchain pin, as a new plugin gets it.
pub(super) fn rust_toolchain() -> String {
    format!(
        "# The toolchain crewlet's bootstrap installs (its own rust-toolchain.toml),\n# with the wasm32-wasip2 target a component is built for. rustup\n# installs it on the first cargo command in this folder.\n{}",
        include_str!("../../../../rust-toolchain.toml")
    )
}

const README_HEAD: &str = r#"# {{name}}

A crewlet {{kind}} plugin: a WASM component (`wasm32-wasip2`) that
crewlet loads from a plugins folder, made by `crewlet plugins new`.
`crewlet-sdk/` holds the guest SDK and the WIT it binds; the plugin's own
code is `src/lib.rs`, its permissions and limits are `plugin.toml`.

## Build, check, try

Run these in this folder. The toolchain is pinned in `rust-toolchain.toml`
(the one crewlet's bootstrap installs, with the `wasm32-wasip2` target);
rustup installs it on the first `cargo` command here.

```sh
cargo test                                    # the logic, natively
cargo build --release --target wasm32-wasip2  # the component plugin.toml names
crewlet plugins check .                       # manifest, world, limits
{{try}}
```

"#;

pub(super) const WEBHOOK_TRY: &str =
    "{{secret_env}}=t0k crewlet plugins try {{name}} --request try.json .";
pub(super) const PROVIDER_TRY: &str =
    "{{secret_env}}=sk-... crewlet plugins try {{name}} --request try.json .";
pub(super) const MODULE_TRY: &str = "crewlet plugins try {{name}} --request try.json .";

pub(super) const WEBHOOK_README: &str = r#"`try.json` is a request as the node would capture it (`[ingress]
record_refused` writes the same shape): the route, the headers, the body
in base64. `plugins try` runs verify and parse on it, offline, with the
secret `{{secret}}_token` read from the environment by its name
upper-cased, and prints what the plugin made of it.

## Use it

Put this folder (or one holding it) on `crewlet run --plugins`, name the
secret in the company document and give it a value
(`crewlet secrets set {{secret}}_token`):

```toml
[integrations.{{name}}]
plugin = "{{name}}"
secret = "{{secret}}_token"
```

Senders post to `/webhooks/{{name}}` with the header `x-{{name}}-token`.
"#;

pub(super) const PROVIDER_README: &str = r#"`try.json` is one completion request (`model`, `messages`, `tools`,
`options`, `api_key_env`); `plugins try` makes that one call through the
plugin and prints the answer or the classified error. Point `base_url`
and `allowed_outbound_hosts` in `plugin.toml` at the vendor first: the
call goes nowhere else.

## Use it

Put this folder (or one holding it) on `crewlet run --plugins` and name
it in a role's model chain:

```toml
executor = [{ provider = "{{name}}", model = "MODEL", credentials = "${{{secret_env}}}" }]
```
"#;

pub(super) const MODULE_README: &str = r#"`try.json` is one tool call (`{"tool": {"name", "arguments"}}`; an event
is `{"event": {"kind", "payload"}}`), run on empty state of the module's
own, with what it published and wrote printed.

## Use it

Put this folder (or one holding it) on `crewlet run --plugins` and list
the module in a role:

```toml
[roles.engineer]
modules = ["{{name}}"]
```

A seat of that role finds the module beside its MCP servers and calls its
tool as `{{name}}__add-note` (`MODULE__TOOL`, the tool's name as
`plugin.toml` spells it) after `activate_tool`.
"#;

pub(super) const WEBHOOK_REQUEST: &str = r#"{
  "route": "/webhooks/{{name}}",
  "headers": [
    ["x-{{name}}-token", "t0k"],
    ["x-request-id", "try-1"]
  ],
  "body_base64": "aGVsbG8=",
  "received_unix": 0
}
"#;

pub(super) const PROVIDER_REQUEST: &str = r#"{
  "model": "example-model",
  "messages": [{ "role": "user", "content": "Say hello." }],
  "api_key_env": "{{secret_env}}"
}
"#;

pub(super) const MODULE_REQUEST: &str = r#"{
  "tool": { "name": "add-note", "arguments": { "key": "k1", "text": "remember" } }
}
"#;

/// The README of a plugin, its `try` line filled in.
pub(super) fn readme(try_line: &str, tail: &str) -> String {
    format!("{}{tail}", README_HEAD.replace("{{try}}", try_line))
}
