#!/usr/bin/env bash
# Soak: mixed traffic (API keys, JWTs, logins, refreshes, revocations,
# WebSockets) through a real keygate for a bounded time; see tests/soak.py.
#
#   tests/soak.sh [SECONDS]      default 600 (10 minutes); CI runs 60
#
# Uses the debug binaries `cargo test` builds unless KEYGATE_BIN and
# ENTITY_SERVICE_BIN name others (e.g. target/release/...).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-600}"
if [ -z "${KEYGATE_BIN:-}" ]; then
  cargo build --locked --quiet --bin keygate --example entity_service
fi
venv=target/venv-clients
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/clients/requirements.txt
exec "$venv/bin/python" tests/soak.py "$seconds"
