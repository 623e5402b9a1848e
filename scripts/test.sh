#!/usr/bin/env bash
# Every test of the workspace, on two lanes: the end-to-end binary
# (`tests/e2e`, whose tests mostly wait on child processes — nodes,
# nats-servers, browsers) runs beside the other binaries, which run one
# after another as `cargo test` would run them. Each binary runs in its
# package's directory, as under `cargo test`, and its output is printed
# whole when it ends. Exit status 1 if any binary failed; every binary runs.
#
# With arguments it is plain `cargo test --workspace --no-fail-fast ARGS`
# (to pick tests, or pass flags to the harness after `--`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

if [[ $# -gt 0 ]]; then
    exec cargo test --workspace --no-fail-fast "$@"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Every target (benches and examples too, so a lint run riding on this
# build — .ci/run — covers what `cargo clippy --all-targets` would).
cargo test --workspace --all-targets --no-run --message-format=json-render-diagnostics >"$work/build.json"
# Tests run without the lint wrapper: a cargo they start builds as usual.
unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS
# One line per test binary (benches are built, never run here): its package
# directory, then its executable.
python3 - "$work/build.json" >"$work/binaries" <<'EOF'
import json, os, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or "bench" in m.get("target", {}).get("kind", []):
        continue
    if m.get("profile", {}).get("test") and m.get("executable"):
        print(os.path.dirname(m["manifest_path"]) + "\t" + m["executable"])
EOF

# run DIR EXE LOG: one binary, its status appended to the log's .rc file.
run() {
    local dir="$1" exe="$2" log="$3" rc=0
    (cd "$dir" && CARGO_MANIFEST_DIR="$dir" "$exe") >"$log" 2>&1 || rc=$?
    echo "$rc" >"$log.rc"
}

e2e_line="$(grep -E '/deps/e2e-[0-9a-f]+$' "$work/binaries" || true)"
lane_a=""
if [[ -n "$e2e_line" ]]; then
    run "${e2e_line%%$'\t'*}" "${e2e_line#*$'\t'}" "$work/e2e.log" &
    lane_a=$!
fi

failed=()
n=0
while IFS=$'\t' read -r dir exe; do
    [[ "$exe" == "${e2e_line#*$'\t'}" ]] && continue
    n=$((n + 1))
    log="$work/$n.log"
    echo "     Running $(basename "$exe") (in ${dir#"$ROOT"/})"
    run "$dir" "$exe" "$log"
    cat "$log"
    [[ "$(cat "$log.rc")" == 0 ]] || failed+=("$(basename "$exe")")
done <"$work/binaries"

if [[ -n "$lane_a" ]]; then
    wait "$lane_a" || true
    echo "     Running $(basename "${e2e_line#*$'\t'}") (the end-to-end tests)"
    cat "$work/e2e.log"
    [[ "$(cat "$work/e2e.log.rc")" == 0 ]] || failed+=("$(basename "${e2e_line#*$'\t'}")")
fi

if [[ ${#failed[@]} -gt 0 ]]; then
    echo "test: ${#failed[@]} binary(ies) failed: ${failed[*]}" >&2
    exit 1
fi
echo "test: every test binary passed"
