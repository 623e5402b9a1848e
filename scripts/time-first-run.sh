#!/usr/bin/env bash
# A newcomer's first run, timed (BENCHMARKS.md, "A newcomer's first run"):
# clone this repository's HEAD into an empty directory, `./dev run` there
# (bootstrap, the guest plugins, the release build, the node), wait for
# `/ready`, send `./dev sample`, and wait for the first reply in the example
# company's chat log. Prints the seconds to `/ready` and to the first reply.
# Needs port 7420 free; the crate registry and toolchain are whatever this
# machine has cached (say which when you quote the figure).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
clone="$(mktemp -d)/crewlet"
git clone -q "$ROOT" "$clone"
cd "$clone"
log="$clone.run.log"
t0=$(date +%s)
./dev run >"$log" 2>&1 &
node=$!
trap 'kill -TERM "$node" 2>/dev/null || true; pkill -TERM -f "$clone/target/release/crewlet run" || true' EXIT
until curl -sf http://127.0.0.1:7420/ready >/dev/null 2>&1; do
    kill -0 "$node" 2>/dev/null || { echo "time-first-run: ./dev run ended; see $log" >&2; exit 1; }
    sleep 2
done
t1=$(date +%s)
echo "clone -> /ready: $((t1 - t0)) s"
./dev sample
until [[ -s crewlet-data/chat.jsonl ]]; do sleep 1; done
t2=$(date +%s)
echo "clone -> first reply: $((t2 - t0)) s (sample -> reply $((t2 - t1)) s); log: $log"
