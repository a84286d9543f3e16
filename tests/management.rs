//! API keys and users over REST, with the authority matrix, end to end.
//! The API keys' behaviours run their one body over both wires
//! ([`common::WIRES`]): HTTP/1.1 (the lean path for a key's proxied use,
//! hyper's for keygate's own endpoints) and HTTP/2.

mod common;

use std::time::Duration;

use common::{Gateway, Upstream, WIRES, Wire, error_body, plain_client_over};
use keygate::identity::Authority;
use keygate::store::UserRecord;
use serde_json::{Value, json};
use uuid::Uuid;

/// A user of the test, an access token for them, and the wire their
/// requests take.
struct Actor {
    user: UserRecord,
    bearer: String,
    wire: Wire,
}

async fn actor(gw: &Gateway, user: UserRecord) -> Actor {
    let (_, token) = gw.access_token(&user).await;
    Actor {
        user,
        bearer: format!("Bearer {token}"),
        wire: Wire::Http2,
    }
}

impl Actor {
    /// The same user and token, over `wire`.
    fn over(&self, wire: Wire) -> Actor {
        Actor {
            user: self.user.clone(),
            bearer: self.bearer.clone(),
            wire,
        }
    }
}

async fn call(
    gw: &Gateway,
    who: &Actor,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> reqwest::Response {
    let mut request = gw
        .client_over(who.wire)
        .request(method, gw.https(path))
        .header("X-Authorization", &who.bearer);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.version(), who.wire.version(), "{path}");
    response
}

async fn create_key(gw: &Gateway, who: &Actor, owner: Uuid) -> reqwest::Response {
    let body = json!({"userId": {"entityType": "USER", "id": owner}, "description": "ci key", "enabled": true, "expirationTime": 0});
    call(gw, who, reqwest::Method::POST, "/api/apiKey", Some(body)).await
}

/// A proxied request with the key `value` over `wire` (over HTTP/1.1, one
/// the lean path takes).
async fn use_key_over(gw: &Gateway, wire: Wire, value: &str) -> reqwest::Response {
    let response = gw
        .client_over(wire)
        .get(gw.https("/api/devices"))
        .header("X-Authorization", common::api_key_header(value))
        .send()
        .await
        .unwrap();
    assert_eq!(response.version(), wire.version());
    response
}

async fn use_key(gw: &Gateway, value: &str) -> reqwest::Response {
    use_key_over(gw, Wire::Http2, value).await
}

#[tokio::test]
async fn api_key_lifecycle_create_use_disable_enable_delete() {
    let (_upstream, gw) = common::gateway("").await;
    for wire in WIRES {
        let email = format!("owner-{wire:?}@example.com").to_lowercase();
        let me = actor(&gw, gw.user(&email, Authority::TenantAdmin).await).await;
        let declines = gw.declines().await;
        key_lifecycle(&gw, &me.over(wire)).await;
        // The key's proxied uses were the lean path's; keygate's own
        // endpoints are hyper's.
        gw.assert_lean_path_took(&declines, &["not_proxied"], &format!("{wire:?}"))
            .await;
    }
}

/// `me` creates a key, uses it, disables, enables, renames, lists and
/// deletes it, over `me`'s wire.
async fn key_lifecycle(gw: &Gateway, me: &Actor) {
    let wire = me.wire;

    let response = create_key(gw, me, me.user.id).await;
    assert_eq!(response.status(), 200);
    let record: Value = response.json().await.unwrap();
    let value = record["value"].as_str().unwrap().to_string();
    let id = record["id"]["id"].as_str().unwrap().to_string();
    assert!(value.starts_with("tb_"));
    assert_eq!(record["id"]["entityType"], "API_KEY");
    assert_eq!(record["userId"]["id"], me.user.id.to_string());
    assert_eq!(record["tenantId"]["id"], me.user.tenant_id.to_string());
    assert_eq!(
        (record["enabled"].as_bool(), record["expired"].as_bool()),
        (Some(true), Some(false))
    );
    assert_eq!(record["expirationTime"], 0);

    assert_eq!(use_key_over(gw, wire, &value).await.status(), 200);
    let disabled = call(
        gw,
        me,
        reqwest::Method::PUT,
        &format!("/api/apiKey/{id}/enabled/false"),
        None,
    )
    .await;
    assert_eq!(disabled.json::<Value>().await.unwrap()["enabled"], false);
    let (status, json) = error_body(use_key_over(gw, wire, &value).await).await;
    assert_eq!(
        (status, json["message"].as_str()),
        (401, Some("User account is not active"))
    );
    call(
        gw,
        me,
        reqwest::Method::PUT,
        &format!("/api/apiKey/{id}/enabled/true"),
        None,
    )
    .await;
    assert_eq!(use_key_over(gw, wire, &value).await.status(), 200);
    rename_list_delete(gw, me, &id, &value).await;
}

/// `me` renames, lists and deletes the key `id` (of value `value`).
async fn rename_list_delete(gw: &Gateway, me: &Actor, id: &str, value: &str) {
    let wire = me.wire;
    let described = gw
        .client_over(wire)
        .put(gw.https(&format!("/api/apiKey/{id}/description")))
        .header("X-Authorization", &me.bearer)
        .header("content-type", "text/plain")
        .body("renamed key")
        .send()
        .await
        .unwrap();
    assert_eq!(
        described.json::<Value>().await.unwrap()["description"],
        "renamed key"
    );

    let page: Value = call(
        gw,
        me,
        reqwest::Method::GET,
        &format!("/api/apiKeys/{}?pageSize=10&page=0", me.user.id),
        None,
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(page["totalElements"], 1);
    assert_eq!(page["hasNext"], false);
    assert_eq!(page["data"][0]["description"], "renamed key");
    assert!(
        page["data"][0].get("value").is_none(),
        "the value is shown only once"
    );

    let deleted = call(
        gw,
        me,
        reqwest::Method::DELETE,
        &format!("/api/apiKey/{id}"),
        None,
    )
    .await;
    assert_eq!(deleted.status(), 200);
    let (status, json) = error_body(use_key_over(gw, wire, value).await).await;
    assert_eq!(
        (status, json["message"].as_str()),
        (401, Some("Invalid username or password"))
    );
    let (status, json) = error_body(
        call(
            gw,
            me,
            reqwest::Method::DELETE,
            &format!("/api/apiKey/{id}"),
            None,
        )
        .await,
    )
    .await;
    assert_eq!((status, json["errorCode"].as_u64()), (404, Some(32)));
}

#[tokio::test]
async fn every_change_over_rest_is_stored_as_an_audit_event_naming_its_actor() {
    let (_upstream, gw) = common::gateway("").await;
    for wire in WIRES {
        let email = format!("auditor-{wire:?}@example.com").to_lowercase();
        let me = actor(&gw, gw.user(&email, Authority::TenantAdmin).await).await;
        audited_changes(&gw, &me.over(wire)).await;
    }
}

/// `me`'s key changes over `me`'s wire, each an audit event naming `me`;
/// a refused one none.
async fn audited_changes(gw: &Gateway, me: &Actor) {
    let wire = me.wire;
    let record: Value = create_key(gw, me, me.user.id).await.json().await.unwrap();
    let id = record["id"]["id"].as_str().unwrap().to_string();
    for path in [
        format!("/api/apiKey/{id}/enabled/false"),
        format!("/api/apiKey/{id}/enabled/true"),
    ] {
        let response = call(gw, me, reqwest::Method::PUT, &path, None).await;
        assert_eq!(response.status(), 200, "{wire:?}");
    }
    // Refused changes leave no event.
    let other = Uuid::new_v4();
    let missing = call(
        gw,
        me,
        reqwest::Method::DELETE,
        &format!("/api/apiKey/{other}"),
        None,
    )
    .await;
    assert_eq!(missing.status(), 404);
    let deleted = call(
        gw,
        me,
        reqwest::Method::DELETE,
        &format!("/api/apiKey/{id}"),
        None,
    )
    .await;
    assert_eq!(deleted.status(), 200);

    let events: Vec<_> = gw
        .running
        .store
        .audit_events(100)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.actor_id == me.user.id)
        .collect();
    let actions: Vec<&str> = events.iter().rev().map(|e| e.action.as_str()).collect();
    assert_eq!(
        actions,
        [
            "api_key.create",
            "api_key.disable",
            "api_key.enable",
            "api_key.delete"
        ],
        "{wire:?}"
    );
    for event in &events {
        assert_eq!(event.actor_id, me.user.id);
        assert_eq!(event.actor, me.user.email);
        assert_eq!(event.tenant_id, me.user.tenant_id);
        assert_eq!(
            (event.target_type.as_str(), event.target_id.to_string()),
            ("API_KEY", id.clone())
        );
    }
}

#[tokio::test]
async fn api_key_authority_matrix_own_same_tenant_other_tenant_sys_admin() {
    let (_upstream, gw) = common::gateway("").await;
    let sys = actor(
        &gw,
        gw.running
            .store
            .user_by_email("sysadmin@keygate.local")
            .await
            .unwrap()
            .unwrap(),
    )
    .await;
    let admin_a = actor(
        &gw,
        gw.user("admin-a@example.com", Authority::TenantAdmin).await,
    )
    .await;
    let mut customer = gw.user("cust-a@example.com", Authority::CustomerUser).await;
    // Put the customer into tenant A.
    let _ = gw.running.store.delete_user(customer.id).await.unwrap(); // uncached; inserted again
    customer.tenant_id = admin_a.user.tenant_id;
    // A customer id of tenant A's own: the first one stays with its tenant.
    customer.customer_id = Uuid::new_v4();
    customer.id = Uuid::new_v4();
    gw.running.store.insert_user(&customer).await.unwrap();
    let customer = actor(&gw, customer).await;
    let admin_b = actor(
        &gw,
        gw.user("admin-b@example.com", Authority::TenantAdmin).await,
    )
    .await;

    for wire in WIRES {
        let over = |who: &Actor| who.over(wire);
        authority_matrix(&gw, [&sys, &admin_a, &customer, &admin_b].map(over)).await;
    }
}

/// Who may create and change whose keys, over the actors' wire.
async fn authority_matrix(gw: &Gateway, [sys, admin_a, customer, admin_b]: [Actor; 4]) {
    let (sys, admin_a, customer, admin_b) = (&sys, &admin_a, &customer, &admin_b);
    let wire = sys.wire;
    let status = |r: reqwest::Response| r.status().as_u16();
    // own
    assert_eq!(
        status(create_key(gw, customer, customer.user.id).await),
        200,
        "{wire:?}"
    );
    assert_eq!(
        status(create_key(gw, admin_b, admin_b.user.id).await),
        200,
        "{wire:?}"
    );
    // same tenant: an admin manages the tenant's users; a customer user only
    // themselves, and does not even learn that other users exist
    assert_eq!(
        status(create_key(gw, admin_a, customer.user.id).await),
        200,
        "{wire:?}"
    );
    assert_eq!(
        status(create_key(gw, customer, admin_a.user.id).await),
        404,
        "{wire:?}"
    );
    // other tenant: invisible
    assert_eq!(
        status(create_key(gw, admin_b, customer.user.id).await),
        404,
        "{wire:?}"
    );
    let listing = call(
        gw,
        admin_b,
        reqwest::Method::GET,
        &format!("/api/apiKeys/{}?pageSize=5&page=0", customer.user.id),
        None,
    )
    .await;
    let (code, json) = error_body(listing).await;
    assert_eq!(
        (code, json["errorCode"].as_u64()),
        (404, Some(32)),
        "{wire:?}"
    );
    // SYS_ADMIN manages everyone; tenant admins cannot see a SYS_ADMIN
    assert_eq!(
        status(create_key(gw, sys, admin_b.user.id).await),
        200,
        "{wire:?}"
    );
    assert_eq!(
        status(create_key(gw, admin_a, sys.user.id).await),
        404,
        "{wire:?}"
    );
    // key-addressed calls follow the owner
    let record: Value = create_key(gw, admin_a, admin_a.user.id)
        .await
        .json()
        .await
        .unwrap();
    let id = record["id"]["id"].as_str().unwrap();
    let path = format!("/api/apiKey/{id}/enabled/false");
    let (code, json) =
        error_body(call(gw, customer, reqwest::Method::PUT, &path, None).await).await;
    assert_eq!(
        (code, json["errorCode"].as_u64()),
        (404, Some(32)),
        "{wire:?}: a customer user does not learn that its admin's key exists"
    );
    assert_eq!(
        status(call(gw, admin_b, reqwest::Method::PUT, &path, None).await),
        404,
        "{wire:?}"
    );
    assert_eq!(
        status(call(gw, sys, reqwest::Method::PUT, &path, None).await),
        200,
        "{wire:?}"
    );
}

#[tokio::test]
async fn bad_key_requests_are_400_naming_the_field_and_expired_keys_are_refused() {
    let (_upstream, gw) = common::gateway("").await;
    let me = actor(
        &gw,
        gw.user("bad@example.com", Authority::TenantAdmin).await,
    )
    .await;
    for wire in WIRES {
        bad_key_requests_are_400(&gw, &me.over(wire)).await;
    }
    // Long enough for a loaded machine to use it first; the use is checked
    // to have started before the expiration time.
    let soon = keygate::clock::now_ms() + 10_000;
    let body =
        json!({"userId": {"id": me.user.id}, "description": "short-lived", "expirationTime": soon});
    let record: Value = call(&gw, &me, reqwest::Method::POST, "/api/apiKey", Some(body))
        .await
        .json()
        .await
        .unwrap();
    let value = record["value"].as_str().unwrap();
    let used_at = keygate::clock::now_ms();
    for wire in WIRES {
        let response = use_key_over(&gw, wire, value).await;
        assert_eq!(response.status(), 200, "{wire:?}");
    }
    assert!(
        used_at < soon,
        "used only after it expired: nothing checked"
    );
    while keygate::clock::now_ms() <= soon {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for wire in WIRES {
        let (code, json) = error_body(use_key_over(&gw, wire, value).await).await;
        assert_eq!(
            (code, json["message"].as_str()),
            (401, Some("API key is expired")),
            "{wire:?}"
        );
    }
}

/// Key requests with a bad field, id or page, each a 400, over `me`'s wire.
async fn bad_key_requests_are_400(gw: &Gateway, me: &Actor) {
    let wire = me.wire;
    for (body, field) in [
        (json!({"description": "x"}), "userId"),
        (
            json!({"userId": {"id": me.user.id}, "description": "x".repeat(256)}),
            "description",
        ),
        (
            json!({"userId": {"id": me.user.id}, "description": "x", "expirationTime": 1000}),
            "expirationTime",
        ),
        (
            json!({"userId": {"id": "not-a-uuid"}, "description": "x"}),
            "UUID",
        ),
    ] {
        let (code, json) =
            error_body(call(gw, me, reqwest::Method::POST, "/api/apiKey", Some(body)).await).await;
        assert_eq!(
            (code, json["errorCode"].as_u64()),
            (400, Some(31)),
            "{wire:?} {json}"
        );
        assert!(
            json["message"].as_str().unwrap().contains(field),
            "{wire:?} {field}: {json}"
        );
    }
    let (code, _) = error_body(
        call(
            gw,
            me,
            reqwest::Method::PUT,
            "/api/apiKey/not-a-uuid/enabled/true",
            None,
        )
        .await,
    )
    .await;
    assert_eq!(code, 400, "{wire:?}");
    let (code, _) = error_body(
        call(
            gw,
            me,
            reqwest::Method::GET,
            &format!("/api/apiKeys/{}", me.user.id),
            None,
        )
        .await,
    )
    .await;
    assert_eq!(code, 400, "{wire:?}: pageSize is required");
}

#[tokio::test]
async fn users_are_provisioned_over_rest_and_activate_into_a_working_login() {
    let (_upstream, gw) = common::gateway("").await;
    let sys = actor(
        &gw,
        gw.running
            .store
            .user_by_email("sysadmin@keygate.local")
            .await
            .unwrap()
            .unwrap(),
    )
    .await;
    let tenant = Uuid::new_v4();
    let body = json!({"email": "New.Admin@example.com", "authority": "TENANT_ADMIN", "tenantId": {"entityType": "TENANT", "id": tenant}, "firstName": "Nia"});
    let created: Value = call(&gw, &sys, reqwest::Method::POST, "/api/user", Some(body))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(created["email"], "new.admin@example.com");
    assert_eq!(created["tenantId"]["id"], tenant.to_string());
    let id = created["id"]["id"].as_str().unwrap().to_string();

    let link = call(
        &gw,
        &sys,
        reqwest::Method::GET,
        &format!("/api/user/{id}/activationLink"),
        None,
    )
    .await
    .text()
    .await
    .unwrap();
    let token = link.split("activateToken=").nth(1).unwrap();
    let https = gw.running.https.unwrap();
    assert!(
        link.starts_with(&format!(
            "https://{https}/api/noauth/activate?activateToken="
        )),
        "links point at keygate's own listener: {link}"
    );
    let activate = |password: &'static str, token: String| {
        gw.client()
            .post(gw.https("/api/noauth/activate"))
            .json(&json!({"activateToken": token, "password": password}))
            .send()
    };
    let (code, _) = error_body(activate("short", token.to_string()).await.unwrap()).await;
    assert_eq!(code, 400, "the password policy applies");
    let response = activate("activated-password", token.to_string())
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let pair: Value = response.json().await.unwrap();
    assert!(pair["token"].is_string() && pair["refreshToken"].is_string());
    let (code, _) = error_body(
        activate("activated-password", token.to_string())
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 400, "an activation token works once");
    let login = gw
        .client()
        .post(gw.https("/api/auth/login"))
        .json(&json!({"username": "new.admin@example.com", "password": "activated-password"}))
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 200);

    // The new tenant admin provisions within their tenant only.
    let new_admin = actor(
        &gw,
        gw.running
            .store
            .user_by_email("new.admin@example.com")
            .await
            .unwrap()
            .unwrap(),
    )
    .await;
    let customer = json!({"email": "cu@example.com", "authority": "CUSTOMER_USER", "customerId": {"id": Uuid::new_v4()}});
    let created: Value = call(
        &gw,
        &new_admin,
        reqwest::Method::POST,
        "/api/user",
        Some(customer),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(created["tenantId"]["id"], tenant.to_string());
    let sys_body = json!({"email": "evil@example.com", "authority": "SYS_ADMIN"});
    assert_eq!(
        call(
            &gw,
            &new_admin,
            reqwest::Method::POST,
            "/api/user",
            Some(sys_body)
        )
        .await
        .status(),
        403
    );
    let other = json!({"email": "o@example.com", "authority": "TENANT_ADMIN", "tenantId": {"id": Uuid::new_v4()}});
    assert_eq!(
        call(
            &gw,
            &new_admin,
            reqwest::Method::POST,
            "/api/user",
            Some(other)
        )
        .await
        .status(),
        403
    );
    let dup = json!({"email": "cu@example.com", "authority": "CUSTOMER_USER", "customerId": {"id": Uuid::new_v4()}});
    let (code, json) = error_body(
        call(
            &gw,
            &new_admin,
            reqwest::Method::POST,
            "/api/user",
            Some(dup),
        )
        .await,
    )
    .await;
    assert_eq!(code, 400);
    assert!(
        json["message"]
            .as_str()
            .unwrap()
            .contains("already present")
    );

    let page: Value = call(
        &gw,
        &new_admin,
        reqwest::Method::GET,
        "/api/users?pageSize=10&page=0",
        None,
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(page["totalElements"], 2, "{page}");
    let all: Value = call(
        &gw,
        &sys,
        reqwest::Method::GET,
        "/api/users?pageSize=1&page=0&textSearch=EXAMPLE",
        None,
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(all["totalElements"], 2);
    assert_eq!(all["hasNext"], true);
    assert_eq!(
        call(
            &gw,
            &sys,
            reqwest::Method::GET,
            &format!("/api/user/{id}"),
            None
        )
        .await
        .status(),
        200
    );
}

#[tokio::test]
async fn disabling_or_deleting_a_user_ends_their_keys_and_tokens_at_once() {
    let (_upstream, gw) = common::gateway("").await;
    let admin = actor(
        &gw,
        gw.user("boss@example.com", Authority::TenantAdmin).await,
    )
    .await;
    let mut worker = gw.user("worker@example.com", Authority::CustomerUser).await;
    let _ = gw.running.store.delete_user(worker.id).await.unwrap(); // uncached; inserted again
    worker.tenant_id = admin.user.tenant_id;
    worker.customer_id = Uuid::new_v4();
    worker.id = Uuid::new_v4();
    gw.running.store.insert_user(&worker).await.unwrap();
    let worker = actor(&gw, worker).await;
    let (_, key) = gw.api_key(&worker.user, 0).await;
    assert_eq!(use_key(&gw, &key).await.status(), 200);
    assert_eq!(
        call(&gw, &worker, reqwest::Method::GET, "/api/auth/user", None)
            .await
            .status(),
        200
    );

    let path = format!(
        "/api/user/{}/userCredentialsEnabled?userCredentialsEnabled=false",
        worker.user.id
    );
    assert_eq!(
        call(&gw, &admin, reqwest::Method::POST, &path, None)
            .await
            .status(),
        200
    );
    assert_eq!(use_key(&gw, &key).await.status(), 401);
    assert_eq!(
        call(&gw, &worker, reqwest::Method::GET, "/api/auth/user", None)
            .await
            .status(),
        401
    );
    let path = format!(
        "/api/user/{}/userCredentialsEnabled?userCredentialsEnabled=true",
        worker.user.id
    );
    assert_eq!(
        call(&gw, &admin, reqwest::Method::POST, &path, None)
            .await
            .status(),
        200
    );
    assert_eq!(use_key(&gw, &key).await.status(), 200);

    assert_eq!(
        call(
            &gw,
            &admin,
            reqwest::Method::DELETE,
            &format!("/api/user/{}", worker.user.id),
            None
        )
        .await
        .status(),
        200
    );
    assert_eq!(use_key(&gw, &key).await.status(), 401);
    assert_eq!(
        call(
            &gw,
            &admin,
            reqwest::Method::GET,
            &format!("/api/user/{}", worker.user.id),
            None
        )
        .await
        .status(),
        404
    );
}

#[tokio::test]
async fn key_sent_over_plain_http_is_disabled_when_configured() {
    let (_upstream, gw) = common::gateway("[api_keys]\ndisable_on_plaintext = true\n").await;
    let user = gw.user("leaky@example.com", Authority::TenantAdmin).await;
    for wire in WIRES {
        let (_, key) = gw.api_key(&user, 0).await;
        assert_eq!(use_key_over(&gw, wire, &key).await.status(), 200);
        let leaked = plain_client_over(wire)
            .get(gw.http("/api/devices"))
            .header("X-Authorization", common::api_key_header(&key))
            .send()
            .await
            .unwrap();
        assert_eq!(leaked.version(), wire.version());
        assert_eq!(leaked.status(), 403, "{wire:?}");
        let (code, json) = error_body(use_key_over(&gw, wire, &key).await).await;
        assert_eq!(
            (code, json["message"].as_str()),
            (401, Some("User account is not active")),
            "{wire:?}"
        );
    }
    assert!(
        gw.metrics()
            .await
            .contains("keygate_api_keys_disabled_on_plaintext_total 2")
    );
}

async fn create_user(gw: &Gateway, who: &Actor, email: &str) -> reqwest::Response {
    let body = json!({"email": email, "authority": "CUSTOMER_USER", "customerId": {"entityType": "CUSTOMER", "id": Uuid::new_v4()}});
    call(gw, who, reqwest::Method::POST, "/api/user", Some(body)).await
}

#[tokio::test]
async fn a_burst_of_key_and_user_creations_by_one_user_is_limited_per_user() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start(
        &upstream.url(),
        "[limits]\nmanagement_writes_per_user = \"10/m\"\n",
    )
    .await;
    let me = actor(
        &gw,
        gw.user("burst@example.com", Authority::CustomerUser).await,
    )
    .await;
    // The wires take turns: one user, one budget.
    let over = WIRES.map(|wire| me.over(wire));
    let burst = (0..30).map(|i| create_key(&gw, &over[i % 2], me.user.id));
    let responses = futures_util::future::join_all(burst).await;
    let created = responses.iter().filter(|r| r.status() == 200).count();
    assert_eq!(created, 10);
    let refused: Vec<_> = responses
        .into_iter()
        .filter(|r| r.status() != 200)
        .collect();
    assert_eq!(refused.len(), 20);
    let retry_after = refused[0].headers()["retry-after"].to_str().unwrap();
    assert!(retry_after.parse::<u64>().unwrap() >= 1, "{retry_after}");
    let (status, body) = error_body(refused.into_iter().next().unwrap()).await;
    assert_eq!(
        (status, body["errorCode"].as_i64()),
        (429, Some(33)),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap().contains("10/m per user"),
        "{body}"
    );
    let stored = gw.running.store.list_api_keys(me.user.id).await.unwrap();
    assert_eq!(stored.len(), 10, "a refused creation writes nothing");
    // User creations draw on the same budget; other users have their own.
    let admin = actor(
        &gw,
        gw.user("admin@example.com", Authority::TenantAdmin).await,
    )
    .await;
    for i in 0..10 {
        let response = create_user(&gw, &admin, &format!("new-{i}@example.com")).await;
        assert_eq!(response.status(), 200, "{i}");
    }
    let (status, _) = error_body(create_key(&gw, &admin, admin.user.id).await).await;
    assert_eq!(status, 429);
    let (status, _) = error_body(create_user(&gw, &admin, "one-more@example.com").await).await;
    assert_eq!(status, 429);
    let metrics = gw.metrics().await;
    assert!(
        metrics.contains(r#"keygate_rate_limited_total{limiter="management_writes"} 22"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn creating_an_api_key_beyond_the_per_user_cap_is_refused_with_400() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start(
        &upstream.url(),
        "[limits]\nmanagement_writes_per_user = \"\"\n[api_keys]\nmax_per_user = 5\n",
    )
    .await;
    let me = actor(
        &gw,
        gw.user("hoarder@example.com", Authority::CustomerUser)
            .await,
    )
    .await;
    // The wires take turns: one user, one cap.
    let over = WIRES.map(|wire| me.over(wire));
    let burst = (0..12).map(|i| create_key(&gw, &over[i % 2], me.user.id));
    let responses = futures_util::future::join_all(burst).await;
    let created: Vec<Value> = {
        let mut created = Vec::new();
        let mut refused = 0;
        for response in responses {
            if response.status() == 200 {
                created.push(response.json().await.unwrap());
                continue;
            }
            refused += 1;
            let (status, body) = error_body(response).await;
            assert_eq!(
                (status, body["errorCode"].as_i64()),
                (400, Some(31)),
                "{body}"
            );
            assert_eq!(
                body["message"],
                "a user may hold at most 5 API keys; delete one to create another"
            );
        }
        assert_eq!(refused, 7);
        created
    };
    assert_eq!(created.len(), 5);
    assert_eq!(
        gw.running
            .store
            .list_api_keys(me.user.id)
            .await
            .unwrap()
            .len(),
        5
    );
    // Deleting one makes room for one.
    let id = created[0]["id"]["id"].as_str().unwrap();
    let path = format!("/api/apiKey/{id}");
    let deleted = call(&gw, &me, reqwest::Method::DELETE, &path, None).await;
    assert_eq!(deleted.status(), 200);
    assert_eq!(create_key(&gw, &me, me.user.id).await.status(), 200);
    assert_eq!(create_key(&gw, &me, me.user.id).await.status(), 400);
}

/// A CUSTOMER_USER of `customer` created over REST by `admin`.
async fn create_customer_user(
    gw: &Gateway,
    admin: &Actor,
    email: &str,
    customer: Uuid,
) -> reqwest::Response {
    let body = json!({"email": email, "authority": "CUSTOMER_USER", "customerId": {"entityType": "CUSTOMER", "id": customer}});
    call(gw, admin, reqwest::Method::POST, "/api/user", Some(body)).await
}

/// Tenant A's admin uses a customer id first; tenant B's admin cannot create
/// a user under it, before or after A's users of it are gone.
async fn another_tenants_customer_id_is_refused(gw: &Gateway) {
    let admin_a = actor(
        gw,
        gw.user("admin-a@example.com", Authority::TenantAdmin).await,
    )
    .await;
    let admin_b = actor(
        gw,
        gw.user("admin-b@example.com", Authority::TenantAdmin).await,
    )
    .await;
    let customer = Uuid::new_v4();
    let created = create_customer_user(gw, &admin_a, "a-customer@example.com", customer).await;
    assert_eq!(created.status(), 200);
    let created: Value = created.json().await.unwrap();
    assert_eq!(
        created["tenantId"]["id"],
        admin_a.user.tenant_id.to_string()
    );

    let refused = create_customer_user(gw, &admin_b, "b-intruder@example.com", customer).await;
    let (status, body) = error_body(refused).await;
    assert_eq!(
        (status, body["errorCode"].as_i64()),
        (403, Some(20)),
        "{body}"
    );
    let store = &gw.running.store;
    assert!(
        store
            .user_by_email("b-intruder@example.com")
            .await
            .unwrap()
            .is_none()
    );
    // A's own users of it may be deleted: the id stays A's.
    let id = created["id"]["id"].as_str().unwrap();
    let deleted = call(
        gw,
        &admin_a,
        reqwest::Method::DELETE,
        &format!("/api/user/{id}"),
        None,
    )
    .await;
    assert_eq!(deleted.status(), 200);
    let again = create_customer_user(gw, &admin_b, "b-again@example.com", customer).await;
    assert_eq!(again.status(), 403);
    // B's own new customer id is B's; A may use A's again.
    let own = create_customer_user(gw, &admin_b, "b-own@example.com", Uuid::new_v4()).await;
    assert_eq!(own.status(), 200);
    let a_again = create_customer_user(gw, &admin_a, "a-again@example.com", customer).await;
    assert_eq!(a_again.status(), 200);
}

#[tokio::test]
async fn a_tenant_admin_cannot_create_a_customer_user_with_another_tenants_customer_id() {
    let (_upstream, gw) = common::gateway("").await;
    another_tenants_customer_id_is_refused(&gw).await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_tenant_admin_cannot_create_a_customer_user_with_another_tenants_customer_id_on_postgres()
{
    let base = common::test_database_url();
    let (url, schema) = common::fresh_schema(&base).await;
    let upstream = Upstream::start().await;
    let gw = Gateway::start_on(&upstream.url(), "", Some(&url)).await;
    another_tenants_customer_id_is_refused(&gw).await;
    gw.running.store.close().await;
    common::drop_schema(&base, &schema).await;
}
