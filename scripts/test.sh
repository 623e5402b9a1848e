#!/usr/bin/env bash
# Every test of the workspace, two binaries at a time: two lanes take the
# test binaries from one queue. The end-to-end binary (`tests/e2e`, the
# longest, whose tests mostly wait on child processes — nodes,
# nats-servers, browsers) is queued first as two halves, one per lane (its
# tests listed by name and dealt alternately, each half run with
# `--exact` and its names), so both lanes wait on it together and then
# share the rest; whole, it held one lane for ~650 s while the other ran
# out of binaries. Each binary runs in its package's directory, as under
# `cargo test`, and its output is printed whole when it ends. Exit status 1
# if any binary (or half) failed; every one runs. The doctests run first,
# in one cargo call (its count printed).
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

# run DIR EXE LOG [NAMES]: one binary (with a names file, only those tests,
# by exact name), its status appended to the log's .rc file.
run() {
    local dir="$1" exe="$2" log="$3" names="${4:-}" rc=0
    local args=()
    [[ -z "$names" ]] || mapfile -t args < <(echo --exact; cat "$names")
    (cd "$dir" && CARGO_MANIFEST_DIR="$dir" "$exe" "${args[@]}") >"$log" 2>&1 || rc=$?
    echo "$rc" >"$log.rc"
}

# e2e's halves: its tests by name (ignored ones too: named, they are still
# reported ignored), dealt alternately so each half holds some of every
# module. A list that cannot be read leaves e2e whole.
e2e="$(grep -E '/deps/e2e-[0-9a-f]+$' "$work/binaries" || true)"
halves=()
if [[ -n "$e2e" ]]; then
    IFS=$'\t' read -r e2e_dir e2e_exe <<<"$e2e"
    if (cd "$e2e_dir" && "$e2e_exe" --list --format terse) 2>/dev/null |
        sed -n 's/^\(.*\): test$/\1/p' | sort >"$work/e2e.names" &&
        [[ -s "$work/e2e.names" ]]; then
        awk 'NR % 2 == 1' "$work/e2e.names" >"$work/e2e.1.names"
        awk 'NR % 2 == 0' "$work/e2e.names" >"$work/e2e.2.names"
        halves=("$work/e2e.1.names" "$work/e2e.2.names")
    else
        halves=("")
    fi
fi

# The queue: one numbered line per binary (its directory, its executable,
# a names file or nothing), e2e's halves first. A lane takes the next line
# under a lock, and prints a finished binary's log under it.
{
    for h in ${halves[@]+"${halves[@]}"}; do
        printf '%s\t%s\n' "$e2e" "$h"
    done
    grep -vE '/deps/e2e-[0-9a-f]+$' "$work/binaries" | sed 's/$/\t/' || true
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
        IFS=$'\t' read -r _ dir exe names < <(sed -n "${n}p" "$work/queue")
        run "$dir" "$exe" "$work/$n.log" "$names"
        {
            flock 9
            rel="${dir#"$ROOT"}"
            rel="${rel#/}"
            echo "     Running $(basename "$exe")${names:+ ($(basename "$names" .names))} (in ${rel:-.})"
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
while IFS=$'\t' read -r n _ exe names; do
    [[ "$(cat "$work/$n.log.rc" 2>/dev/null)" == 0 ]] || failed+=("$(basename "$exe")${names:+ ($(basename "$names" .names))}")
done <"$work/queue"

[[ $doc_rc -eq 0 ]] || failed+=("doctests")
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "test: ${#failed[@]} binary(ies) failed: ${failed[*]}" >&2
    exit 1
fi
echo "test: every test binary passed"
