#!/usr/bin/env python3
"""Fails when a dashboard panel or an alert asks for a series keygate does not
export.

Starts a real keygate (its HTTPS, HTTP and admin listeners on free loopback
ports, a throw-away data directory, the given store and Redis, one public
route to a small upstream started here), sends one proxied request so the
request and upstream histograms exist and one that the client abandons so
the client-abort count exists, scrapes the admin listener's /metrics,
stops everything it started, and compares every metric name used in the
PromQL expressions of the given files (a Grafana dashboard's "expr" fields, a
PrometheusRule's "expr" fields) with the sample names of that scrape
(histograms as _bucket, _sum and _count).

    deploy/metric_names.py --keygate target/debug/keygate \
        [--store-url postgres://...] [--redis-url redis://...] FILE...

Without --store-url the store is SQLite in the throw-away directory; the
series that exist only on PostgreSQL (keygate_revocation_listener_up) or with
Redis (keygate_redis_up, ...) are then missing from the scrape and reported.
"""

import argparse
import http.server
import json
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import yaml

# PromQL words that are not metric names: aggregations, keywords, functions
# taken without parentheses in the cleaned expression, and Grafana's own.
NOT_METRICS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
    "and", "or", "unless", "offset", "inf", "nan",
}


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\{?\w+\}?", " ", text)  # Grafana variables
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        name = match.group(0)
        following = text[match.end():].lstrip()
        if following.startswith("("):  # a function or an aggregation
            continue
        if name.lower() in NOT_METRICS:
            continue
        # A number's exponent (1e3) is not a name.
        if match.start() > 0 and text[match.start() - 1].isdigit():
            continue
        names.add(name)
    return names


def self_test() -> None:
    cases = {
        'sum by (route, status) (rate(keygate_requests_total{job=~"$job"}[$__rate_interval]))':
            {"keygate_requests_total"},
        "histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m]))) / on (x) group_left b":
            {"a_bucket", "b"},
        "keygate_tls_certificate_expiry_timestamp_seconds - time() < 14 * 86400":
            {"keygate_tls_certificate_expiry_timestamp_seconds"},
        'increase(c_total{outcome="failure, by (x)"}[15m]) > 0 unless d == bool 1e3':
            {"c_total", "d"},
    }
    for expr, expected in cases.items():
        got = metric_names(expr)
        if got != expected:
            sys.exit(f"metric_names self-test: {expr!r} gave {sorted(got)}, expected {sorted(expected)}")


def expressions(path: Path) -> list[str]:
    """Every "expr" in a JSON or YAML document, at any depth."""
    text = path.read_text()
    document = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    found = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "expr" and isinstance(value, str):
                    found.append(value)
                elif key == "definition" and isinstance(value, str):
                    # A Grafana variable: label_values(metric{...}, label).
                    found.extend(re.findall(r"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)", value))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(document)
    return found


class Upstream(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (the handler's name)
        if self.path.endswith("/slow"):
            # Long enough for the client to hang up while keygate waits.
            time.sleep(2)
        body = b'{"ok":true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def read_port(log: Path, listener: str, deadline: float, process) -> int:
    pattern = re.compile(rf'"{listener}":"127\.0\.0\.1:(\d+)"')
    while time.monotonic() < deadline:
        match = pattern.search(log.read_text())
        if match:
            return int(match.group(1))
        if process.poll() is not None:
            sys.exit(f"keygate exited with {process.returncode} before listening:\n{log.read_text()}")
        time.sleep(0.1)
    sys.exit(f"keygate did not report its {listener} listener within 60 s:\n{log.read_text()}")


def scrape(keygate: str, store_url: str | None, redis_url: str | None) -> set[str]:
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    workdir = Path(tempfile.mkdtemp(prefix="keygate-metric-names-"))
    config = workdir / "keygate.toml"
    store = store_url or f"sqlite://{workdir}/keygate.db"
    redis = f'[redis]\nurl = "{redis_url}"\n' if redis_url else ""
    config.write_text(
        f"""
[server]
data_dir = "{workdir}"
[listen]
https = "127.0.0.1:0"
http = "127.0.0.1:0"
admin = "127.0.0.1:0"
[store]
url = "{store}"
{redis}
[[route]]
name = "noauth"
prefix = "/api/noauth/"
upstreams = ["http://127.0.0.1:{upstream.server_address[1]}"]
public = true
"""
    )
    log = workdir / "keygate.log"
    env = {"PATH": "/usr/bin:/bin", "RUST_LOG": "info", "KEYGATE_BOOTSTRAP_PASSWORD": "metric-names-check"}
    with open(log, "w") as out:
        process = subprocess.Popen(
            [keygate, "--config", str(config), "--log-format", "json", "serve"],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )
    try:
        deadline = time.monotonic() + 60
        https = read_port(log, "https", deadline, process)
        admin = read_port(log, "admin", deadline, process)
        unverified = ssl.create_default_context()
        unverified.check_hostname = False
        unverified.verify_mode = ssl.CERT_NONE
        with urllib.request.urlopen(
            f"https://127.0.0.1:{https}/api/noauth/devices", context=unverified, timeout=10
        ) as response:
            if response.status != 200:
                sys.exit(f"the proxied request answered {response.status}")
        # A client that hangs up while the upstream is asked: the client-abort
        # series appears with its first count.
        with socket.create_connection(("127.0.0.1", https), timeout=10) as raw:
            with unverified.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(b"GET /api/noauth/slow HTTP/1.1\r\nHost: localhost\r\n\r\n")
                time.sleep(0.5)
        wait_until = time.monotonic() + 10
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=10) as response:
                text = response.read().decode()
            if "keygate_client_aborts_total{" in text or time.monotonic() > wait_until:
                break
            time.sleep(0.2)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        upstream.shutdown()
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            names.add(re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0))
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keygate", required=True)
    parser.add_argument("--store-url")
    parser.add_argument("--redis-url")
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args()
    self_test()

    used: dict[str, set[str]] = {}
    for path in args.files:
        exprs = expressions(path)
        if not exprs:
            sys.exit(f"{path}: no PromQL expression found")
        for expr in exprs:
            for name in metric_names(expr):
                used.setdefault(name, set()).add(str(path))

    exported = scrape(args.keygate, args.store_url, args.redis_url)
    missing = sorted(name for name in used if name not in exported)
    print(f"metric names: {len(used)} used in {len(args.files)} files, "
          f"{len(exported)} sample names in the scrape")
    if missing:
        for name in missing:
            print(f"  not exported: {name} (used in {', '.join(sorted(used[name]))})", file=sys.stderr)
        if not (args.store_url and args.redis_url):
            print("  (series that exist only on PostgreSQL or with Redis need --store-url and --redis-url)",
                  file=sys.stderr)
        sys.exit(1)
    unused = sorted(
        n for n in exported
        if n.startswith("keygate_") and n not in used
        and not any(n.endswith(s) and n[: -len(s)] + "_bucket" in used for s in ("_sum", "_count"))
    )
    print(f"every name is exported; exported but on no panel or alert: {', '.join(unused) or 'none'}")


if __name__ == "__main__":
    main()
