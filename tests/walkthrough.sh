#!/usr/bin/env bash
# Runs README's "Walk-through with curl" block as written, in a scratch folder
# that sees the repository (and its target/) but keeps its own data/, so it
# starts from an empty store like a fresh clone. Fails on the first failing
# step, when a step's output is not what README shows, or after 10 minutes.
#
# With CI=true the release build is swapped for the debug binaries the test
# command already made (target/debug instead of target/release). They are
# built with the dev-dependencies' features, as `cargo test` builds them:
# `cargo build --bin keygate` alone would choose other features and rebuild
# much of the tree, so the CI build names the example as the test build does.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"

for port in 8443 8080 9090 9000; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "walkthrough: port $port is taken; the walk-through needs 8443, 8080, 9090 and 9000" >&2
    exit 1
  fi
done

block="$(sed -n '/<!-- walkthrough:begin -->/,/<!-- walkthrough:end -->/p' "$repo/README.md" \
  | sed '1,2d;$d' | sed '$d')"
if [ -z "$block" ]; then
  echo "walkthrough: README.md has no walkthrough block" >&2
  exit 1
fi
if [ "${CI:-}" = "true" ]; then
  block="$(printf '%s\n' "$block" \
    | sed -e 's#cargo build --release --bin keygate$#cargo build --bin keygate --example entity_service#' \
          -e 's#target/release/#target/debug/#g')"
fi

scratch="$(mktemp -d)"
out="$scratch.out"
script="$scratch.sh"
group=""
cleanup() {
  # The block runs in a process group of its own: whatever it left running
  # (after a failed step) goes with it.
  if [ -n "$group" ]; then kill -- "-$group" 2>/dev/null || true; fi
  rm -rf "$scratch" "$out" "$script"
}
trap cleanup EXIT
for entry in "$repo"/* ; do
  name="$(basename "$entry")"
  case "$name" in data | walkthrough-data) continue ;; esac
  ln -s "$entry" "$scratch/$name"
done
printf '%s\n' "$block" > "$script"

cd "$scratch"
setsid bash -e -o pipefail "$script" > "$out" 2>&1 < /dev/null &
group=$!
# The watchdog's sleep goes with it: left behind, it would hold this
# script's stdout open for the rest of the 10 minutes.
(
  sleep 600 &
  nap=$!
  trap 'kill "$nap" 2>/dev/null; exit 0' TERM
  wait "$nap"
  kill -- "-$group" 2>/dev/null
) &
watchdog=$!
if wait "$group"; then status=0; else status=$?; fi
kill "$watchdog" 2>/dev/null || true
cat "$out"
if [ "$status" -ne 0 ]; then
  echo "walkthrough: a step failed (exit $status; output above)" >&2
  exit 1
fi

expect() {
  if ! grep -q -- "$1" "$out"; then
    echo "walkthrough: expected to see: $1" >&2
    exit 1
  fi
}
expect '"name":"Thermostat A"'
expect '"totalElements":1'
expect 'HTTP/1.1 403 Forbidden'
expect 'API keys are accepted only over HTTPS'
expect 'disabled API key'
# The refusal, shown after the disable (step 6), over HTTP/2 or HTTP/1.1.
expect 'HTTP/[12.]* 401'
echo "walkthrough: every step worked"
