"""A WebSocket client (`websocket-client`) through keygate, in the platform's
documented frame format: `{"authCmd": {...}, "cmds": [...]}` on /api/ws."""

import json

import pytest
import websocket
from tb_rest_client.rest_client import RestClient

from conftest import TENANT_EMAIL, TENANT_ID, TENANT_PASSWORD


def connect(gateway, path="/api/ws"):
    return websocket.create_connection(
        f"wss://localhost:{gateway.port}{path}",
        sslopt={"ca_certs": gateway.ca},
        timeout=10,
    )


def close_of(ws):
    """Reads until the close frame; its code and reason."""
    while True:
        opcode, data = ws.recv_data(control_frame=True)
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            return int.from_bytes(data[:2], "big"), data[2:].decode()



def test_auth_cmd_with_an_api_key_runs_the_cmds_upstream_with_the_identity(gateway):
    ws = connect(gateway)
    cmds = [{"cmdId": 1, "type": "ENTITY_DATA", "query": {"entityFilter": {}}}]
    ws.send(json.dumps({"authCmd": {"cmdId": 0, "apiKey": gateway.api_key}, "cmds": cmds}))
    reply = json.loads(ws.recv())
    assert reply["received"] == {"cmds": cmds}
    assert reply["headers"]["x-auth-method"] == "api-key"
    assert reply["headers"]["x-auth-tenant-id"] == TENANT_ID
    assert gateway.api_key not in json.dumps(reply)
    ws.close()


def test_auth_cmd_with_the_login_token_authenticates_the_socket(gateway, requests_trusts_keygate):
    client = RestClient(base_url=gateway.base_url)
    client.configuration.ssl_ca_cert = gateway.ca
    client.login(username=TENANT_EMAIL, password=TENANT_PASSWORD)
    token = client.token_info["token"]
    ws = connect(gateway)
    ws.send(json.dumps({"authCmd": {"cmdId": 0, "token": token}, "cmds": []}))
    ws.send(json.dumps({"cmds": [{"cmdId": 2}]}))
    reply = json.loads(ws.recv())
    assert reply["received"] == {"cmds": [{"cmdId": 2}]}, "a frame with nothing left is not forwarded"
    assert reply["headers"]["x-auth-method"] == "jwt"
    ws.close()


def test_query_token_on_the_deprecated_telemetry_path(gateway, requests_trusts_keygate):
    client = RestClient(base_url=gateway.base_url)
    client.configuration.ssl_ca_cert = gateway.ca
    client.login(username=TENANT_EMAIL, password=TENANT_PASSWORD)
    token = client.token_info["token"]
    ws = connect(gateway, f"/api/ws/plugins/telemetry?token={token}")
    ws.send(json.dumps({"tsSubCmds": [], "historyCmds": [], "attrSubCmds": []}))
    reply = json.loads(ws.recv())
    assert reply["query"] is None, "the token never reaches the upstream"
    assert reply["headers"]["x-auth-user-id"]
    ws.close()


@pytest.mark.parametrize(
    "frame, code",
    [
        ({"authCmd": {"cmdId": 0, "token": "not-a-jwt"}}, 1007),
        ({"cmds": [{"cmdId": 1}]}, 1008),
    ],
)
def test_refused_first_frames_close_with_the_platforms_codes(gateway, frame, code):
    ws = connect(gateway)
    ws.send(json.dumps(frame))
    assert close_of(ws)[0] == code
