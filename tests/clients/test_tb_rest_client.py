"""The platform's Python client (`tb-rest-client`) against keygate, unchanged."""

import time

import jwt
import pytest
from tb_rest_client.models.device import Device
from tb_rest_client.rest import ApiException
from tb_rest_client.rest_client import RestClient

from conftest import ACCESS_TTL, TENANT_EMAIL, TENANT_ID, TENANT_PASSWORD


def client_for(gateway):
    """Its API calls (urllib3) trust keygate's CA through `ssl_ca_cert` only;
    a password login needs `requests_trusts_keygate` as well."""
    client = RestClient(base_url=gateway.base_url)
    client.configuration.ssl_ca_cert = gateway.ca
    return client


def test_login_and_current_user(gateway, requests_trusts_keygate):
    client = client_for(gateway)
    client.login(username=TENANT_EMAIL, password=TENANT_PASSWORD)
    user = client.get_user()
    assert user.email == TENANT_EMAIL
    assert user.authority == "TENANT_ADMIN"
    assert user.first_name == "Tess"
    assert user.tenant_id.id == TENANT_ID


def test_api_key_creates_and_lists_devices_through_the_gateway(gateway):
    client = client_for(gateway)
    client.api_key_login(gateway.api_key)
    assert client.get_user().email == TENANT_EMAIL
    device = client.save_device(Device(name="client-device", type="default"))
    assert device.name == "client-device"
    page = client.get_tenant_devices(page_size=10, page=0)
    assert "client-device" in [d.name for d in page.data]


def test_unknown_api_key_is_refused_in_the_contract_shape(gateway):
    client = client_for(gateway)
    client.api_key_login("tb_not-a-real-key")
    with pytest.raises(ApiException) as refused:
        client.get_user()
    assert refused.value.status == 401
    body = refused.value.body
    body = body.decode() if isinstance(body, bytes) else body
    assert '"errorCode":10' in body


def test_expired_access_token_is_refreshed_by_the_client(gateway, requests_trusts_keygate):
    with client_for(gateway) as client:
        client.login(username=TENANT_EMAIL, password=TENANT_PASSWORD)
        first = client.token_info["token"]
        first_exp = jwt.decode(first, options={"verify_signature": False})["exp"]
        assert first_exp - time.time() <= ACCESS_TTL
        deadline = first_exp + 30
        while client.token_info["token"] == first and time.time() < deadline:
            time.sleep(0.5)
        assert client.token_info["token"] != first, "the client refreshed after exp"
        assert client.token_info["exp"] > first_exp
        assert client.get_user().email == TENANT_EMAIL
