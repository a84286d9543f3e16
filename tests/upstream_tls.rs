//! End to end: `https://` upstreams that require a client certificate
//! (`upstream_tls` on a route), reached over both drivers and by
//! WebSockets, pooled, and with a renewed certificate after a reload.

mod common;

use common::tls_upstream::{TlsUpstream, der_of};
use common::{Gateway, WIRES, Wire};
use futures_util::{SinkExt as _, StreamExt as _};
use tokio_tungstenite::tungstenite::Message;

/// A public route `/api/noauth/` to `upstream` with `tls` as its
/// `upstream_tls` (inline table fields), on one worker (one pool).
async fn gateway_to(upstream: &TlsUpstream, tls: &str) -> Gateway {
    Gateway::start_with_routes(&format!(
        r#"
[server]
workers = 1
[[route]]
name = "secure"
prefix = "/api/noauth/"
upstreams = ["{}"]
public = true
upstream_tls = {{ {tls} }}
"#,
        upstream.url()
    ))
    .await
}

/// `ca_file`, `cert_file` and `key_file` of `upstream`: what it accepts.
fn mutual(upstream: &TlsUpstream) -> String {
    format!(
        r#"ca_file = "{}", cert_file = "{}", key_file = "{}""#,
        upstream.ca_file.display(),
        upstream.cert_file.display(),
        upstream.key_file.display()
    )
}

/// `GET path` over `wire`: status and body.
async fn get(gw: &Gateway, wire: Wire, path: &str) -> (u16, serde_json::Value) {
    let response = gw
        .client_over(wire)
        .get(gw.https(path))
        .send()
        .await
        .unwrap();
    assert_eq!(response.version(), wire.version());
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or_default())
}

fn handshake_failures(metrics: &str) -> u64 {
    common::counter(
        metrics,
        r#"keygate_upstream_tls_handshake_failures_total{route="secure"}"#,
    )
}

#[tokio::test]
async fn requests_and_websockets_reach_an_https_upstream_with_the_client_certificate() {
    let upstream = TlsUpstream::start().await;
    let gw = gateway_to(&upstream, &mutual(&upstream)).await;
    let client_cert = der_of(&upstream.cert_file);
    let before = gw.declines().await;
    for wire in WIRES {
        let path = format!("/api/noauth/devices/{wire:?}");
        let (status, body) = get(&gw, wire, &path).await;
        assert_eq!(status, 200, "{wire:?}: {body}");
        assert_eq!(body["path"], path.as_str(), "{wire:?}");
        let seen = upstream.requests().pop().unwrap();
        assert_eq!(seen.path, path);
        assert_eq!(
            seen.client_cert.as_ref(),
            Some(&client_cert),
            "{wire:?}: the upstream saw keygate's client certificate"
        );
    }
    gw.assert_lean_path_took(&before, &[], "a request to an https:// upstream")
        .await;

    let mut socket = common::open_socket(&gw, "/api/noauth/echo").await;
    socket.send(Message::text("over mutual TLS")).await.unwrap();
    let echoed = tokio::time::timeout(std::time::Duration::from_secs(10), socket.next())
        .await
        .expect("an echo within 10 s");
    assert_eq!(
        echoed.unwrap().unwrap(),
        Message::text("over mutual TLS"),
        "the upstream socket is open over TLS"
    );
    let upgrade = upstream.requests().pop().unwrap();
    assert_eq!(upgrade.path, "/api/noauth/echo");
    assert_eq!(upgrade.client_cert.as_ref(), Some(&client_cert));
    assert_eq!(handshake_failures(&gw.metrics().await), 0);
}

#[tokio::test]
async fn without_a_client_certificate_the_upstream_refuses_and_the_client_gets_a_502() {
    let upstream = TlsUpstream::start().await;
    let ca_only = format!(r#"ca_file = "{}""#, upstream.ca_file.display());
    let gw = gateway_to(&upstream, &ca_only).await;
    for wire in WIRES {
        let response = gw
            .client_over(wire)
            .get(gw.https("/api/noauth/devices"))
            .send()
            .await
            .unwrap();
        let (status, body) = common::error_body(response).await;
        assert_eq!(status, 502, "{wire:?}: {body}");
        assert_eq!(
            body["status"], 502,
            "{wire:?}: the contract's shape: {body}"
        );
        assert_eq!(body["errorCode"], 2, "{wire:?}: {body}");
        // Over TLS 1.3 the refusal is an alert that comes in place of the
        // answer: still told as the handshake's failure.
        let message = body["message"].as_str().unwrap_or_default();
        assert!(message.contains("TLS handshake"), "{wire:?}: {body}");
    }
    assert!(upstream.handshakes_failed() >= 2, "the upstream refused");
    assert_eq!(handshake_failures(&gw.metrics().await), 2);
    assert!(upstream.requests().is_empty(), "no request got through");
}

#[tokio::test]
async fn an_upstream_certificate_from_another_ca_is_a_clear_502_and_counted_for_its_route() {
    let upstream = TlsUpstream::start().await;
    let wrong_ca = format!(
        r#"ca_file = "{}", cert_file = "{}", key_file = "{}""#,
        upstream.other_ca_file.display(),
        upstream.cert_file.display(),
        upstream.key_file.display()
    );
    let gw = gateway_to(&upstream, &wrong_ca).await;
    assert_eq!(
        handshake_failures(&gw.metrics().await),
        0,
        "the route's series exists before any failure"
    );
    for wire in WIRES {
        let response = gw
            .client_over(wire)
            .get(gw.https("/api/noauth/devices"))
            .send()
            .await
            .unwrap();
        let (status, body) = common::error_body(response).await;
        assert_eq!(status, 502, "{wire:?}: {body}");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(message.contains("TLS handshake"), "{wire:?}: {body}");
    }
    assert_eq!(handshake_failures(&gw.metrics().await), 2);
    assert!(upstream.requests().is_empty());
}

#[tokio::test]
async fn requests_reuse_one_tls_connection() {
    let upstream = TlsUpstream::start().await;
    let gw = gateway_to(&upstream, &mutual(&upstream)).await;
    // A request without a body goes over the same upstream client from
    // either driver: one pooled connection serves them all.
    for wire in WIRES {
        for _ in 0..5 {
            let (status, _) = get(&gw, wire, "/api/noauth/devices").await;
            assert_eq!(status, 200);
        }
        assert_eq!(
            upstream.accepted(),
            1,
            "{wire:?}: five requests more, still one connection"
        );
    }
    assert_eq!(upstream.requests().len(), 10);
}

#[tokio::test]
async fn a_client_certificate_renewed_on_disk_is_used_after_a_reload() {
    let upstream = TlsUpstream::start().await;
    let gw = gateway_to(&upstream, &mutual(&upstream)).await;
    let first = der_of(&upstream.cert_file);
    for wire in WIRES {
        assert_eq!(get(&gw, wire, "/api/noauth/before").await.0, 200);
        let seen = upstream.requests().pop().unwrap();
        assert_eq!(seen.client_cert.as_ref(), Some(&first), "{wire:?}");
    }

    let renewed = upstream.renew_client_certificate("keygate client 2");
    assert_ne!(renewed, first);
    // What SIGHUP does: the configuration read again, then applied.
    let settings = keygate::config::load(&keygate::config::Source {
        file: Some(&gw.dir.path().join("keygate.toml")),
        env: vec![],
    })
    .unwrap();
    gw.running.reload(&settings);

    for wire in WIRES {
        assert_eq!(get(&gw, wire, "/api/noauth/after").await.0, 200);
        let seen = upstream.requests().pop().unwrap();
        assert_eq!(
            seen.client_cert.as_ref(),
            Some(&renewed),
            "{wire:?}: a new connection shows the renewed certificate"
        );
    }
}
