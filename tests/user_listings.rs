//! The platform's user listings keygate answers from its own store:
//! `/api/userInfos/all`, `/api/tenant/{tenantId}/users`,
//! `/api/customer/{customerId}/users` and `/api/customer/{customerId}/userInfos`,
//! each with its paging, sorting and authority rules, end to end.

mod common;

use common::{Gateway, PASSWORD, Upstream, error_body};
use keygate::accounts::{self, NewUser};
use keygate::identity::Authority;
use keygate::store::UserRecord;
use serde_json::Value;
use uuid::Uuid;

/// Two tenants: A with an administrator, a second administrator and two
/// customers (two users in one, one in the other); B with an administrator
/// and a customer of its own; and a SYS_ADMIN.
struct World {
    gw: Gateway,
    _upstream: Upstream,
    sys: String,
    admin_a: String,
    admin_b: String,
    customer_a1: String,
    tenant_a: Uuid,
    tenant_b: Uuid,
    c1: Uuid,
    c2: Uuid,
    cb: Uuid,
}

async fn user(
    gw: &Gateway,
    email: &str,
    authority: Authority,
    tenant: Option<Uuid>,
    customer: Option<Uuid>,
    first_name: &str,
) -> UserRecord {
    let new = NewUser {
        email: email.into(),
        authority,
        tenant_id: tenant,
        customer_id: customer,
        first_name: first_name.into(),
        last_name: String::new(),
    };
    accounts::create_user(&gw.running.store, new, PASSWORD.into(), &Default::default())
        .await
        .unwrap()
}

async fn bearer(gw: &Gateway, user: &UserRecord) -> String {
    format!("Bearer {}", gw.access_token(user).await.1)
}

async fn world() -> World {
    let upstream = Upstream::start().await;
    let gw = Gateway::start(&upstream.url(), "").await;
    let (tenant_a, tenant_b) = (Uuid::new_v4(), Uuid::new_v4());
    let (c1, c2, cb) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let sys = user(
        &gw,
        "root@list.test",
        Authority::SysAdmin,
        None,
        None,
        "Root",
    )
    .await;
    let admin_a = user(
        &gw,
        "admin-a@list.test",
        Authority::TenantAdmin,
        Some(tenant_a),
        None,
        "Zed",
    )
    .await;
    user(
        &gw,
        "second-a@list.test",
        Authority::TenantAdmin,
        Some(tenant_a),
        None,
        "Amy",
    )
    .await;
    let customer_a1 = user(
        &gw,
        "c1-one@list.test",
        Authority::CustomerUser,
        Some(tenant_a),
        Some(c1),
        "Cat",
    )
    .await;
    user(
        &gw,
        "c1-two@list.test",
        Authority::CustomerUser,
        Some(tenant_a),
        Some(c1),
        "Bob",
    )
    .await;
    user(
        &gw,
        "c2-one@list.test",
        Authority::CustomerUser,
        Some(tenant_a),
        Some(c2),
        "Dan",
    )
    .await;
    let admin_b = user(
        &gw,
        "admin-b@list.test",
        Authority::TenantAdmin,
        Some(tenant_b),
        None,
        "Eve",
    )
    .await;
    user(
        &gw,
        "cb-one@list.test",
        Authority::CustomerUser,
        Some(tenant_b),
        Some(cb),
        "Fay",
    )
    .await;
    World {
        sys: bearer(&gw, &sys).await,
        admin_a: bearer(&gw, &admin_a).await,
        admin_b: bearer(&gw, &admin_b).await,
        customer_a1: bearer(&gw, &customer_a1).await,
        gw,
        _upstream: upstream,
        tenant_a,
        tenant_b,
        c1,
        c2,
        cb,
    }
}

impl World {
    async fn get(&self, who: &str, path: &str) -> reqwest::Response {
        self.gw
            .client()
            .get(self.gw.https(path))
            .header("X-Authorization", who)
            .send()
            .await
            .unwrap()
    }

    /// A page that must be answered 200.
    async fn page(&self, who: &str, path: &str) -> Value {
        let response = self.get(who, path).await;
        assert_eq!(response.status(), 200, "{path}");
        response.json().await.unwrap()
    }

    async fn refused(&self, who: &str, path: &str) -> (u16, Value) {
        error_body(self.get(who, path).await).await
    }
}

fn emails(page: &Value) -> Vec<String> {
    page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["email"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn all_user_infos_lists_the_tenants_own_users_and_with_include_customers_every_user() {
    let w = world().await;
    let own = w
        .page(&w.admin_a, "/api/userInfos/all?pageSize=10&page=0")
        .await;
    assert_eq!(
        emails(&own),
        ["admin-a@list.test", "second-a@list.test"],
        "the tenant's own users, by creation time"
    );
    assert_eq!(own["totalElements"], 2);
    assert_eq!(own["data"][0]["ownerId"]["entityType"], "TENANT");
    assert_eq!(own["data"][0]["ownerId"]["id"], w.tenant_a.to_string());
    let all = w
        .page(
            &w.admin_a,
            "/api/userInfos/all?pageSize=10&page=0&includeCustomers=true",
        )
        .await;
    assert_eq!(all["totalElements"], 5, "{all}");
    assert!(
        !emails(&all)
            .iter()
            .any(|e| e.contains("-b@") || e.starts_with("cb-"))
    );
    let customer = all["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["email"] == "c1-one@list.test")
        .unwrap();
    assert_eq!(customer["ownerId"]["entityType"], "CUSTOMER");
    assert_eq!(customer["ownerId"]["id"], w.c1.to_string());
    assert!(customer.get("passwordHash").is_none() && !all.to_string().contains("argon2"));
    // A customer user: the users of its own customer.
    let mine = w
        .page(&w.customer_a1, "/api/userInfos/all?pageSize=10&page=0")
        .await;
    assert_eq!(emails(&mine), ["c1-one@list.test", "c1-two@list.test"]);
}

#[tokio::test]
async fn listings_page_and_sort_as_the_platform_does() {
    let w = world().await;
    let path = |page: u32| {
        format!(
            "/api/userInfos/all?pageSize=2&page={page}&includeCustomers=true&sortProperty=firstName&sortOrder=DESC"
        )
    };
    let first = w.page(&w.admin_a, &path(0)).await;
    assert_eq!(
        emails(&first),
        ["admin-a@list.test", "c2-one@list.test"],
        "Zed, Dan"
    );
    assert_eq!(first["totalPages"], 3);
    assert_eq!(first["totalElements"], 5);
    assert_eq!(first["hasNext"], true);
    let second = w.page(&w.admin_a, &path(1)).await;
    assert_eq!(
        emails(&second),
        ["c1-one@list.test", "c1-two@list.test"],
        "Cat, Bob"
    );
    let last = w.page(&w.admin_a, &path(2)).await;
    assert_eq!(emails(&last), ["second-a@list.test"], "Amy");
    assert_eq!(last["hasNext"], false);
    let ascending = w
        .page(
            &w.admin_a,
            &format!(
                "/api/customer/{}/users?pageSize=10&page=0&sortProperty=email&sortOrder=asc",
                w.c1
            ),
        )
        .await;
    assert_eq!(emails(&ascending), ["c1-one@list.test", "c1-two@list.test"]);
    let searched = w
        .page(
            &w.admin_a,
            &format!(
                "/api/customer/{}/userInfos?pageSize=10&page=0&textSearch=TWO",
                w.c1
            ),
        )
        .await;
    assert_eq!(emails(&searched), ["c1-two@list.test"]);
}

#[tokio::test]
async fn bad_paging_and_sorting_parameters_are_400_in_the_contract_shape() {
    let w = world().await;
    let (status, body) = w.refused(&w.admin_a, "/api/userInfos/all?page=0").await;
    assert_eq!(status, 400);
    assert_eq!(body["errorCode"], 31);
    assert!(
        body["message"].as_str().unwrap().contains("pageSize"),
        "{body}"
    );
    let (status, body) = w
        .refused(
            &w.admin_a,
            "/api/userInfos/all?pageSize=10&page=0&sortProperty=passwordHash",
        )
        .await;
    assert_eq!(
        (status, body["message"].as_str().unwrap()),
        (400, "Invalid sort property")
    );
    let (status, body) = w
        .refused(
            &w.admin_a,
            "/api/userInfos/all?pageSize=10&page=0&sortProperty=email&sortOrder=UP",
        )
        .await;
    assert_eq!(status, 400);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("Only 'ASC' or 'DESC'"),
        "{body}"
    );
    let (status, _) = w
        .refused(
            &w.admin_a,
            "/api/userInfos/all?pageSize=10&page=0&includeCustomers=maybe",
        )
        .await;
    assert_eq!(status, 400);
    let (status, body) = w
        .refused(&w.sys, "/api/tenant/not-a-uuid/users?pageSize=10&page=0")
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["timestamp"].is_number());
}

#[tokio::test]
async fn tenant_admins_are_listed_for_a_sys_admin_only() {
    let w = world().await;
    let admins = w
        .page(
            &w.sys,
            &format!("/api/tenant/{}/users?pageSize=10&page=0", w.tenant_a),
        )
        .await;
    assert_eq!(emails(&admins), ["admin-a@list.test", "second-a@list.test"]);
    assert!(
        admins["data"][0].get("ownerId").is_none(),
        "User, not UserInfo"
    );
    let other = w
        .page(
            &w.sys,
            &format!("/api/tenant/{}/users?pageSize=10&page=0", w.tenant_b),
        )
        .await;
    assert_eq!(emails(&other), ["admin-b@list.test"]);
    for who in [&w.admin_a, &w.customer_a1] {
        let (status, body) = w
            .refused(
                who,
                &format!("/api/tenant/{}/users?pageSize=10&page=0", w.tenant_a),
            )
            .await;
        assert_eq!(status, 403, "{body}");
        assert_eq!(body["errorCode"], 20);
    }
}

#[tokio::test]
async fn a_tenant_admin_cannot_list_another_tenants_customer_users() {
    let w = world().await;
    let own = w
        .page(
            &w.admin_a,
            &format!("/api/customer/{}/users?pageSize=10&page=0", w.c2),
        )
        .await;
    assert_eq!(emails(&own), ["c2-one@list.test"]);
    for path in [
        format!("/api/customer/{}/users?pageSize=10&page=0", w.cb),
        format!("/api/customer/{}/userInfos?pageSize=10&page=0", w.cb),
    ] {
        let (status, body) = w.refused(&w.admin_a, &path).await;
        assert_eq!(status, 403, "{path}: {body}");
    }
    // B's administrator reads B's customer, and never A's.
    let b = w
        .page(
            &w.admin_b,
            &format!("/api/customer/{}/users?pageSize=10&page=0", w.cb),
        )
        .await;
    assert_eq!(emails(&b), ["cb-one@list.test"]);
    let (status, _) = w
        .refused(
            &w.admin_b,
            &format!("/api/customer/{}/users?pageSize=10&page=0", w.c1),
        )
        .await;
    assert_eq!(status, 403);
    // A customer keygate has no user of is an empty page, as on the platform.
    let empty = w
        .page(
            &w.admin_a,
            &format!("/api/customer/{}/users?pageSize=10&page=0", Uuid::new_v4()),
        )
        .await;
    assert_eq!(empty["totalElements"], 0);
    assert_eq!(empty["data"], serde_json::json!([]));
}

#[tokio::test]
async fn customer_users_are_refused_other_customers_and_the_tenant_listings() {
    let w = world().await;
    let mine = w
        .page(
            &w.customer_a1,
            &format!("/api/customer/{}/userInfos?pageSize=10&page=0", w.c1),
        )
        .await;
    assert_eq!(emails(&mine), ["c1-one@list.test", "c1-two@list.test"]);
    for path in [
        format!("/api/customer/{}/userInfos?pageSize=10&page=0", w.c2),
        format!("/api/customer/{}/users?pageSize=10&page=0", w.c1),
        format!("/api/tenant/{}/users?pageSize=10&page=0", w.tenant_a),
    ] {
        let (status, body) = w.refused(&w.customer_a1, &path).await;
        assert_eq!(status, 403, "{path}: {body}");
    }
    // A SYS_ADMIN owns no tenant's users on these listings, as on the platform.
    for path in [
        "/api/userInfos/all?pageSize=10&page=0".to_owned(),
        format!("/api/customer/{}/users?pageSize=10&page=0", w.c1),
        format!("/api/customer/{}/userInfos?pageSize=10&page=0", w.c1),
    ] {
        let (status, _) = w.refused(&w.sys, &path).await;
        assert_eq!(status, 403, "{path}");
    }
}

#[tokio::test]
async fn listings_are_answered_by_keygate_and_never_forwarded() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start(&upstream.url(), "").await;
    let admin = gw.user("solo@list.test", Authority::TenantAdmin).await;
    let token = bearer(&gw, &admin).await;
    let page: Value = gw
        .client()
        .get(gw.https("/api/userInfos/all?pageSize=5&page=0"))
        .header("X-Authorization", &token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(emails(&page), ["solo@list.test"]);
    assert_eq!(upstream.arrived(), 0, "nothing reached the upstream");
}

/// `(userCredentialsEnabled, userActivated)` of a user record.
fn credential_state(user: &Value) -> (Value, Value) {
    let info = &user["additionalInfo"];
    (
        info["userCredentialsEnabled"].clone(),
        info["userActivated"].clone(),
    )
}

#[tokio::test]
async fn a_pending_invitation_is_never_listed_as_enabled() {
    use serde_json::json;
    let upstream = Upstream::start().await;
    let gw = Gateway::start(&upstream.url(), "").await;
    let (tenant, customer) = (Uuid::new_v4(), Uuid::new_v4());
    let admin = user(
        &gw,
        "admin@state.test",
        Authority::TenantAdmin,
        Some(tenant),
        None,
        "Ada",
    )
    .await;
    let admin = bearer(&gw, &admin).await;
    let active = user(
        &gw,
        "active@state.test",
        Authority::CustomerUser,
        Some(tenant),
        Some(customer),
        "Al",
    )
    .await;
    let disabled = user(
        &gw,
        "disabled@state.test",
        Authority::CustomerUser,
        Some(tenant),
        Some(customer),
        "Di",
    )
    .await;
    let _ = gw
        .running
        .store
        .set_user_enabled(disabled.id, false, keygate::clock::now_secs())
        .await
        .unwrap(); // a listing reads the store, no cache
    // Invited: no password until the link is used (credentials disabled,
    // an activation token pending, on the platform).
    let invited = gw
        .client()
        .post(gw.https("/api/user"))
        .header("X-Authorization", &admin)
        .json(&json!({
            "email": "invited@state.test",
            "authority": "CUSTOMER_USER",
            "customerId": {"entityType": "CUSTOMER", "id": customer},
            "additionalInfo": {"userCredentialsEnabled": true, "lang": "en_US"}
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(invited.status(), 200);
    let invited: Value = invited.json().await.unwrap();
    assert_eq!(credential_state(&invited), (json!(false), json!(false)));
    let invited_id = invited["id"]["id"].as_str().unwrap().to_owned();

    // As the platform's user record shows them: pending, enabled, disabled.
    let expected = [
        ("invited@state.test", (json!(false), json!(false))),
        ("active@state.test", (json!(true), json!(true))),
        ("disabled@state.test", (json!(false), json!(true))),
    ];
    for wire in common::WIRES {
        let client = gw.client_over(wire);
        let get = async |path: &str| {
            let response = client
                .get(gw.https(path))
                .header("X-Authorization", &admin)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200, "{wire:?} {path}");
            assert_eq!(response.version(), wire.version());
            response.json::<Value>().await.unwrap()
        };
        for (id, (email, state)) in [
            &invited_id,
            &active.id.to_string(),
            &disabled.id.to_string(),
        ]
        .into_iter()
        .zip(&expected)
        {
            let one = get(&format!("/api/user/{id}")).await;
            assert_eq!(one["email"], *email);
            assert_eq!(credential_state(&one), *state, "{wire:?} {email}");
        }
        assert_eq!(
            get(&format!("/api/user/{invited_id}")).await["additionalInfo"]["lang"],
            "en_US",
            "the rest of the stored info is kept"
        );
        for listing in [
            format!("/api/customer/{customer}/users?pageSize=10&page=0"),
            format!("/api/customer/{customer}/userInfos?pageSize=10&page=0"),
            "/api/userInfos/all?pageSize=10&page=0&includeCustomers=true".to_owned(),
            "/api/users?pageSize=10&page=0".to_owned(),
        ] {
            let page = get(&listing).await;
            for (email, state) in &expected {
                let row = page["data"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|u| u["email"] == *email)
                    .unwrap_or_else(|| panic!("{email} not in {listing}"));
                assert_eq!(credential_state(row), *state, "{wire:?} {listing} {email}");
            }
        }
    }
}
