//! Host-side bindings of the three worlds in `wit/plugin.wit`.

/// The `webhook` world; its only import, `crypto`, is pure (see
/// [`crate::webhook`]).
pub mod webhook {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "crewlet:plugin/webhook",
        exports: { default: async },
        additional_derives: [PartialEq, Eq],
    });
}

/// The `provider` world; its only import, `wasi:http`, is served by
/// `wasmtime-wasi-http`.
pub mod provider {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "crewlet:plugin/provider",
        imports: { default: async | trappable },
        exports: { default: async },
        additional_derives: [PartialEq, Eq],
        with: {
            "wasi:http": wasmtime_wasi_http::p2::bindings::http,
            "wasi:io": wasmtime_wasi::p2::bindings::io,
            "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
        },
    });
}

/// The `module` world: `state` and `log` are served by the module runtime.
pub mod module {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "crewlet:plugin/module",
        imports: { default: async },
        exports: { default: async },
        additional_derives: [PartialEq, Eq],
    });
}
