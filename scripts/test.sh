#!/usr/bin/env bash
# Every test of the workspace, two binaries at a time: two lanes take the
# test binaries from one queue, the end-to-end binary (`tests/e2e`, the
# longest, whose tests mostly wait on child processes — nodes,
# nats-servers, browsers) first, so the lane that ran it joins the rest
# when it ends instead of idling (with e2e alone on one lane and every
# other binary on the other, that lane ended minutes after e2e on a 2-core
# CI run). Each binary runs in its package's directory, as under `cargo
# test`, and its output is printed whole when it ends. Exit status 1 if any
# binary failed; every binary runs. The doctests run first, in one cargo
# call (its count printed).
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
# The examples in the crates' docs are tests too: rustdoc compiles them
# against the libraries just built (before the lint wrapper is dropped, so
# nothing is built again) and runs them. Their count is printed, so a run's
# output shows how many ran; a failing one fails the run like a binary.
doc_rc=0
cargo test --workspace --doc --no-fail-fast >"$work/doctests.log" 2>&1 || doc_rc=$?
doctests="$(sed -n 's/^test result: [a-zA-Z]*\. \([0-9]*\) passed.*/\1/p' "$work/doctests.log" | awk '{n += $1} END {print n + 0}')"
if [[ $doc_rc -ne 0 ]]; then
    cat "$work/doctests.log"
fi
echo "test: $doctests doctests passed"

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

# The queue: one numbered line per binary, e2e first. A lane takes the
# next line under a lock, and prints a finished binary's log under it.
{
    grep -E '/deps/e2e-[0-9a-f]+$' "$work/binaries" || true
    grep -vE '/deps/e2e-[0-9a-f]+$' "$work/binaries" || true
} | nl -ba -w1 -s$'\t' >"$work/queue"
: >"$work/taken"

lane() {
    local n dir exe rel
    while true; do
        {
            flock 9
            n=$(($(wc -l <"$work/taken") + 1))
            if [[ $n -le $(wc -l <"$work/queue") ]]; then echo "$n" >>"$work/taken"; else n=0; fi
        } 9>"$work/queue.lock"
        [[ $n -gt 0 ]] || return 0
        IFS=$'\t' read -r _ dir exe < <(sed -n "${n}p" "$work/queue")
        run "$dir" "$exe" "$work/$n.log"
        {
            flock 9
            rel="${dir#"$ROOT"}"
            rel="${rel#/}"
            echo "     Running $(basename "$exe") (in ${rel:-.})"
            cat "$work/$n.log"
        } 9>"$work/print.lock"
    done
}

lane &
first=$!
lane &
second=$!
wait "$first" "$second" || true

failed=()
while IFS=$'\t' read -r n _ exe; do
    [[ "$(cat "$work/$n.log.rc" 2>/dev/null)" == 0 ]] || failed+=("$(basename "$exe")")
done <"$work/queue"

[[ $doc_rc -eq 0 ]] || failed+=("doctests")
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "test: ${#failed[@]} binary(ies) failed: ${failed[*]}" >&2
    exit 1
fi
echo "test: every test binary passed"
