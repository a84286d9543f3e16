//! End to end: the real server on port 0 in front of a recording upstream.
//! Each behaviour's one body runs over both wires ([`common::WIRES`]):
//! HTTP/1.1, which the lean path serves, and HTTP/2; a test that is about one
//! wire says so.

mod common;

use common::{Gateway, Upstream, WIRES, Wire, error_body, plain_client_over, raw_http};
use keygate::identity::Authority;

#[tokio::test]
async fn api_key_over_https_reaches_upstream_with_verified_identity_and_without_the_key() {
    let (upstream, gw) = common::gateway("").await;
    let user = gw.user("tenant@example.com", Authority::TenantAdmin).await;
    let (key_id, key) = gw.api_key(&user, 0).await;
    for wire in WIRES {
        let declines = gw.declines().await;
        let response = gw
            .client_over(wire)
            .get(gw.https("/api/tenant/devices?pageSize=10&page=0"))
            .header("X-Authorization", common::api_key_header(&key))
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), wire.version());
        assert_eq!(response.status(), 200, "{wire:?}");
        gw.assert_lean_path_took(&declines, &[], &format!("{wire:?}"))
            .await;
        forwarded_with_verified_identity(&upstream, &user, key_id, &key, response, wire);
    }
}

/// What a request with `key` over `wire` brought to `upstream` and back.
fn forwarded_with_verified_identity(
    upstream: &Upstream,
    user: &keygate::store::UserRecord,
    key_id: uuid::Uuid,
    key: &str,
    response: reqwest::Response,
    wire: Wire,
) {
    assert!(response.headers().contains_key("x-request-id"), "{wire:?}");
    assert!(
        !response.headers().contains_key("x-upstream-private"),
        "hop-by-hop removed on the way back"
    );
    let seen = upstream.last();
    assert_eq!(
        seen.path_and_query,
        "/api/tenant/devices?pageSize=10&page=0"
    );
    let h = &seen.headers;
    assert_eq!(h["x-auth-user-id"], user.id.to_string());
    assert_eq!(h["x-auth-tenant-id"], user.tenant_id.to_string());
    assert_eq!(
        h["x-auth-customer-id"],
        "13814000-1dd2-11b2-8080-808080808080"
    );
    assert_eq!(h["x-auth-authority"], "TENANT_ADMIN");
    assert_eq!(h["x-auth-email"], "tenant@example.com");
    assert_eq!(h["x-auth-method"], "api-key");
    assert_eq!(h["x-auth-api-key-id"], key_id.to_string());
    assert!(!h.contains_key("x-auth-session-id"));
    assert!(!h.contains_key("x-authorization") && !h.contains_key("authorization"));
    assert_eq!(h["x-forwarded-proto"], "https");
    assert_eq!(h["x-forwarded-for"], "127.0.0.1");
    assert!(
        h["x-forwarded-host"]
            .to_str()
            .unwrap()
            .starts_with("localhost:")
    );
    assert_eq!(h["x-request-id"].len(), 36);
    // One Host, the upstream's: the client's went to X-Forwarded-Host.
    let hosts: Vec<_> = h.get_all("host").iter().collect();
    assert_eq!(hosts, [upstream.addr.to_string().as_str()]);
    for (name, value) in h {
        assert!(
            !value.to_str().unwrap_or("").contains(key),
            "{wire:?}: key leaked in {name}"
        );
    }
}

#[tokio::test]
async fn api_key_over_plain_http_is_refused_and_not_forwarded() {
    let (upstream, gw) = common::gateway("").await;
    let user = gw.user("plain@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    for wire in WIRES {
        let client = plain_client_over(wire);
        let response = client
            .get(gw.http("/api/tenant/devices"))
            .header("X-Authorization", common::api_key_header(&key))
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), wire.version());
        let (status, json) = error_body(response).await;
        assert_eq!(status, 403, "{wire:?}");
        assert_eq!(json["errorCode"], 20);
        assert_eq!(json["message"], "API keys are accepted only over HTTPS");
        assert!(
            upstream.requests().is_empty(),
            "{wire:?}: nothing was forwarded"
        );
        // Even an unknown key is refused the same way: no lookup happens first.
        let response = client
            .get(gw.http("/api/x"))
            .header("X-Authorization", "ApiKey tb_unknown")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 403, "{wire:?}");
    }
    let metrics = gw.metrics().await;
    assert!(
        metrics.contains(r#"keygate_auth_total{method="api-key",result="plaintext_refused"} 4"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn spoofed_identity_headers_never_reach_upstream() {
    let (upstream, gw) = common::gateway("").await;
    let user = gw.user("spoof@example.com", Authority::CustomerUser).await;
    let (_, key) = gw.api_key(&user, 0).await;
    for (wire, path) in WIRES
        .into_iter()
        .flat_map(|wire| [(wire, "/api/devices"), (wire, "/api/noauth/echo")])
    {
        let declines = gw.declines().await;
        let response = gw
            .client_over(wire)
            .get(gw.https(path))
            .header("X-Authorization", common::api_key_header(&key))
            .header("X-Auth-User-Id", "00000000-0000-0000-0000-000000000001")
            .header("x_auth_user_id", "00000000-0000-0000-0000-000000000002")
            .header("X-AUTH-EMAIL", "root@evil.example")
            .header("X-Auth-Authority", "SYS_ADMIN")
            .header("x-auth_tenant-id", "00000000-0000-0000-0000-000000000003")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{wire:?} {path}");
        assert_eq!(response.version(), wire.version());
        gw.assert_lean_path_took(&declines, &[], &format!("{wire:?} {path}"))
            .await;
        let h = upstream.last().headers;
        let reserved: Vec<_> = h
            .iter()
            .filter(|(n, _)| n.as_str().replace('_', "-").starts_with("x-auth-"))
            .map(|(n, v)| format!("{n}: {v:?}"))
            .collect();
        if path.starts_with("/api/noauth/") {
            assert!(
                reserved.is_empty(),
                "{wire:?}: public route kept {reserved:?}"
            );
            assert!(!h.contains_key("x-authorization"));
        } else {
            assert_eq!(h["x-auth-user-id"], user.id.to_string());
            assert_eq!(h.get_all("x-auth-user-id").iter().count(), 1);
            assert_eq!(h["x-auth-email"], "spoof@example.com");
            assert_eq!(h["x-auth-authority"], "CUSTOMER_USER");
            assert!(!h.contains_key("x_auth_user_id") && !h.contains_key("x-auth_tenant-id"));
        }
    }
}

/// HTTP/1.1 only: HTTP/2 has no `Connection` header (a request carrying one
/// is malformed there).
#[tokio::test]
async fn connection_header_cannot_drop_the_injected_identity() {
    let (upstream, gw) = common::gateway("").await;
    let user = gw.user("conn@example.com", Authority::TenantAdmin).await;
    let (session_id, token) = gw.access_token(&user).await;
    let request = format!(
        "GET /api/devices HTTP/1.1\r\nHost: gw\r\nX-Authorization: Bearer {token}\r\n\
         Connection: close, X-Auth-User-Id, X-Auth-Tenant-Id, X-Auth-Session-Id\r\n\r\n"
    );
    let response = raw_http(gw.running.http.unwrap(), &request).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let h = upstream.last().headers;
    assert_eq!(h["x-auth-user-id"], user.id.to_string());
    assert_eq!(h["x-auth-tenant-id"], user.tenant_id.to_string());
    assert_eq!(h["x-auth-session-id"], session_id.to_string());
    assert_eq!(h["x-auth-method"], "jwt");
    assert!(!h.contains_key("connection") || !h["connection"].to_str().unwrap().contains("X-Auth"));
}

#[tokio::test]
async fn disabled_deleted_and_expired_keys_are_refused() {
    let (upstream, gw) = common::gateway("").await;
    let user = gw.user("keys@example.com", Authority::TenantAdmin).await;
    let store = &gw.running.store;
    let (disabled_id, disabled) = gw.api_key(&user, 0).await;
    // No request has cached these keys yet: nothing to revoke, here or below.
    let _ = store.set_api_key_enabled(disabled_id, false).await.unwrap();
    let (deleted_id, deleted) = gw.api_key(&user, 0).await;
    let _ = store.delete_api_key(deleted_id).await.unwrap();
    let (_, expired) = gw.api_key(&user, keygate::clock::now_ms() - 1000).await;
    for wire in WIRES {
        let client = gw.client_over(wire);
        let declines = gw.declines().await;
        for (key, message) in [
            (&disabled, "User account is not active"),
            (&deleted, "Invalid username or password"),
            (&expired, "API key is expired"),
        ] {
            let response = client
                .get(gw.https("/api/devices"))
                .header("X-Authorization", common::api_key_header(key))
                .send()
                .await
                .unwrap();
            assert_eq!(response.version(), wire.version());
            let (status, json) = error_body(response).await;
            assert_eq!(
                (status, json["errorCode"].as_u64()),
                (401, Some(10)),
                "{wire:?}: {json}"
            );
            assert_eq!(json["message"], message, "{wire:?}");
        }
        gw.assert_lean_path_took(&declines, &[], &format!("{wire:?}"))
            .await;
    }
    assert!(upstream.requests().is_empty());
}

#[tokio::test]
async fn key_of_a_disabled_user_is_refused_at_once_on_this_replica() {
    let (_upstream, gw) = common::gateway("").await;
    for wire in WIRES {
        let user = gw
            .user(
                &format!("gone-{wire:?}@example.com"),
                Authority::TenantAdmin,
            )
            .await;
        let (_, key) = gw.api_key(&user, 0).await;
        let client = gw.client_over(wire);
        let send = || {
            client
                .get(gw.https("/api/devices"))
                .header("X-Authorization", common::api_key_header(&key))
                .send()
        };
        let declines = gw.declines().await;
        assert_eq!(send().await.unwrap().status(), 200, "{wire:?}");
        // Applied below by hand, as the revocation path would.
        let _ = gw
            .running
            .store
            .set_user_enabled(user.id, false, keygate::clock::now_secs())
            .await
            .unwrap();
        gw.running
            .app
            .authenticator()
            .caches()
            .invalidate_user(user.id);
        let response = send().await.unwrap();
        assert_eq!(response.version(), wire.version());
        let (status, json) = error_body(response).await;
        assert_eq!(status, 401, "{wire:?}");
        assert_eq!(json["message"], "User account is not active");
        gw.assert_lean_path_took(&declines, &[], &format!("{wire:?}"))
            .await;
    }
}

#[tokio::test]
async fn forged_expired_and_refresh_tokens_are_refused_with_contract_codes() {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let (upstream, gw) = common::gateway("").await;
    let user = gw.user("jwt@example.com", Authority::TenantAdmin).await;
    let (session_id, good) = gw.access_token(&user).await;
    let keys = gw.running.app.authenticator().token_keys();
    let other = keygate::auth::jwt::TokenKeys::new(
        &[9u8; 64],
        "thingsboard.io",
        std::time::Duration::from_secs(9000),
        std::time::Duration::from_secs(604_800),
    );
    let now = keygate::clock::now_secs();
    let wrong_key = other.sign_access(&user, session_id, now).unwrap().token;
    let expired = keys
        .sign_access(&user, session_id, now - 20_000)
        .unwrap()
        .token;
    let refresh = keys
        .sign_refresh(&user, session_id, "jti", now)
        .unwrap()
        .token;
    let payload = good.split('.').nth(1).unwrap();
    let alg_none = format!("{}.{payload}.", b64.encode(br#"{"alg":"none"}"#));
    for wire in WIRES {
        let client = gw.client_over(wire);
        let declines = gw.declines().await;
        for (token, code, message) in [
            (&wrong_key, 11, "Token has expired"),
            (&expired, 11, "Token has expired"),
            (&alg_none, 10, "Invalid username or password"),
            (&refresh, 10, "Invalid username or password"),
        ] {
            let response = client
                .get(gw.https("/api/devices"))
                .header("X-Authorization", format!("Bearer {token}"))
                .send()
                .await
                .unwrap();
            assert_eq!(response.version(), wire.version());
            let (status, json) = error_body(response).await;
            assert_eq!(
                (status, json["errorCode"].as_u64()),
                (401, Some(code)),
                "{wire:?}: {json}"
            );
            assert_eq!(json["message"], message, "{wire:?}");
        }
        assert!(upstream.requests().is_empty(), "{wire:?}");
        let ok = client
            .get(gw.https("/api/devices"))
            .header("Authorization", format!("Bearer {good}"))
            .send()
            .await
            .unwrap();
        assert_eq!(ok.status(), 200, "{wire:?}");
        upstream.last_to("/api/devices");
        upstream.seen.lock().unwrap().clear();
        gw.assert_lean_path_took(&declines, &[], &format!("{wire:?}"))
            .await;
    }
}

#[tokio::test]
async fn logged_out_session_token_is_refused() {
    let (_upstream, gw) = common::gateway("").await;
    let user = gw.user("logout@example.com", Authority::TenantAdmin).await;
    for wire in WIRES {
        let (session_id, token) = gw.access_token(&user).await;
        let client = gw.client_over(wire);
        let send = || {
            client
                .get(gw.https("/api/devices"))
                .header("X-Authorization", format!("Bearer {token}"))
                .send()
        };
        let declines = gw.declines().await;
        assert_eq!(send().await.unwrap().status(), 200, "{wire:?}");
        // Applied below by hand, as the revocation path would.
        let _ = gw
            .running
            .store
            .end_session(session_id, keygate::clock::now_ms())
            .await
            .unwrap();
        gw.running
            .app
            .authenticator()
            .caches()
            .invalidate_session(session_id);
        let response = send().await.unwrap();
        assert_eq!(response.version(), wire.version());
        let (status, json) = error_body(response).await;
        assert_eq!(
            (status, json["errorCode"].as_u64()),
            (401, Some(11)),
            "{wire:?}"
        );
        gw.assert_lean_path_took(&declines, &[], &format!("{wire:?}"))
            .await;
    }
}

#[tokio::test]
async fn missing_and_malformed_credentials_are_authentication_failures() {
    let (upstream, gw) = common::gateway("").await;
    for wire in WIRES {
        let client = gw.client_over(wire);
        let declines = gw.declines().await;
        for header in [
            None,
            Some("Basic dXNlcjpwYXNz"),
            Some("ApiKey a,ApiKey b"),
            Some("Bearer  x"),
        ] {
            let mut request = client.get(gw.https("/api/devices"));
            if let Some(value) = header {
                request = request.header("X-Authorization", value);
            }
            let response = request.send().await.unwrap();
            assert_eq!(response.version(), wire.version());
            let (status, json) = error_body(response).await;
            assert_eq!(
                (status, json["errorCode"].as_u64()),
                (401, Some(10)),
                "{wire:?} {header:?}"
            );
            assert_eq!(json["message"], "Authentication failed");
        }
        gw.assert_lean_path_took(&declines, &[], &format!("{wire:?}"))
            .await;
    }
    assert!(upstream.requests().is_empty());
}

/// HTTP/1.1 only: the raw request line keeps its dot-segments, which an
/// HTTP client would resolve before sending.
#[tokio::test]
async fn dot_segments_cannot_reach_an_authenticated_route_through_a_public_prefix() {
    let (upstream, gw) = common::gateway("").await;
    let request =
        "GET /api/noauth/../tenant/devices HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n";
    let response = raw_http(gw.running.http.unwrap(), request).await;
    assert!(response.starts_with("HTTP/1.1 401"), "{response}");
    let request =
        "GET /api/noauth/..%2ftenant/devices HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n";
    let response = raw_http(gw.running.http.unwrap(), request).await;
    assert!(response.starts_with("HTTP/1.1 400"), "{response}");
    assert!(upstream.requests().is_empty());
}

#[tokio::test]
async fn unmatched_path_is_a_404_in_the_contract_shape() {
    let (_upstream, gw) = common::gateway("").await;
    for wire in WIRES {
        let response = gw
            .client_over(wire)
            .get(gw.https("/nothing/here"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), wire.version());
        let (status, json) = error_body(response).await;
        assert_eq!(
            (status, json["errorCode"].as_u64()),
            (404, Some(32)),
            "{wire:?}"
        );
    }
}

#[tokio::test]
async fn upstream_down_is_a_502_json() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let gw = Gateway::start(&url, "").await;
    for wire in WIRES {
        let declines = gw.declines().await;
        let response = gw
            .client_over(wire)
            .get(gw.https("/api/noauth/x"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), wire.version());
        let (status, json) = error_body(response).await;
        assert_eq!(
            (status, json["errorCode"].as_u64()),
            (502, Some(2)),
            "{wire:?}"
        );
        gw.assert_lean_path_took(&declines, &[], &format!("{wire:?}"))
            .await;
    }
    assert!(gw.metrics().await.contains(r#"kind="connect""#));
}

#[tokio::test]
async fn round_robin_skips_an_upstream_that_refuses_connections() {
    let upstream = Upstream::start().await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let extra = format!(
        "[[route]]\nprefix = \"/api/noauth/pool/\"\nupstreams = [\"{dead_url}\", \"{}\"]\npublic = true\n",
        upstream.url()
    );
    let gw = Gateway::start(&upstream.url(), &extra).await;
    for wire in WIRES {
        let client = gw.client_over(wire);
        let declines = gw.declines().await;
        for _ in 0..6 {
            let response = client
                .get(gw.https("/api/noauth/pool/x"))
                .send()
                .await
                .unwrap();
            assert_eq!(response.version(), wire.version());
            assert_eq!(
                response.status(),
                200,
                "{wire:?}: a bodyless request retries on the healthy upstream"
            );
        }
        gw.assert_lean_path_took(&declines, &[], &format!("{wire:?}"))
            .await;
    }
    assert_eq!(upstream.requests().len(), 12);
}

#[tokio::test]
async fn slow_upstream_is_a_504_json() {
    let (_upstream, gw) = common::gateway("").await;
    let user = gw.user("slow@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    for wire in WIRES {
        let declines = gw.declines().await;
        let response = gw
            .client_over(wire)
            .get(gw.https("/api/slow"))
            .header("X-Authorization", common::api_key_header(&key))
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), wire.version());
        let (status, json) = error_body(response).await;
        assert_eq!(
            (status, json["errorCode"].as_u64()),
            (504, Some(2)),
            "{wire:?}"
        );
        gw.assert_lean_path_took(&declines, &[], &format!("{wire:?}"))
            .await;
    }
}

#[tokio::test]
async fn one_mebibyte_body_streams_through() {
    let (upstream, gw) = common::gateway("").await;
    let user = gw.user("big@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    for wire in WIRES {
        let declines = gw.declines().await;
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
            (0..16).map(|_| Ok(vec![b'x'; 64 * 1024])).collect();
        let response = gw
            .client_over(wire)
            .post(gw.https("/api/device"))
            .header("X-Authorization", common::api_key_header(&key))
            .body(reqwest::Body::wrap_stream(futures_stream(chunks)))
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), wire.version());
        assert_eq!(response.status(), 200, "{wire:?}");
        let json: serde_json::Value = response.json().await.unwrap();
        assert_eq!(json["bodyLength"], 1024 * 1024, "{wire:?}");
        assert_eq!(upstream.last().body_len, 1024 * 1024, "{wire:?}");
        // Over HTTP/1.1 a streamed body is chunked: hyper's path, which
        // streams it, takes it from the lean path.
        let declined = gw.declines().await.since(&declines);
        let chunked = u64::from(wire == Wire::Http1);
        assert_eq!(declined.of_reason("transfer_encoding"), chunked, "{wire:?}");
    }
}

fn futures_stream(
    chunks: Vec<Result<Vec<u8>, std::io::Error>>,
) -> impl futures_util::Stream<Item = Result<Vec<u8>, std::io::Error>> + Send + 'static {
    futures_util::stream::iter(chunks)
}

#[tokio::test]
async fn oversized_body_and_headers_are_refused_with_413_and_431() {
    let (upstream, gw) = common::gateway("").await;
    for wire in WIRES {
        // A client of its own per request: over HTTP/1.1 a refused body
        // ends its connection.
        let client = || gw.client_over(wire);
        declared_oversize_is_413(&gw, wire).await;
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
            (0..48).map(|_| Ok(vec![b'x'; 64 * 1024])).collect();
        let response = client()
            .post(gw.https("/api/noauth/upload"))
            .body(reqwest::Body::wrap_stream(futures_stream(chunks)))
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), wire.version());
        assert_eq!(
            response.status(),
            413,
            "{wire:?}: a chunked body over the limit is cut off"
        );
        let response = client()
            .get(gw.https("/api/noauth/x"))
            .header("x-big", "y".repeat(9000))
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), wire.version());
        let (status, _) = error_body(response).await;
        assert_eq!(status, 431, "{wire:?}");
    }
    assert!(
        upstream
            .requests()
            .iter()
            .all(|r| r.body_len < 3 * 1024 * 1024)
    );
}

/// A body declared over the limit is refused with 413 before it is sent:
/// over HTTP/1.1 the head alone goes (a client writing on would meet the
/// connection's close before reading the answer); over HTTP/2 the whole
/// body, which the stream may finish.
async fn declared_oversize_is_413(gw: &Gateway, wire: Wire) {
    let length = 3 * 1024 * 1024;
    let status = match wire {
        Wire::Http1 => {
            let head = format!(
                "POST /api/noauth/upload HTTP/1.1\r\nHost: localhost\r\n\
                 Content-Length: {length}\r\n\r\n"
            );
            let answer = common::raw_https(gw, &head).await;
            assert!(answer.contains(r#""status":413"#), "{answer}");
            answer
                .split(' ')
                .nth(1)
                .unwrap_or_default()
                .parse()
                .unwrap_or(0)
        }
        Wire::Http2 => {
            let response = gw
                .client_over(wire)
                .post(gw.https("/api/noauth/upload"))
                .body(vec![0u8; length])
                .send()
                .await
                .unwrap();
            assert_eq!(response.version(), wire.version());
            error_body(response).await.0
        }
    };
    assert_eq!(status, 413, "{wire:?}");
}

#[tokio::test]
async fn http2_over_tls_works() {
    let (upstream, gw) = common::gateway("").await;
    let user = gw.user("h2@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    let response = gw
        .client()
        .get(gw.https("/api/devices"))
        .version(http::Version::HTTP_2)
        .header("X-Authorization", common::api_key_header(&key))
        .send()
        .await
        .unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.status(), 200);
    assert_eq!(
        upstream.last().headers["x-auth-user-id"],
        user.id.to_string()
    );
}

#[tokio::test]
async fn admin_listener_serves_health_readiness_and_metrics() {
    let (_upstream, gw) = common::gateway("").await;
    assert_eq!(
        reqwest::get(gw.admin("/healthz")).await.unwrap().status(),
        200
    );
    assert_eq!(
        reqwest::get(gw.admin("/readyz")).await.unwrap().status(),
        200
    );
    let metrics = gw.metrics().await;
    for name in [
        "keygate_build_info",
        "keygate_tls_certificate_expiry_timestamp_seconds",
        "keygate_cache_entries",
    ] {
        assert!(metrics.contains(name), "{name} missing");
    }
    gw.running.shutdown();
    let readyz = reqwest::get(gw.admin("/readyz")).await.unwrap();
    assert_eq!(
        readyz.status(),
        503,
        "unready as soon as shutdown starts, while still answering"
    );
}

#[tokio::test]
async fn api_browser_loads_without_credentials_and_can_be_turned_off() {
    let (upstream, gw) = common::gateway("").await;
    for wire in WIRES {
        let client = gw.client_over(wire);
        let page = client
            .get(gw.https("/swagger-ui.html"))
            .send()
            .await
            .unwrap();
        assert_eq!(page.version(), wire.version());
        assert_eq!(page.status(), 200, "{wire:?}");
        assert!(
            page.text()
                .await
                .unwrap()
                .contains("/swagger-ui/keygate-api-browser.js")
        );
        let doc: serde_json::Value = client
            .get(gw.https("/v3/api-docs"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(
            doc["paths"]["/api/auth/login"]["post"].is_object(),
            "{wire:?}"
        );
        assert!(doc["components"]["securitySchemes"]["HttpLoginForm"].is_object());
        let asset = client
            .get(gw.https("/swagger-ui/swagger-ui-bundle.js"))
            .send()
            .await
            .unwrap();
        assert_eq!(asset.headers()["content-type"], "application/javascript");
    }
    assert!(upstream.requests().is_empty());

    let off = Gateway::start(&upstream.url(), "[api_browser]\nenabled = false\n").await;
    for wire in WIRES {
        for path in ["/swagger-ui.html", "/v3/api-docs"] {
            let response = off.client_over(wire).get(off.https(path)).send().await;
            let (status, _) = error_body(response.unwrap()).await;
            assert_eq!(status, 404, "{wire:?} {path}");
        }
    }
}

/// keygate as a sidecar on plain HTTP behind a TLS-terminating ingress.
#[tokio::test]
async fn sidecar_behind_a_trusted_proxy_accepts_keys_only_from_that_proxy() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start(
        &upstream.url(),
        "[proxy]\ntrusted_proxies = [\"127.0.0.1/32\"]\n",
    )
    .await;
    let user = gw.user("sidecar@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    for wire in WIRES {
        behind_the_proxy(&upstream, &gw, &key, wire).await;
    }
}

/// The sidecar's rule over `wire` (HTTP/1.1, or h2c as an ingress may speak).
async fn behind_the_proxy(upstream: &Upstream, gw: &Gateway, key: &str, wire: Wire) {
    upstream.seen.lock().unwrap().clear();
    let from = |ip: [u8; 4]| {
        let builder = reqwest::Client::builder().local_address(std::net::IpAddr::from(ip));
        match wire {
            Wire::Http1 => builder.http1_only(),
            Wire::Http2 => builder.http2_prior_knowledge(),
        }
        .build()
        .unwrap()
    };
    let send = |client: reqwest::Client| {
        client
            .get(gw.http("/api/devices"))
            .header("X-Authorization", common::api_key_header(key))
            .header("X-Forwarded-Proto", "https")
            .header("X-Forwarded-For", "203.0.113.7")
            .header("X-Request-Id", "ingress-req-1")
            .send()
    };
    let declines = gw.declines().await;
    let trusted = send(from([127, 0, 0, 1])).await.unwrap();
    assert_eq!(trusted.version(), wire.version());
    assert_eq!(trusted.status(), 200, "{wire:?}");
    gw.assert_lean_path_took(&declines, &[], &format!("{wire:?} from the proxy"))
        .await;
    let seen = upstream.last().headers;
    assert_eq!(seen["x-forwarded-proto"], "https");
    assert_eq!(seen["x-forwarded-for"], "203.0.113.7, 127.0.0.1");
    assert_eq!(seen["x-request-id"], "ingress-req-1");

    let untrusted = send(from([127, 0, 0, 2])).await.unwrap();
    let (status, json) = error_body(untrusted).await;
    assert_eq!(
        (status, json["errorCode"].as_u64()),
        (403, Some(20)),
        "{wire:?}"
    );
    assert_eq!(
        upstream.requests().len(),
        1,
        "{wire:?}: the untrusted request was not forwarded"
    );
}

#[tokio::test]
async fn trace_context_passes_through_unchanged() {
    let (upstream, gw) = common::gateway("").await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    for wire in WIRES {
        let declines = gw.declines().await;
        let response = gw
            .client_over(wire)
            .get(gw.https("/api/noauth/trace"))
            .header("traceparent", traceparent)
            .header("tracestate", "vendor=opaque")
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), wire.version());
        assert_eq!(response.status(), 200, "{wire:?}");
        let seen = upstream.last_to("/api/noauth/trace").headers;
        assert_eq!(seen["traceparent"], traceparent, "{wire:?}");
        assert_eq!(seen["tracestate"], "vendor=opaque", "{wire:?}");
        gw.assert_lean_path_took(&declines, &[], &format!("{wire:?}"))
            .await;
    }
}

/// `promtool check metrics` finds nothing to complain about. CI installs
/// promtool; elsewhere the check says it was skipped when it is missing.
#[tokio::test]
async fn metrics_pass_promtool_check() {
    let (_upstream, gw) = common::gateway("").await;
    let user = gw.user("metrics@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    for wire in WIRES {
        let client = gw.client_over(wire);
        for header in [
            common::api_key_header(&key),
            "ApiKey tb_unknown".into(),
            "Bogus x".into(),
        ] {
            client
                .get(gw.https("/api/devices"))
                .header("X-Authorization", header)
                .send()
                .await
                .unwrap();
        }
    }
    let text = gw.metrics().await;
    let Ok(mut child) = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    else {
        common::skipped_without("promtool", "promtool check metrics");
        return;
    };
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && report.trim().is_empty(),
        "promtool:\n{report}"
    );
}

#[tokio::test]
async fn an_upstream_with_a_broken_openapi_document_never_breaks_the_page() {
    let upstream = Upstream::start().await;
    // The recording upstream answers JSON that is not an OpenAPI document.
    let extra = format!(
        "[[route]]\nprefix = \"/broken/\"\nupstreams = [\"{}\"]\nopenapi = \"/v3/api-docs\"\n",
        upstream.url()
    );
    let gw = Gateway::start(&upstream.url(), &extra).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !upstream
        .requests()
        .iter()
        .any(|r| r.path_and_query == "/v3/api-docs")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the document was not fetched"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    for wire in WIRES {
        let response = gw
            .client_over(wire)
            .get(gw.https("/v3/api-docs"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), wire.version());
        assert_eq!(response.status(), 200, "{wire:?}");
        let doc: serde_json::Value = response.json().await.unwrap();
        assert!(
            doc["paths"]["/api/auth/user"]["get"].is_object(),
            "{wire:?}: keygate's own paths stay"
        );
    }
}

/// Over HTTP/2 a body refused for its size gets the 413 JSON answer, and the
/// client may finish its upload (up to twice the limit) instead of meeting a
/// stream reset before it reads the answer: on the proxied path and on the
/// owned endpoints, declared or streamed.
#[tokio::test]
async fn http2_oversized_body_gets_a_413_json_answer() {
    use futures_util::StreamExt as _;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (upstream, gw) = common::gateway("").await;
    let h2c = reqwest::Client::builder()
        .http2_prior_knowledge()
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .unwrap();
    for (client, url) in [
        (gw.client(), gw.https("/api/noauth/upload")),
        (h2c.clone(), gw.http("/api/noauth/upload")),
        (gw.client(), gw.https("/api/auth/login")),
        (h2c.clone(), gw.http("/api/auth/login")),
    ] {
        let response = client
            .post(&url)
            .body(vec![b'x'; 3 * 1024 * 1024])
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), http::Version::HTTP_2, "{url}");
        let (status, json) = error_body(response).await;
        assert_eq!(
            (status, json["errorCode"].as_u64()),
            (413, Some(31)),
            "{url}"
        );

        // 3.5 MiB streamed: past what the limit (2 MiB) and one flow-control
        // window (1 MiB) let through unread.
        const CHUNKS: usize = 56;
        let pulled = Arc::new(AtomicUsize::new(0));
        let counter = pulled.clone();
        let chunks = futures_util::stream::iter(0..CHUNKS).map(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(vec![b'x'; 64 * 1024])
        });
        let response = client
            .post(&url)
            .body(reqwest::Body::wrap_stream(chunks))
            .send()
            .await
            .unwrap();
        let (status, _) = error_body(response).await;
        assert_eq!(status, 413, "{url}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while pulled.load(Ordering::SeqCst) < CHUNKS {
            assert!(
                std::time::Instant::now() < deadline,
                "{url}: the upload was cut off after {} of {CHUNKS} chunks",
                pulled.load(Ordering::SeqCst)
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
    assert!(
        upstream
            .requests()
            .iter()
            .all(|r| r.body_len <= 2 * 1024 * 1024)
    );
    // curl (nghttp2) gives up on a stream reset while it still uploads; it is
    // the client that showed the problem. Checked where it is installed.
    let file = gw.dir.path().join("upload.bin");
    std::fs::write(&file, vec![b'x'; 3 * 1024 * 1024]).unwrap();
    for path in ["/api/noauth/upload", "/api/auth/login"] {
        let mut curl = std::process::Command::new("curl");
        curl.args(["-sS", "--http2-prior-knowledge", "--max-time", "10"])
            .arg("--data-binary")
            .arg(format!("@{}", file.display()))
            .args(["-w", "\n%{http_version} %{http_code}"])
            .arg(gw.http(path));
        // Off the runtime thread, which also serves the gateway.
        let Ok(out) = tokio::task::spawn_blocking(move || curl.output())
            .await
            .unwrap()
        else {
            common::skipped_without("curl", "the HTTP/2 413 answer to curl");
            return;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.ends_with("\n2 413") && text.contains(r#""status":413"#),
            "{path}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
