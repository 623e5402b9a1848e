//! Host-side bindings of the three worlds in `wit/plugin.wit`.
//!
//! The `log` interface is generated once (with the module world) and shared
//! by the other two, so one implementation serves all three
//! ([`crate::voice`]).

/// The `webhook` world; its imports are `crypto`, pure (see
/// [`crate::webhook`]), and `log`.
pub mod webhook {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "crewlet:plugin/webhook",
        imports: { default: async },
        exports: { default: async },
        additional_derives: [PartialEq, Eq],
        with: {
            "crewlet:plugin/log": crate::bindings::module::crewlet::plugin::log,
        },
    });
}

/// The `provider` world; its import `wasi:http` is served by
/// `wasmtime-wasi-http`, `log` by [`crate::voice`].
pub mod provider {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "crewlet:plugin/provider",
        imports: { default: async | trappable },
        exports: { default: async },
        // Not `Eq`: embeddings carry `f32`s.
        additional_derives: [PartialEq],
        with: {
            "wasi:http": wasmtime_wasi_http::p2::bindings::http,
            "wasi:io": wasmtime_wasi::p2::bindings::io,
            "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
            "crewlet:plugin/log": crate::bindings::module::crewlet::plugin::log,
        },
    });
}

/// The `module` world: `state` and `bus` are served by the module runtime,
/// `log` by [`crate::voice`].
pub mod module {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "crewlet:plugin/module",
        imports: { default: async },
        exports: { default: async },
        additional_derives: [PartialEq, Eq],
    });
}
