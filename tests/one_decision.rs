//! One decision for every driver: a refusal added to the decision alone
//! ([`keygate::decision::Rule`]) holds on the lean HTTP/1.1 path, on hyper's
//! driver (HTTP/2), on a WebSocket upgrade of a checked route, and on a
//! platform WebSocket route's first-frame `authCmd`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Gateway, WIRES};
use futures_util::{SinkExt, StreamExt};
use keygate::auth::AuthFailure;
use keygate::decision::{Asked, Rule, Rules};
use keygate::identity::{Authority, Identity};
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};

const CLOSED: &str = "closed@example.com";

/// Refuses whatever the user [`CLOSED`] asks, as outside its scopes.
struct ClosedUser;

impl Rule for ClosedUser {
    fn refuse(&self, _asked: &Asked<'_>, identity: Option<&Identity>) -> Option<AuthFailure> {
        identity
            .is_some_and(|identity| identity.principal.email == CLOSED)
            .then_some(AuthFailure::OutOfScope)
    }
}

/// Opens a socket on `path` over TLS with `headers` on the upgrade; the
/// socket, or the upgrade's refusal status.
async fn upgrade(
    gw: &Gateway,
    path: &str,
    headers: &[(&str, String)],
) -> Result<common::Socket, u16> {
    let port = gw.running.https.unwrap().port();
    let mut request = format!("wss://localhost:{port}{path}")
        .into_client_request()
        .unwrap();
    for (name, value) in headers {
        let name = http::HeaderName::from_bytes(name.as_bytes()).unwrap();
        request.headers_mut().append(name, value.parse().unwrap());
    }
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let server_name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let tls = common::tls_connector(&gw.ca_pem)
        .connect(server_name, tcp)
        .await
        .unwrap();
    match tokio_tungstenite::client_async(request, tls).await {
        Ok((socket, _)) => Ok(socket),
        Err(tungstenite::Error::Http(response)) => Err(response.status().as_u16()),
        Err(other) => panic!("upgrade failed: {other}"),
    }
}

/// What comes back first on a socket: a text message, or the close code.
async fn first_answer(socket: &mut common::Socket) -> Result<String, u16> {
    let read = async {
        loop {
            match socket.next().await {
                Some(Ok(Message::Text(text))) => return Ok(text.as_str().to_owned()),
                Some(Ok(Message::Close(frame))) => {
                    return Err(frame.map_or(1005, |frame| u16::from(frame.code)));
                }
                Some(Ok(_)) => {}
                other => panic!("expected a message or a close, got {other:?}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("an answer within 10 s")
}

#[tokio::test]
async fn a_rule_added_only_to_the_decision_refuses_on_every_driver() {
    let upstream = common::reference_upstream().await;
    let rules = Rules(vec![Arc::new(ClosedUser)]);
    let sockets = "[websocket]\nroutes = [\"/api/ws/plugins/\"]\n";
    let gw = Gateway::start_with_rules(&upstream, sockets, rules).await;
    let open_user = gw.user("open@example.com", Authority::TenantAdmin).await;
    let (_, open_key) = gw.api_key(&open_user, 0).await;
    let closed_user = gw.user(CLOSED, Authority::TenantAdmin).await;
    let (_, closed_key) = gw.api_key(&closed_user, 0).await;

    // HTTP/1.1 (the lean path) and HTTP/2 (hyper's driver).
    for wire in WIRES {
        let client = gw.client_over(wire);
        for (key, expected) in [(&open_key, 200), (&closed_key, 403)] {
            let response = client
                .get(gw.https("/api/echo"))
                .header("X-Authorization", common::api_key_header(key))
                .send()
                .await
                .unwrap();
            assert_eq!(response.version(), wire.version());
            assert_eq!(response.status().as_u16(), expected, "{wire:?}");
        }
    }
    let metrics = gw.metrics().await;
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("keygate_fast_path_declined_total") && !l.ends_with(" 0")),
        "the lean path took the HTTP/1.1 requests:\n{metrics}"
    );

    // An upgrade on a checked route, refused as the request it is.
    let closed = vec![("X-Authorization", common::api_key_header(&closed_key))];
    assert_eq!(upgrade(&gw, "/api/ws", &closed).await.err(), Some(403));
    let open = vec![("X-Authorization", common::api_key_header(&open_key))];
    assert!(upgrade(&gw, "/api/ws", &open).await.is_ok());

    // A platform WebSocket route: the credential comes in the first frame.
    for (key, refused) in [(&open_key, false), (&closed_key, true)] {
        let mut socket = upgrade(&gw, "/api/ws/plugins/telemetry", &[])
            .await
            .unwrap();
        let auth_cmd = json!({"authCmd": {"cmdId": 0, "apiKey": key}}).to_string();
        socket.send(Message::text(auth_cmd)).await.unwrap();
        if refused {
            assert_eq!(first_answer(&mut socket).await, Err(1008));
        } else {
            socket.send(Message::text("{}")).await.unwrap();
            assert!(first_answer(&mut socket).await.is_ok());
        }
    }
    let metrics = gw.metrics().await;
    assert!(
        common::counter(
            &metrics,
            "keygate_auth_total{method=\"api-key\",result=\"out_of_scope\"}"
        ) >= 4,
        "every refusal counted where refusals are:\n{metrics}"
    );
}
