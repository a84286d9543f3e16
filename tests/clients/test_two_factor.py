"""A two-factor login completed by the platform's own Python client: the
password login answers a pre-verification token, and the client's own
`check_two_fa_verification_code` call turns a TOTP code into a token pair."""

import time

import jwt
import pyotp
import requests
from tb_rest_client.rest import ApiException
from tb_rest_client.rest_client import RestClient

from conftest import TWO_FACTOR_EMAIL, TWO_FACTOR_PASSWORD


def _client(gateway):
    client = RestClient(base_url=gateway.base_url)
    client.configuration.ssl_ca_cert = gateway.ca
    return client


def _configure_totp(base_url, token):
    headers = {"X-Authorization": f"Bearer {token}"}
    generated = requests.post(
        f"{base_url}/api/2fa/account/config/generate",
        params={"providerType": "TOTP"}, headers=headers, timeout=10,
    )
    assert generated.status_code == 200, generated.text
    config = generated.json()
    totp = pyotp.parse_uri(config["authUrl"])
    code = totp.now()
    saved = requests.post(
        f"{base_url}/api/2fa/account/config",
        params={"verificationCode": code}, json=config, headers=headers, timeout=10,
    )
    assert saved.status_code == 200, saved.text
    assert "authUrl" not in saved.text
    return totp, code


def test_two_factor_login_with_the_clients_own_check_call(gateway, requests_trusts_keygate):
    client = _client(gateway)
    client.login(TWO_FACTOR_EMAIL, TWO_FACTOR_PASSWORD)
    totp, used = _configure_totp(gateway.base_url, client.get_token())

    client = _client(gateway)
    client.login(TWO_FACTOR_EMAIL, TWO_FACTOR_PASSWORD)
    pre = client.get_token()
    assert jwt.decode(pre, options={"verify_signature": False})["scopes"] == ["PRE_VERIFICATION_TOKEN"]
    try:
        client.get_user()
        raise AssertionError("a pre-verification token opened /api/auth/user")
    except ApiException as refused:
        assert refused.status == 401

    # The code that saved the secret is spent; wait for the next step's.
    code = totp.now()
    while code == used:
        time.sleep(1)
        code = totp.now()
    pair = client.check_two_fa_verification_code("TOTP", code)
    assert pair.refresh_token
    client.token_login(pair.token, pair.refresh_token)
    assert client.get_user().email == TWO_FACTOR_EMAIL
