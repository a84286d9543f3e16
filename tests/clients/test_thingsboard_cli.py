"""The platform's CLI (`thingsboard-cli`, the `tb` command) against keygate,
unchanged. Its HTTP goes through `tb-pe-client`, whose urllib3 pools are made
with no CA file: Python's default context, so OpenSSL's SSL_CERT_FILE is what
makes it trust keygate's private CA. The CLI has no CA setting of its own and
never uses `requests`, so REQUESTS_CA_BUNDLE changes nothing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TENANT_EMAIL, TENANT_ID, TENANT_PASSWORD

TB = Path(sys.executable).parent / "tb"
NOT_ACCEPTED = "The TLS certificate of 'localhost' was not accepted"


@pytest.fixture
def tb(tmp_path):
    """Runs `tb` with its configuration in a fresh directory (TB_CONFIG_HOME),
    no analytics and no update check; `trust` adds environment variables."""

    def run(*args, trust=None):
        env = {
            **os.environ,
            "TB_CONFIG_HOME": str(tmp_path / "tb"),
            "TB_ANALYTICS": "0",
            "DO_NOT_TRACK": "1",
            "TB_CLI_UPDATE_INDEX": "disabled",
            "NO_COLOR": "1",
            "COLUMNS": "200",
            **(trust or {}),
        }
        for name in ("TB_URL", "TB_API_KEY", "TB_PROFILE", "TB_DEBUG"):
            if name not in (trust or {}):
                env.pop(name, None)
        return subprocess.run(
            [TB, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
        )

    return run


def users_listed(done):
    assert done.returncode == 0, done.stdout + done.stderr
    return {user["email"]: user for user in json.loads(done.stdout)["data"]}


def test_cli_password_login_and_user_list_trust_the_private_ca_through_ssl_cert_file(gateway, tb):
    login = ("config", "set", "--url", gateway.base_url, "--username", TENANT_EMAIL, "--password", TENANT_PASSWORD)
    for trust in ({}, {"REQUESTS_CA_BUNDLE": gateway.ca}):
        saved = tb(*login, trust=trust)
        assert NOT_ACCEPTED in " ".join(saved.stderr.split()), saved.stderr
        listed = tb("user", "list", "--format", "json", trust=trust)
        assert listed.returncode != 0
        assert "CERTIFICATE_VERIFY_FAILED" in listed.stdout + listed.stderr

    trust = {"SSL_CERT_FILE": gateway.ca}
    saved = tb(*login, trust=trust)
    assert saved.returncode == 0
    assert f"Connected to {gateway.base_url}" in saved.stdout + saved.stderr
    # /api/userInfos/all: keygate answers it itself.
    users = users_listed(tb("user", "list", "--format", "json", trust=trust))
    assert users[TENANT_EMAIL]["authority"] == "TENANT_ADMIN"
    assert users[TENANT_EMAIL]["tenantId"]["id"] == TENANT_ID

    wrong = ("config", "set", "--url", gateway.base_url, "--username", TENANT_EMAIL, "--password", "not-it")
    refused = tb(*wrong, trust=trust)
    assert "The username or the password is not correct" in " ".join(refused.stderr.split())


def test_cli_api_key_login_and_current_user_trust_the_private_ca_through_ssl_cert_file(gateway, tb, tmp_path):
    # With an API key profile the CLI checks the connection with the current
    # user (GET /api/auth/user); --debug prints the answer it parsed.
    login = ("--debug", "config", "set", "--url", gateway.base_url, "--api-key", gateway.api_key)
    for trust in ({}, {"REQUESTS_CA_BUNDLE": gateway.ca}):
        saved = tb(*login, trust=trust)
        assert NOT_ACCEPTED in " ".join(saved.stderr.split()), saved.stderr

    trust = {"SSL_CERT_FILE": gateway.ca}
    saved = tb(*login, trust=trust)
    assert f"Connected to {gateway.base_url}" in saved.stdout + saved.stderr
    answer = saved.stderr.split("[DEBUG get_user → response]", 1)[1]
    user = json.loads(answer[: answer.index("\n}") + 2])
    assert user["email"] == TENANT_EMAIL
    assert user["authority"] == "TENANT_ADMIN"
    assert user["firstName"] == "Tess"
    assert user["tenantId"]["id"] == TENANT_ID
    assert gateway.api_key not in saved.stdout + saved.stderr

    users = users_listed(tb("user", "list", "--format", "json", trust=trust))
    assert TENANT_EMAIL in users

    # No profile at all: the URL and the key from the environment, as a script
    # or a pipeline would give them.
    from_env = {
        **trust, "TB_URL": gateway.base_url, "TB_API_KEY": gateway.api_key,
        "TB_CONFIG_HOME": str(tmp_path / "empty"),
    }
    users = users_listed(tb("user", "list", "--format", "json", trust=from_env))
    assert TENANT_EMAIL in users
    del from_env["SSL_CERT_FILE"]
    listed = tb("user", "list", "--format", "json", trust=from_env)
    assert listed.returncode != 0
    assert "CERTIFICATE_VERIFY_FAILED" in listed.stdout + listed.stderr

    refused = tb("config", "set", "--url", gateway.base_url, "--api-key", "tb_not-a-real-key", trust=trust)
    assert "The API key is not valid" in " ".join(refused.stderr.split())
