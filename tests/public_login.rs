//! `POST /api/auth/login/public` end to end: a public customer's public
//! user gets the token pair the platform issues it, opens what a customer
//! user may open upstream (as itself: marked public in the headers, or as
//! the platform's public user on `identity = "platform"` routes), and none
//! of keygate's account endpoints.

mod common;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use common::platform::{NULL_UUID, PlatformDouble};
use common::{Gateway, Upstream, error_body};
use keygate::identity::Authority;
use keygate::store::PublicCustomer;
use serde_json::{Value, json};
use uuid::Uuid;

/// `[platform] public_customers` with one customer of one tenant.
fn configured(customer: Uuid, tenant: Uuid) -> String {
    format!(
        "[platform]\npublic_customers = [{{ customer_id = \"{customer}\", tenant_id = \"{tenant}\" }}]\n"
    )
}

async fn public_login(gw: &Gateway, body: Value) -> reqwest::Response {
    gw.client()
        .post(gw.https("/api/auth/login/public"))
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// The token pair of a public login that must succeed.
async fn pair(gw: &Gateway, public_id: Uuid) -> (String, String) {
    let response = public_login(gw, json!({ "publicId": public_id.to_string() })).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    (
        body["token"].as_str().unwrap().to_owned(),
        body["refreshToken"].as_str().unwrap().to_owned(),
    )
}

fn claims(token: &str) -> Value {
    let part = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
}

async fn call(gw: &Gateway, method: reqwest::Method, path: &str, token: &str) -> reqwest::Response {
    gw.client()
        .request(method, gw.https(path))
        .header("X-Authorization", format!("Bearer {token}"))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_public_customer_gets_the_token_pair_the_platform_issues() {
    let (customer, tenant) = (Uuid::new_v4(), Uuid::new_v4());
    let upstream = Upstream::start().await;
    let gw = Gateway::start(&upstream.url(), &configured(customer, tenant)).await;
    let (access, refresh) = pair(&gw, customer).await;
    let access = claims(&access);
    assert_eq!(access["isPublic"], true);
    assert_eq!(access["sub"], customer.to_string());
    assert_eq!(access["userId"], NULL_UUID);
    assert_eq!(access["scopes"], json!(["CUSTOMER_USER"]));
    assert_eq!(access["tenantId"], tenant.to_string());
    assert_eq!(access["customerId"], customer.to_string());
    assert_eq!(access["firstName"], "Public");
    assert_eq!(access["lastName"], "Public");
    assert_eq!(access["enabled"], true);
    let refresh = claims(&refresh);
    assert_eq!(refresh["isPublic"], true);
    assert_eq!(refresh["sub"], customer.to_string());
    assert_eq!(refresh["scopes"], json!(["REFRESH_TOKEN"]));
    assert_eq!(refresh["sessionId"], access["sessionId"]);
    assert!(
        common::counter(
            &gw.metrics().await,
            "keygate_login_attempts_total{outcome=\"public_success\"}"
        ) >= 1
    );
}

#[tokio::test]
async fn unknown_and_non_public_ids_are_refused_as_the_platform_refuses_them() {
    let (customer, tenant) = (Uuid::new_v4(), Uuid::new_v4());
    let upstream = Upstream::start().await;
    let gw = Gateway::start(&upstream.url(), &configured(customer, tenant)).await;
    // A customer keygate knows (it has a user) that is not public.
    let private = gw
        .user("private@public.test", Authority::CustomerUser)
        .await;
    for public_id in [
        Uuid::new_v4().to_string(),
        private.customer_id.to_string(),
        NULL_UUID.to_owned(),
        "not-a-uuid".to_owned(),
    ] {
        let (status, body) =
            error_body(public_login(&gw, json!({ "publicId": public_id })).await).await;
        assert_eq!(status, 401, "{public_id}");
        assert_eq!(
            body["message"], "Invalid username or password",
            "{public_id}"
        );
        assert_eq!(body["errorCode"], 10);
    }
    for body in [
        json!({}),
        json!({ "publicId": "  " }),
        json!({ "publicId": 7 }),
        json!([1]),
    ] {
        let (status, answer) = error_body(public_login(&gw, body.clone()).await).await;
        assert_eq!(
            (status, answer["message"].as_str()),
            (401, Some("Authentication failed")),
            "{body}"
        );
    }
    let wrong_method = gw
        .client()
        .get(gw.https("/api/auth/login/public"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_method.status(), 405);
    assert_eq!(upstream.arrived(), 0, "never forwarded");
}

#[tokio::test]
async fn a_public_token_is_refused_on_every_account_endpoint() {
    let (customer, tenant) = (Uuid::new_v4(), Uuid::new_v4());
    let upstream = Upstream::start().await;
    let gw = Gateway::start(&upstream.url(), &configured(customer, tenant)).await;
    let (token, _) = pair(&gw, customer).await;
    use reqwest::Method;
    for (method, path) in [
        (Method::POST, "/api/auth/changePassword".to_owned()),
        (Method::POST, "/api/apiKey".to_owned()),
        (
            Method::GET,
            format!("/api/apiKeys/{NULL_UUID}?pageSize=10&page=0"),
        ),
        (
            Method::POST,
            "/api/2fa/account/config/generate?providerType=TOTP".to_owned(),
        ),
        (Method::GET, "/api/2fa/account/settings".to_owned()),
        (Method::POST, "/api/user".to_owned()),
        (Method::GET, format!("/api/user/{NULL_UUID}")),
        (Method::GET, "/api/users?pageSize=10&page=0".to_owned()),
        (
            Method::GET,
            "/api/userInfos/all?pageSize=10&page=0".to_owned(),
        ),
        (
            Method::GET,
            format!("/api/customer/{customer}/userInfos?pageSize=10&page=0"),
        ),
    ] {
        let (status, body) = error_body(call(&gw, method.clone(), &path, &token).await).await;
        assert_eq!(status, 403, "{method} {path}: {body}");
        assert_eq!(body["errorCode"], 20);
    }
    // Who it is, as its token names it.
    let me = call(&gw, Method::GET, "/api/auth/user", &token).await;
    assert_eq!(me.status(), 200);
    let me: Value = me.json().await.unwrap();
    assert_eq!(me["id"]["id"], NULL_UUID);
    assert_eq!(me["email"], customer.to_string());
    assert_eq!(me["authority"], "CUSTOMER_USER");
    assert_eq!(me["customerId"]["id"], customer.to_string());
    assert_eq!(me["firstName"], "Public");
    assert_eq!(upstream.arrived(), 0);
}

#[tokio::test]
async fn a_public_token_reaches_headers_routes_marked_public_and_clients_cannot_claim_it() {
    let (customer, tenant) = (Uuid::new_v4(), Uuid::new_v4());
    let upstream = Upstream::start().await;
    let gw = Gateway::start(&upstream.url(), &configured(customer, tenant)).await;
    let (token, _) = pair(&gw, customer).await;
    let response = gw
        .client()
        .get(gw.https("/api/dashboard/1"))
        .header("X-Authorization", format!("Bearer {token}"))
        .header("X-Auth-Public", "false")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let h = upstream.last_to("/api/dashboard/1").headers;
    assert_eq!(h["x-auth-public"], "true");
    assert_eq!(h.get_all("x-auth-public").iter().count(), 1);
    assert_eq!(h["x-auth-user-id"], NULL_UUID);
    assert_eq!(h["x-auth-customer-id"], customer.to_string());
    assert_eq!(h["x-auth-tenant-id"], tenant.to_string());
    assert_eq!(h["x-auth-authority"], "CUSTOMER_USER");
    // A real user who sends the header claims nothing.
    let user = gw.user("real@public.test", Authority::CustomerUser).await;
    let (_, real) = gw.access_token(&user).await;
    gw.client()
        .get(gw.https("/api/dashboard/2"))
        .header("X-Authorization", format!("Bearer {real}"))
        .header("X-Auth-Public", "true")
        .header("x_auth_public", "true")
        .send()
        .await
        .unwrap();
    let h = upstream.last_to("/api/dashboard/2").headers;
    assert!(
        h.get("x-auth-public").is_none() && h.get("x_auth_public").is_none(),
        "{h:?}"
    );
    assert_eq!(h["x-auth-user-id"], user.id.to_string());
}

#[tokio::test]
async fn a_public_refresh_holds_only_while_the_customer_is_public() {
    let (customer, tenant) = (Uuid::new_v4(), Uuid::new_v4());
    let upstream = Upstream::start().await;
    let gw = Gateway::start(&upstream.url(), "").await;
    let store = &gw.running.store;
    let public = PublicCustomer {
        customer_id: customer,
        tenant_id: tenant,
    };
    store
        .replace_public_customers(&[public], keygate::clock::now_ms())
        .await
        .unwrap();
    let (_, refresh) = pair(&gw, customer).await;
    let refreshed = gw
        .client()
        .post(gw.https("/api/auth/token"))
        .json(&json!({ "refreshToken": refresh }))
        .send()
        .await
        .unwrap();
    assert_eq!(refreshed.status(), 200);
    let body: Value = refreshed.json().await.unwrap();
    let access = claims(body["token"].as_str().unwrap());
    assert_eq!(
        (access["isPublic"].clone(), access["sub"].clone()),
        (json!(true), json!(customer.to_string()))
    );
    // The platform stops marking it public: the next import empties the set.
    store
        .replace_public_customers(&[], keygate::clock::now_ms())
        .await
        .unwrap();
    let (status, body) = error_body(
        gw.client()
            .post(gw.https("/api/auth/token"))
            .json(&json!({ "refreshToken": body["refreshToken"] }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 401, "{body}");
    let (status, _) =
        error_body(public_login(&gw, json!({ "publicId": customer.to_string() })).await).await;
    assert_eq!(status, 401);
}

/// The platform's `tokenSigningKey` in these tests (512 bits).
fn platform_key() -> String {
    STANDARD.encode((0u8..64).map(|b| b.wrapping_mul(41)).collect::<Vec<_>>())
}

#[tokio::test]
async fn platform_routes_carry_the_platforms_public_user_and_never_mix_it_with_a_real_user() {
    let double = PlatformDouble::start(&platform_key()).await;
    let (first, second, tenant) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let extra = format!(
        r#"
[platform]
signing_key = "{key}"
public_customers = [
  {{ customer_id = "{first}", tenant_id = "{tenant}" }},
  {{ customer_id = "{second}", tenant_id = "{tenant}" }},
]
[[route]]
name = "platform"
prefix = "/api/tb/"
identity = "platform"
upstreams = ["{url}"]
"#,
        key = platform_key(),
        url = double.url()
    );
    let gw = Gateway::start(&double.url(), &extra).await;
    let seen_as = |token: String| {
        let gw = &gw;
        async move {
            let response = gw
                .client()
                .get(gw.https("/api/tb/user"))
                .header("X-Authorization", format!("Bearer {token}"))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200, "the platform accepted it");
            response.json::<Value>().await.unwrap()
        }
    };
    for customer in [first, second, first] {
        let (token, _) = pair(&gw, customer).await;
        let user = seen_as(token).await;
        assert_eq!(user["isPublic"], true, "{user}");
        assert_eq!(user["email"], customer.to_string(), "sub is the public id");
        assert_eq!(user["id"], NULL_UUID);
        assert_eq!(user["authority"], "CUSTOMER_USER");
        assert_eq!(user["customerId"], customer.to_string());
        assert_eq!(user["tenantId"], tenant.to_string());
        assert_eq!(user["firstName"], "Public");
    }
    let real = gw
        .user("real@platform-public.test", Authority::CustomerUser)
        .await;
    let (_, token) = gw.access_token(&real).await;
    let user = seen_as(token).await;
    assert_eq!(user["isPublic"], false);
    assert_eq!(user["id"], real.id.to_string());
    assert_eq!(user["email"], "real@platform-public.test");
}
