#!/usr/bin/env bash
# Scans keygate's HTTPS listener with testssl.sh, on the default TLS settings
# (no certificate configured: the generated development certificate).
#
#   tests/tls_scan.sh            builds target/debug/keygate if needed
#   KEYGATE_BIN=... tests/tls_scan.sh
#
# Fails when testssl.sh rates any protocol, cipher, server preference or
# vulnerability finding above INFO. Findings about the certificate itself
# (self-signed chain, no CRL/OCSP, validity) and HTTP headers are printed, not
# failed: they describe the development certificate, which production
# replaces with its own. Takes about three minutes; prints one summary line.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v testssl >/dev/null 2>&1 && ! command -v testssl.sh >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends testssl.sh >/dev/null
fi
testssl_cmd="$(command -v testssl || command -v testssl.sh)"

bin="${KEYGATE_BIN:-target/debug/keygate}"
if [ -z "${KEYGATE_BIN:-}" ]; then
  cargo build --locked --quiet --bin keygate
fi

work="$(mktemp -d)"
pid=""
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/keygate.toml" <<TOML
[server]
data_dir = "$work"
[listen]
https = "127.0.0.1:0"
http = "127.0.0.1:0"
admin = "127.0.0.1:0"
[store]
url = "sqlite://$work/keygate.db"
TOML

# KEYGATE_BIN names this script's binary, not a setting: keygate would refuse
# it as an unknown KEYGATE_* override.
env -u KEYGATE_BIN KEYGATE_BOOTSTRAP_PASSWORD="tls-scan-$(date +%s%N)" RUST_LOG=warn,keygate::server=info \
  "$bin" --config "$work/keygate.toml" --log-format json serve >"$work/keygate.log" 2>&1 &
pid=$!
port=""
for _ in $(seq 1 300); do
  port="$(sed -n 's/.*"https":"127\.0\.0\.1:\([0-9]*\)".*/\1/p' "$work/keygate.log" | head -1)"
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/keygate.log"; echo "tls scan: keygate did not start" >&2; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "tls scan: keygate did not report its HTTPS port" >&2; exit 1; }

"$testssl_cmd" --quiet --color 0 --warnings off --jsonfile "$work/scan.json" \
  "127.0.0.1:$port" >"$work/scan.txt" 2>&1 || true

python3 - "$work/scan.json" <<'PY'
import json, sys

findings = json.load(open(sys.argv[1]))
if isinstance(findings, dict):
    findings = [f for section in findings.get("scanResult", [{}])[0].values()
                if isinstance(section, list) for f in section]
# Warnings about the scanner's own openssl, not about the server: this one
# says the local openssl cannot test GOST ciphers (which keygate never offers).
SCANNER_NOTES = {"engine_problem"}
weak, noted, checked = [], [], 0
for f in findings:
    severity, ident = f.get("severity", ""), f.get("id", "")
    if ident in SCANNER_NOTES:
        print(f"  scanner {ident}: {severity} {f.get('finding', '')}")
        continue
    if severity in ("DEBUG", "WARN") or ident.startswith("scanProblem"):
        if severity == "WARN" or ident.startswith("scanProblem"):
            weak.append(f)
        continue
    checked += 1
    if severity in ("OK", "INFO"):
        continue
    about_the_certificate = ident.startswith(("cert_", "DNS_CAA", "OCSP", "chain_of_trust"))
    about_headers = ident in ("HSTS", "HPKP", "banner_server", "cookie_count")
    (noted if about_the_certificate or about_headers else weak).append(f)

for f in noted:
    print(f"  noted  {f['id']}: {f['severity']} {f['finding']}")
for f in weak:
    print(f"  WEAK   {f['id']}: {f['severity']} {f['finding']}")
verdict = "pass" if not weak else "FAIL"
print(f"tls scan: {verdict}: {checked} findings checked, {len(weak)} weak protocol/cipher/vulnerability findings, "
      f"{len(noted)} certificate or header notes")
sys.exit(1 if weak else 0)
PY
