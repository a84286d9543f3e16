"""Starts the reference entity service and a keygate server (the binaries that
`cargo test` builds) on free loopback ports, with a short access-token lifetime.

keygate serves the development certificate, signed by its own private CA
(`dev-ca.pem` in the data dir). No test inherits a trusted CA from the
environment: each one gives its client exactly what the table in
docs/deploying.md ("Clients and a private certificate authority") says that
client needs, so each row of the table is tested."""

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KEYGATE = Path(os.environ.get("KEYGATE_BIN", ROOT / "target/debug/keygate"))
ENTITY_SERVICE = Path(os.environ.get("ENTITY_SERVICE_BIN", ROOT / "target/debug/examples/entity_service"))
ADMIN_PASSWORD = "bootstrap-password"
TENANT_EMAIL = "tenant@example.com"
TENANT_PASSWORD = "tenant-password"
TWO_FACTOR_EMAIL = "second-factor@example.com"
TWO_FACTOR_PASSWORD = "second-factor-password"
TENANT_ID = "5f1c0c9e-1d2a-4c3b-9e8f-0a1b2c3d4e5f"
ACCESS_TTL = 60
# Where OpenSSL (and so Python's ssl module), httpx, requests and curl look for
# trusted CAs besides their built-in defaults.
TRUST_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


def _read_line(stream, pattern, deadline):
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            time.sleep(0.05)
            continue
        match = re.search(pattern, line)
        if match:
            return match
    raise TimeoutError(f"no line matching {pattern!r}")


class Keygate:
    def __init__(self, workdir: Path, upstream: str):
        self.workdir = workdir
        self.config = workdir / "keygate.toml"
        self.config.write_text(
            f"""
[server]
data_dir = "{workdir}"
[listen]
https = "127.0.0.1:0"
http = "127.0.0.1:0"
admin = "127.0.0.1:0"
[store]
url = "sqlite://{workdir}/keygate.db"
[[route]]
prefix = "/api/"
upstreams = ["{upstream}"]
"""
        )
        self.env = dict(
            os.environ,
            KEYGATE_BOOTSTRAP_PASSWORD=ADMIN_PASSWORD,
            JWT_TOKEN_EXPIRATION_TIME=str(ACCESS_TTL),
            JWT_REFRESH_TOKEN_EXPIRATION_TIME="900",
            RUST_LOG="info",
        )
        self.env.pop("KEYGATE_CONFIG", None)

    def cli(self, *args, stdin=""):
        return subprocess.run(
            [KEYGATE, "--config", self.config, *args],
            input=stdin, capture_output=True, text=True, env=self.env, timeout=60, check=True,
        )

    def start(self):
        self.log = open(self.workdir / "keygate.log", "w+")
        self.process = subprocess.Popen(
            [KEYGATE, "--config", self.config, "--log-format", "json", "serve"],
            stdout=self.log, stderr=subprocess.STDOUT, env=self.env,
        )
        reader = open(self.workdir / "keygate.log")
        match = _read_line(reader, r'"https":"127\.0\.0\.1:(\d+)"', time.monotonic() + 60)
        self.port = int(match.group(1))
        self.base_url = f"https://localhost:{self.port}"
        self.ca = str(self.workdir / "dev-ca.pem")

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()


@pytest.fixture(scope="session")
def gateway():
    workdir = Path(tempfile.mkdtemp(prefix="keygate-clients-"))
    upstream = subprocess.Popen(
        [ENTITY_SERVICE, "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True
    )
    try:
        match = _read_line(upstream.stdout, r"listening on (\S+)", time.monotonic() + 30)
        keygate = Keygate(workdir, f"http://{match.group(1)}")
        # The server makes the store; management commands never create one.
        keygate.start()
        keygate.cli(
            "user", "add", "--email", TENANT_EMAIL, "--authority", "TENANT_ADMIN",
            "--tenant-id", TENANT_ID, "--first-name", "Tess",
            stdin=TENANT_PASSWORD + "\n",
        )
        keygate.api_key = keygate.cli("apikey", "create", "--email", TENANT_EMAIL).stdout.splitlines()[-1]
        keygate.cli(
            "user", "add", "--email", TWO_FACTOR_EMAIL, "--authority", "TENANT_ADMIN",
            "--tenant-id", TENANT_ID, stdin=TWO_FACTOR_PASSWORD + "\n",
        )
        yield keygate
        keygate.stop()
        log = (workdir / "keygate.log").read_text()
        assert TENANT_PASSWORD not in log and keygate.api_key not in log, "a secret reached the log"
    finally:
        upstream.terminate()
        upstream.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_inherited_trust(monkeypatch):
    """Unsets every trust variable the machine may set (in-process and for the
    processes a test starts); a test sets back only what its client needs."""
    for name in TRUST_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def requests_trusts_keygate(gateway, monkeypatch):
    """`requests` (tb-rest-client's password login and refresh) trusts
    keygate's CA: it reads REQUESTS_CA_BUNDLE, never the client's own
    `configuration.ssl_ca_cert`."""
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", gateway.ca)
