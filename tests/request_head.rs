//! What a client's request head may carry past keygate: headers an upstream
//! would read as another method, and header names an upstream would fold
//! into a framing header. Each test runs its one body over HTTP/1.1 (the
//! lean path) and HTTP/2 (hyper's driver).

mod common;

use common::{Upstream, Wire, api_key_header, counter, error_body, raw_http};
use keygate::identity::Authority;
use serde_json::{Value, json};

/// A key of `owner` (created with the owner's whole key) that may only read
/// under `/api/devices/`.
async fn get_only_key(gw: &common::Gateway, whole: &str, owner: uuid::Uuid) -> String {
    let response = gw
        .client()
        .post(gw.https("/api/apiKey"))
        .header("X-Authorization", api_key_header(whole))
        .json(&json!({
            "userId": {"id": owner, "entityType": "USER"},
            "description": "read only",
            "scopes": [{"path": "/api/devices/", "methods": ["GET"]}],
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let created: Value = response.json().await.unwrap();
    created["value"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn method_override_headers_cannot_turn_a_get_only_keys_get_into_a_delete() {
    let (upstream, gw) = common::gateway("").await;
    let user = gw
        .user("override@example.com", Authority::TenantAdmin)
        .await;
    let (_, whole) = gw.api_key(&user, 0).await;
    let reader = api_key_header(&get_only_key(&gw, &whole, user.id).await);
    for wire in common::WIRES {
        let client = gw.client_over(wire);
        let declines = gw.declines().await;
        // The key itself may not delete...
        let (status, json) = error_body(
            client
                .delete(gw.https("/api/devices/1"))
                .header("X-Authorization", &reader)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(
            (status, json["errorCode"].as_u64()),
            (403, Some(20)),
            "{wire:?}"
        );
        // ...nor through an upstream that honours an override header, on a
        // route of any identity mode, public ones included.
        for path in ["/api/devices/1", "/api/noauth/devices/1"] {
            let response = client
                .get(gw.https(path))
                .header("X-Authorization", &reader)
                .header("X-HTTP-Method-Override", "DELETE")
                .header("X-HTTP-Method", "DELETE")
                .header("X-Method-Override", "DELETE")
                .header("x_http_method_override", "DELETE")
                .header("X.Method.Override", "DELETE")
                .send()
                .await
                .unwrap();
            assert_eq!(response.version(), wire.version());
            assert_eq!(response.status(), 200, "{wire:?} {path}");
            let seen = upstream.last_to(path);
            assert_eq!(seen.method, "GET");
            let leaked: Vec<&str> = seen
                .headers
                .iter()
                .filter(|(_, value)| value.as_bytes() == b"DELETE")
                .map(|(name, _)| name.as_str())
                .collect();
            assert!(
                leaked.is_empty(),
                "{wire:?} {path}: {leaked:?} reached the upstream"
            );
        }
        gw.assert_lean_path_took(&declines, &[], &format!("{wire:?}"))
            .await;
    }
}

/// Spellings of framing and hop-by-hop names that a server folding `_` (or
/// another separator) to `-` reads as the real ones.
const FOLDED: [(&str, &str); 6] = [
    ("Content_Length", "0"),
    ("Transfer_Encoding", "chunked"),
    ("transfer.encoding", "chunked"),
    ("Keep_Alive", "timeout=5"),
    ("Proxy_Connection", "keep-alive"),
    ("PROXY_AUTHORIZATION", "Basic eDp4"),
];

#[tokio::test]
async fn a_header_name_that_folds_to_content_length_or_transfer_encoding_is_refused() {
    let (upstream, gw) = common::gateway("").await;
    let user = gw.user("folded@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    for wire in common::WIRES {
        for (name, value) in FOLDED {
            // A proxied route, a public one, and an endpoint keygate answers.
            for path in ["/api/devices", "/api/noauth/info", "/api/auth/user"] {
                // A connection of its own: over HTTP/1.1 each request meets
                // the lean path first (after a request it declines, hyper
                // serves the rest of that connection).
                let response = gw
                    .client_over(wire)
                    .get(gw.https(path))
                    .header("X-Authorization", api_key_header(&key))
                    .header(name, value)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.version(), wire.version());
                let (status, json) = error_body(response).await;
                assert_eq!(
                    (status, json["errorCode"].as_u64()),
                    (400, Some(31)),
                    "{wire:?} {name} {path}: {json}"
                );
                assert!(
                    json["message"].as_str().unwrap().contains("header name"),
                    "{json}"
                );
            }
        }
        // The real names, and other names with `_`, pass.
        let response = gw
            .client_over(wire)
            .post(gw.https("/api/devices"))
            .header("X-Authorization", api_key_header(&key))
            .header("x_custom_header", "1")
            .body("abc")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{wire:?}");
        assert_eq!(upstream.last_to("/api/devices").body_len, 3);
    }
    assert_eq!(
        upstream.requests().len(),
        2,
        "only the plain requests arrived"
    );
    // The lean path saw them first and left each to hyper's, which refused.
    let metrics = gw.metrics().await;
    assert!(
        counter(
            &metrics,
            "keygate_fast_path_declined_total{reason=\"folded_name\"}"
        ) >= (FOLDED.len() * 3) as u64,
        "{metrics}"
    );
}

#[tokio::test]
async fn a_smuggled_body_behind_a_folded_transfer_encoding_never_reaches_the_upstream() {
    let upstream = Upstream::start().await;
    let gw = common::Gateway::start(&upstream.url(), "").await;
    // Byte for byte over plain HTTP/1.1, on a public route: a length of 0
    // for keygate, a chunked body for a server that folds `_`.
    let addr = gw.running.http.unwrap();
    let body = "0\r\n\r\nGET /api/noauth/b HTTP/1.1\r\nX: ";
    let smuggled = format!(
        "POST /api/noauth/a HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\
         Content-Length: {}\r\nTransfer_Encoding: chunked\r\n\r\n{body}",
        body.len()
    );
    let answer = raw_http(addr, &smuggled).await;
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    assert!(answer.contains("\"errorCode\":31"), "{answer}");
    assert!(upstream.requests().is_empty(), "{:?}", upstream.requests());
    // Over HTTP/2 the same name is refused alike.
    let response = gw
        .client_over(Wire::Http2)
        .post(gw.https("/api/noauth/a"))
        .header("Transfer_Encoding", "chunked")
        .body("0\r\n\r\n")
        .send()
        .await
        .unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(error_body(response).await.0, 400);
    assert!(upstream.requests().is_empty());
}
