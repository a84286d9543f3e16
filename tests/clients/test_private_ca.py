"""Each client of docs/deploying.md's table ("Clients and a private certificate
authority") against keygate's development certificate, signed by its private
CA (`dev-ca.pem`): refused without what the table says, accepted with it, and
refused with the setting that belongs to another client."""

import os
import ssl
import subprocess

import httpx
import pytest
import requests
import urllib3
from tb_rest_client.rest import ApiException
from tb_rest_client.rest_client import RestClient

from conftest import TENANT_EMAIL, TENANT_PASSWORD

REFUSED = "CERTIFICATE_VERIFY_FAILED"


def current_user(gateway):
    """keygate's own current-user endpoint, asked with the tenant's API key."""
    return f"{gateway.base_url}/api/auth/user", {"X-Authorization": f"ApiKey {gateway.api_key}"}


def test_requests_trusts_the_private_ca_through_requests_ca_bundle_or_verify(gateway, monkeypatch):
    url, headers = current_user(gateway)
    with pytest.raises(requests.exceptions.SSLError, match=REFUSED):
        requests.get(url, headers=headers, timeout=10)
    # requests reads certifi's bundle, not OpenSSL's default paths.
    monkeypatch.setenv("SSL_CERT_FILE", gateway.ca)
    with pytest.raises(requests.exceptions.SSLError, match=REFUSED):
        requests.get(url, headers=headers, timeout=10)
    monkeypatch.delenv("SSL_CERT_FILE")

    answer = requests.get(url, headers=headers, verify=gateway.ca, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.json()["email"] == TENANT_EMAIL

    monkeypatch.setenv("REQUESTS_CA_BUNDLE", gateway.ca)
    answer = requests.get(url, headers=headers, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.json()["email"] == TENANT_EMAIL


def test_httpx_trusts_the_private_ca_through_ssl_cert_file_or_its_verify_context(gateway, monkeypatch):
    url, headers = current_user(gateway)
    for http2, wire in ((False, "HTTP/1.1"), (True, "HTTP/2")):
        with monkeypatch.context() as env:
            with httpx.Client(http2=http2, timeout=10) as client:
                with pytest.raises(httpx.ConnectError, match=REFUSED):
                    client.get(url, headers=headers)
            # httpx never reads REQUESTS_CA_BUNDLE.
            env.setenv("REQUESTS_CA_BUNDLE", gateway.ca)
            with httpx.Client(http2=http2, timeout=10) as client:
                with pytest.raises(httpx.ConnectError, match=REFUSED):
                    client.get(url, headers=headers)
            # Read when the client is made.
            env.setenv("SSL_CERT_FILE", gateway.ca)
            with httpx.Client(http2=http2, timeout=10) as client:
                answer = client.get(url, headers=headers)
            assert answer.status_code == 200, answer.text
            assert answer.http_version == wire
            assert answer.json()["email"] == TENANT_EMAIL

        context = ssl.create_default_context(cafile=gateway.ca)
        with httpx.Client(http2=http2, verify=context, timeout=10) as client:
            answer = client.get(url, headers=headers)
        assert answer.status_code == 200, answer.text
        assert answer.http_version == wire


def test_tb_rest_client_login_needs_requests_ca_bundle_and_its_calls_need_ssl_ca_cert(gateway, monkeypatch):
    # ssl_ca_cert alone: the password login goes through requests, which refuses.
    client = RestClient(base_url=gateway.base_url)
    client.configuration.ssl_ca_cert = gateway.ca
    with pytest.raises(requests.exceptions.SSLError, match=REFUSED):
        client.login(username=TENANT_EMAIL, password=TENANT_PASSWORD)

    # SSL_CERT_FILE: read by neither half (requests and the calls use certifi).
    monkeypatch.setenv("SSL_CERT_FILE", gateway.ca)
    with pytest.raises(requests.exceptions.SSLError, match=REFUSED):
        RestClient(base_url=gateway.base_url).login(username=TENANT_EMAIL, password=TENANT_PASSWORD)
    client = RestClient(base_url=gateway.base_url)
    client.api_key_login(gateway.api_key)
    with pytest.raises((ApiException, urllib3.exceptions.MaxRetryError), match=REFUSED):
        client.get_user()
    monkeypatch.delenv("SSL_CERT_FILE")

    # REQUESTS_CA_BUNDLE alone: the login passes, the first API call refuses.
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", gateway.ca)
    client = RestClient(base_url=gateway.base_url)
    client.login(username=TENANT_EMAIL, password=TENANT_PASSWORD)
    with pytest.raises((ApiException, urllib3.exceptions.MaxRetryError), match=REFUSED):
        client.get_user()

    # Both: the table's row.
    client = RestClient(base_url=gateway.base_url)
    client.configuration.ssl_ca_cert = gateway.ca
    client.login(username=TENANT_EMAIL, password=TENANT_PASSWORD)
    assert client.get_user().email == TENANT_EMAIL

    # An API key makes no login call: ssl_ca_cert alone is enough.
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")
    client = RestClient(base_url=gateway.base_url)
    client.configuration.ssl_ca_cert = gateway.ca
    client.api_key_login(gateway.api_key)
    assert client.get_user().email == TENANT_EMAIL


def test_curl_trusts_the_private_ca_through_cacert_or_curl_ca_bundle(gateway):
    url, headers = current_user(gateway)
    header = f"X-Authorization: {headers['X-Authorization']}"
    for wire, version in (("--http1.1", "1.1"), ("--http2", "2")):
        command = ["curl", "-sS", wire, "-H", header, "-w", "\n%{http_version}", url]
        refused = subprocess.run(command, capture_output=True, text=True, timeout=30)
        assert refused.returncode == 60, refused.stderr  # peer certificate cannot be authenticated
        for extra, env in (
            (["--cacert", gateway.ca], {}),
            ([], {"CURL_CA_BUNDLE": gateway.ca}),
        ):
            done = subprocess.run(
                command[:1] + extra + command[1:], capture_output=True, text=True, timeout=30,
                env={**os.environ, **env},
            )
            assert done.returncode == 0, done.stderr
            body, used = done.stdout.rsplit("\n", 1)
            assert used == version
            assert TENANT_EMAIL in body
