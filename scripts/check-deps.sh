#!/usr/bin/env bash
# The dependency arrows ARCHITECTURE.md promises, checked on the build graph
# rather than the source: a crate that never names wasmtime can still build
# it through a dependency. Fails, naming the crate, the dependency and the
# path to it, when a crate's normal (non-dev) dependencies reach something
# it must stay free of. Reads Cargo.lock only: nothing is built.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# crate, then what it must never reach.
rules=(
    "crewlet-bus wasmtime axum rusqlite rmcp async-nats tokio"
    "crewlet-coord wasmtime axum rusqlite crewlet-statelog"
    "crewlet-seats wasmtime axum rusqlite rmcp crewlet-statelog"
    "crewlet-turns wasmtime axum rusqlite rmcp crewlet-statelog"
    "crewlet-schedule wasmtime axum rusqlite rmcp async-nats tokio"
    # The feature crates the node wires: no HTTP (their routes are
    # crewlet-api's), no plugin runtime, never the node itself.
    "crewlet-configplane wasmtime axum rmcp crewlet-plugins crewlet-node"
    "crewlet-history wasmtime axum rmcp crewlet-plugins crewlet-node"
    "crewlet-fleet wasmtime axum rmcp crewlet-plugins crewlet-node"
    "crewlet-tokens wasmtime axum rmcp rusqlite crewlet-plugins crewlet-node"
    "crewlet-estate wasmtime axum rmcp crewlet-api crewlet-plugins crewlet-node"
    # The duties: the model layer through the turns' port, never the
    # plugin runtime or the model crate that loads it.
    "crewlet-duties wasmtime axum rmcp crewlet-plugins crewlet-models crewlet-node"
    # The operator's MCP catalogue: rmcp's own HTTP service, mounted by the
    # api; it never builds axum or the node.
    "crewlet-operator axum crewlet-api crewlet-node"
    # Memory rides the broker into the store: no HTTP, no plugins, never
    # the seats or the turns it serves.
    "crewlet-memory wasmtime axum rmcp crewlet-plugins crewlet-node crewlet-seats crewlet-turns"
    # The turns' memory ports over the store: no HTTP, no plugins, never
    # the node or the state log.
    "crewlet-recall wasmtime axum rmcp crewlet-plugins crewlet-node crewlet-statelog"
    # The state log and its estate: no HTTP, no plugins, never the node,
    # the seats or the turns (they stay free of it, the rows above).
    "crewlet-statelog wasmtime axum rmcp crewlet-plugins crewlet-node crewlet-seats crewlet-turns crewlet-store"
    # The plugin host stays free of HTTP, the stream crate and the event
    # log; the node's plugins at work (catalog) of HTTP and the node.
    "crewlet-plugins axum rmcp rusqlite crewlet-stream crewlet-observe crewlet-node"
    "crewlet-catalog axum rmcp crewlet-api crewlet-stream crewlet-node"
    # The company chat reaches the node through its ChatNode port: never
    # the node, the seats, the turns or the MCP servers that call it.
    "crewlet-chat rmcp crewlet-mcp crewlet-seats crewlet-turns crewlet-catalog crewlet-node"
    # The HTTP surface reads the node through traits: no NATS, no SQLite.
    "crewlet-api wasmtime async-nats rusqlite rmcp crewlet-node"
    # The webhook edge answers in the HTTP crate's terms: no axum, no api.
    "crewlet-ingress axum crewlet-api"
)

failed=0
for rule in "${rules[@]}"; do
    read -r crate forbidden <<<"$rule"
    tree="$(cargo tree --quiet -p "$crate" -e normal --target all --prefix none)"
    for dep in $forbidden; do
        if grep -q "^$dep v" <<<"$tree"; then
            echo "check-deps: $crate reaches $dep through its normal dependencies, which ARCHITECTURE.md rules out; drop the dependency that brings it in (path below) or move what needs it to another crate:" >&2
            cargo tree --quiet -p "$crate" -e normal --target all -i "$dep" >&2
            failed=1
        fi
    done
done
if [[ $failed -ne 0 ]]; then
    exit 1
fi
echo "check-deps: bus, coord, seats, turns, schedule, ingress, memory, recall, statelog, the duties, the estate, the plugin host, the catalog, the feature crates, the operator catalogue, the chat and the HTTP surface stay free of what they must not reach"
