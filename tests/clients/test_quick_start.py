"""The platform's own clients through the quick start of
docs/in-front-of-the-platform.md: a PostgreSQL schema laid out as the
platform's (the DDL of tests/quick_start.rs, which a test there compares with
the platform's declared columns), filled as the platform fills it; keygate
with the documented config (config/front-of-platform.toml completed as the
doc says), `keygate import platform`, then `keygate serve` with the sync on,
in front of a stand-in of the platform that takes only a token signed with
the platform's signing key. `tb-rest-client` logs in with a platform
password and with a platform key and reads the current user; `tb` (the
platform's CLI) logs in both ways and lists users, which keygate forwards to
the platform while the sync is on.

Needs PostgreSQL (KEYGATE_TEST_DATABASE_URL, which CI sets); skipped without
it outside CI, failed without it in CI."""

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jwt
import pytest
from tb_rest_client.rest_client import RestClient

from conftest import KEYGATE, ROOT, _read_line

TB = Path(sys.executable).parent / "tb"
PASSWORD = "platform-Passw0rd!"
# The platform's bcrypt hash of PASSWORD ($2a$, cost 10), as it stores it.
PASSWORD_HASH = "$2a$10$QqJzIoIR9X2bOp1zFJwKAe2bTlNhJYQR4U1H3YHwmzKcOUWLH6J16"
SIGNING_KEY = "cXVpY2stc3RhcnQtY2xpZW50cy1zaWduaW5nLWtleS1vZi10aGUtcGxhdGZvcm0tMDEyMzQ1Njc4OWFiY2RlZiE="
NULL_UUID = "13814000-1dd2-11b2-8080-808080808080"
TENANT = str(uuid.uuid4())
CUSTOMER = str(uuid.uuid4())
ADMIN = str(uuid.uuid4())
CUSTOMER_USER = str(uuid.uuid4())
ADMIN_EMAIL = "tenant@platform.test"
CUSTOMER_EMAIL = "customer@platform.test"
API_KEY = f"tb_{uuid.uuid4().hex}"


def platform_ddl():
    """The platform's tables, from the one place they are written."""
    source = (ROOT / "tests/quick_start.rs").read_text()
    return re.search(r'const PLATFORM_DDL: &str = "(.*?)";', source, re.S).group(1)


def database_url():
    url = os.environ.get("KEYGATE_TEST_DATABASE_URL")
    if not url:
        if os.environ.get("CI") or os.environ.get("KEYGATE_TEST_REQUIRE_TOOLS"):
            pytest.fail("KEYGATE_TEST_DATABASE_URL is not set: this test needs PostgreSQL")
        pytest.skip("needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL")
    return url


def psql(url, sql):
    done = subprocess.run(
        ["psql", url, "-v", "ON_ERROR_STOP=1", "-q", "-At", "-c", sql],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def fill_platform(url):
    """Rows as the platform writes them: a tenant administrator and a customer
    user with bcrypt passwords, a `tb_` key, the `jwt` admin setting."""
    psql(url, platform_ddl())
    rows = [
        "INSERT INTO customer (id, created_time, tenant_id, title, is_public) "
        f"VALUES ('{CUSTOMER}', 1700000000000, '{TENANT}', 'Customer A', FALSE)",
    ]
    for user, email, authority, customer in (
        (ADMIN, ADMIN_EMAIL, "TENANT_ADMIN", NULL_UUID),
        (CUSTOMER_USER, CUSTOMER_EMAIL, "CUSTOMER_USER", CUSTOMER),
    ):
        rows.append(
            "INSERT INTO tb_user (id, created_time, additional_info, authority, customer_id, email, "
            f"first_name, last_name, tenant_id) VALUES ('{user}', 1700000000000, '{{\"lang\":\"en_US\"}}', "
            f"'{authority}', '{customer}', '{email}', 'First', 'Last', '{TENANT}')"
        )
        rows.append(
            "INSERT INTO user_credentials (id, created_time, enabled, password, user_id) "
            f"VALUES ('{uuid.uuid4()}', 1700000000000, TRUE, '{PASSWORD_HASH}', '{user}')"
        )
    rows.append(
        "INSERT INTO api_key (id, created_time, tenant_id, user_id, value, enabled, expiration_time, description) "
        f"VALUES ('{uuid.uuid4()}', 1700000000000, '{TENANT}', '{ADMIN}', '{API_KEY}', TRUE, 0, 'integration')"
    )
    jwt_settings = json.dumps({
        "tokenExpirationTime": 9000, "refreshTokenExpTime": 604800,
        "tokenIssuer": "platform.test", "tokenSigningKey": SIGNING_KEY,
    })
    rows.append(
        "INSERT INTO admin_settings (id, tenant_id, created_time, json_value, key) "
        f"VALUES ('{uuid.uuid4()}', '{NULL_UUID}', 1700000000000, '{jwt_settings}', 'jwt')"
    )
    psql(url, ";\n".join(rows))


class PlatformStandIn:
    """The platform's REST API as keygate reaches it: a request needs
    `X-Authorization: Bearer <token>` signed with the platform's key (HMAC,
    checked here with PyJWT, `exp` included); `/api/userInfos/all` answers, as
    the platform does for a TENANT_ADMIN, the tenant's users, read from the
    platform's database. Every request is recorded."""

    def __init__(self, url):
        self.url = url
        self.seen = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                header = self.headers.get("X-Authorization", "")
                stand_in.seen.append((self.path, header))
                try:
                    claims = jwt.decode(
                        header.removeprefix("Bearer "), base64.b64decode(SIGNING_KEY),
                        algorithms=["HS512", "HS384", "HS256"],
                    )
                except jwt.PyJWTError:
                    return self.answer(401, {"status": 401, "message": "Authentication failed",
                                             "errorCode": 10, "timestamp": int(time.time() * 1000)})
                if self.path.startswith("/api/userInfos/all") and claims["scopes"][0] == "TENANT_ADMIN":
                    return self.answer(200, stand_in.tenant_users(str(uuid.UUID(claims["tenantId"]))))
                self.answer(404, {"status": 404, "message": "Not found", "errorCode": 32,
                                  "timestamp": int(time.time() * 1000)})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def tenant_users(self, tenant):
        rows = psql(self.url, (
            "SELECT coalesce(json_agg(json_build_object("
            "'id', json_build_object('entityType', 'USER', 'id', id), 'createdTime', created_time, "
            "'tenantId', json_build_object('entityType', 'TENANT', 'id', tenant_id), "
            "'customerId', json_build_object('entityType', 'CUSTOMER', 'id', customer_id), "
            "'email', email, 'authority', authority, 'firstName', first_name, 'lastName', last_name, "
            "'phone', phone, 'name', email, 'additionalInfo', additional_info::json) ORDER BY email), '[]') "
            f"FROM tb_user WHERE tenant_id = '{tenant}'"
        ))
        users = json.loads(rows)
        return {"data": users, "totalPages": 1, "totalElements": len(users), "hasNext": False}

    def stop(self):
        self.server.shutdown()


def documented_config(workdir, platform_url):
    """config/front-of-platform.toml completed as the doc says."""
    text = (ROOT / "config/front-of-platform.toml").read_text()
    text = text.replace("http://platform:8080", platform_url)
    text = text.replace('https = "0.0.0.0:8443"', 'https = "127.0.0.1:0"\nadmin = "127.0.0.1:0"')
    text = text.replace("[server]\n", f'[server]\ndata_dir = "{workdir}"\n', 1)
    text = text.replace("[platform]\n", '[platform]\nupstream = "platform"\nsync_interval = "1s"\n', 1)
    text += f'\n[store]\nurl = "sqlite://{workdir}/keygate.db"\n'
    config = tomllib.loads(text)
    assert config["platform"]["upstream"] == "platform"
    assert config["listen"]["https"] == "127.0.0.1:0"
    return text


@pytest.fixture(scope="module")
def front():
    base = database_url()
    schema = f"kg_quick_start_{uuid.uuid4().hex}"
    psql(base, f"CREATE SCHEMA {schema}")
    separator = "&" if "?" in base else "?"
    url = f"{base}{separator}options=-c%20search_path%3D{schema}"
    workdir = Path(tempfile.mkdtemp(prefix="keygate-quick-start-"))
    stand_in = None
    process = None
    try:
        fill_platform(url)
        stand_in = PlatformStandIn(url)
        config = workdir / "keygate.toml"
        config.write_text(documented_config(workdir, stand_in.base_url))
        env = dict(os.environ, KEYGATE_PLATFORM_DATABASE_URL=url, RUST_LOG="info")
        for name in ("KEYGATE_CONFIG", "KEYGATE_BOOTSTRAP_PASSWORD"):
            env.pop(name, None)
        imported = subprocess.run(
            [KEYGATE, "--config", config, "import", "platform", "--json"],
            capture_output=True, text=True, env=env, timeout=120,
        )
        assert imported.returncode == 0, imported.stderr
        report = json.loads(imported.stdout)
        assert report["users"]["added"] == 2, report
        assert report["keys"]["added"] == 1, report
        log = open(workdir / "keygate.log", "w+")
        process = subprocess.Popen(
            [KEYGATE, "--config", config, "--log-format", "json", "serve"],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )
        reader = open(workdir / "keygate.log")
        match = _read_line(reader, r'"https":"127\.0\.0\.1:(\d+)".*"admin":"127\.0\.0\.1:(\d+)"|'
                           r'"admin":"127\.0\.0\.1:(\d+)".*"https":"127\.0\.0\.1:(\d+)"',
                           time.monotonic() + 60)
        https, admin = (match.group(1), match.group(2)) if match.group(1) else (match.group(4), match.group(3))
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=5) as ready:
                    if ready.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "keygate never became ready"
            time.sleep(0.1)
        stand_in.base = f"https://localhost:{https}"
        stand_in.ca = str(workdir / "dev-ca.pem")
        yield stand_in
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=30)
        if stand_in is not None:
            stand_in.stop()
        psql(base, f"DROP SCHEMA {schema} CASCADE")
        shutil.rmtree(workdir, ignore_errors=True)


def tokens_reaching_the_platform(front, path):
    """The platform's claims of every token keygate sent it on `path`."""
    return [
        jwt.decode(header.removeprefix("Bearer "), base64.b64decode(SIGNING_KEY), algorithms=["HS512"])
        for seen_path, header in front.seen
        if seen_path.startswith(path)
    ]


def test_tb_rest_client_logs_in_with_a_platform_password_and_a_platform_key_after_the_quick_start(
    front, monkeypatch
):
    # The table in docs/deploying.md: ssl_ca_cert for its API calls,
    # REQUESTS_CA_BUNDLE for its password login.
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", front.ca)
    client = RestClient(base_url=front.base)
    client.configuration.ssl_ca_cert = front.ca
    client.login(username=ADMIN_EMAIL, password=PASSWORD)
    user = client.get_user()
    assert user.email == ADMIN_EMAIL
    assert user.id.id == ADMIN
    assert user.tenant_id.id == TENANT
    assert user.authority == "TENANT_ADMIN"

    by_key = RestClient(base_url=front.base)
    by_key.configuration.ssl_ca_cert = front.ca
    by_key.api_key_login(API_KEY)
    user = by_key.get_user()
    assert user.email == ADMIN_EMAIL
    assert user.id.id == ADMIN


def tb(tmp_path, *args, **extra):
    env = {
        **os.environ,
        "TB_CONFIG_HOME": str(tmp_path / "tb"),
        "TB_ANALYTICS": "0",
        "DO_NOT_TRACK": "1",
        "TB_CLI_UPDATE_INDEX": "disabled",
        "NO_COLOR": "1",
        "COLUMNS": "200",
        **extra,
    }
    for name in ("TB_URL", "TB_API_KEY", "TB_PROFILE", "TB_DEBUG"):
        if name not in extra:
            env.pop(name, None)
    return subprocess.run([TB, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def test_tb_cli_logs_in_both_ways_and_lists_the_platforms_users_through_keygate_after_the_quick_start(
    front, tmp_path
):
    trust = {"SSL_CERT_FILE": front.ca}
    saved = tb(tmp_path, "config", "set", "--url", front.base, "--username", ADMIN_EMAIL,
               "--password", PASSWORD, **trust)
    assert saved.returncode == 0, saved.stdout + saved.stderr
    assert f"Connected to {front.base}" in saved.stdout + saved.stderr
    listed = tb(tmp_path, "user", "list", "--format", "json", **trust)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    users = {user["email"]: user for user in json.loads(listed.stdout)["data"]}
    assert set(users) == {ADMIN_EMAIL, CUSTOMER_EMAIL}
    assert users[CUSTOMER_EMAIL]["authority"] == "CUSTOMER_USER"
    assert users[CUSTOMER_EMAIL]["customerId"]["id"] == CUSTOMER
    # The listing came from the platform, asked with the platform's own token
    # for the user who logged in.
    claims = tokens_reaching_the_platform(front, "/api/userInfos/all")
    assert claims and claims[-1]["userId"] == ADMIN, claims

    by_key = tb(tmp_path, "--debug", "config", "set", "--url", front.base, "--api-key", API_KEY, **trust)
    assert by_key.returncode == 0, by_key.stdout + by_key.stderr
    answer = by_key.stderr.split("[DEBUG get_user → response]", 1)[1]
    user = json.loads(answer[: answer.index("\n}") + 2])
    assert user["email"] == ADMIN_EMAIL
    assert user["id"]["id"] == ADMIN
    assert API_KEY not in by_key.stdout + by_key.stderr
    listed = tb(tmp_path, "user", "list", "--format", "json", **trust)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert ADMIN_EMAIL in {user["email"] for user in json.loads(listed.stdout)["data"]}
