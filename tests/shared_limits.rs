//! Limits shared between replicas through the real Redis on 127.0.0.1:6379
//! (`KEYGATE_TEST_REDIS_URL` to use another): password-attempt windows and
//! request quotas counted across two replicas, the fallback to local counters
//! while Redis is cut off and the recovery when it returns, per-route quotas
//! and the rate-limit headers. Each test writes under its own key prefix and
//! deletes it afterwards.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::shared_redis::{Prefix, redis_addr, redis_url};
use common::{Gateway, PASSWORD, Upstream, error_body};
use keygate::accounts::{self, NewUser};
use keygate::identity::Authority;
use keygate::store::UserRecord;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use uuid::Uuid;

/// A TCP forwarder to Redis that the test can cut (every connection closed,
/// new ones refused), stall (connections accepted, nothing answered) and
/// restore.
struct RedisProxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Forward,
    Cut,
    Stall,
}

impl RedisProxy {
    async fn start() -> RedisProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let target: SocketAddr = redis_addr();
        let (mode, _) = watch::channel(Mode::Forward);
        let state = mode.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let mut changed = state.subscribe();
                let now = *changed.borrow_and_update();
                tokio::spawn(async move {
                    match now {
                        Mode::Cut => {} // dropped: the connection closes at once
                        Mode::Stall => {
                            // Held open and never answered, until the mode changes.
                            let _held = client;
                            let _ = changed.changed().await;
                        }
                        Mode::Forward => forward(client, target, changed).await,
                    }
                });
            }
        });
        RedisProxy { addr, mode }
    }

    fn url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

/// Forwards one connection until the proxy's mode changes; then closes it
/// (cut), or holds it open without a byte more (stall) until the next change.
async fn forward(mut client: TcpStream, target: SocketAddr, mut changed: watch::Receiver<Mode>) {
    let Ok(mut server) = TcpStream::connect(target).await else {
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => return,
        _ = changed.wait_for(|mode| *mode != Mode::Forward) => {}
    }
    if *changed.borrow() == Mode::Stall {
        let _held = (client, server);
        let _ = changed.changed().await;
    }
}

/// The config of a replica sharing limits under `prefix` through `url`.
/// Replicas share their signing key (as they do through one store): it keys
/// the account digests in Redis.
fn shared(url: &str, prefix: &Prefix, extra: &str) -> String {
    let signing_key = "a".repeat(88);
    format!(
        "[redis]\nurl = \"{url}\"\nkey_prefix = \"{}\"\ncommand_timeout = \"200ms\"\n\
         [jwt]\ntoken_signing_key = \"{signing_key}\"\n{extra}",
        prefix.0
    )
}

async fn metric(gw: &Gateway, line: &str) -> bool {
    gw.metrics().await.lines().any(|l| l == line)
}

async fn wait_for(gw: &Gateway, line: &str) {
    let started = Instant::now();
    while !metric(gw, line).await {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{line} not within 10 s:\n{}",
            gw.metrics().await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn get(gw: &Gateway, path: &str, key: &str) -> reqwest::Response {
    gw.client()
        .get(gw.https(path))
        .header("X-Authorization", common::api_key_header(key))
        .send()
        .await
        .unwrap()
}

fn header<'r>(response: &'r reqwest::Response, name: &str) -> Option<&'r str> {
    response.headers().get(name).map(|v| v.to_str().unwrap())
}

/// A tenant administrator of `tenant` in this replica's store, with a key.
async fn tenant_key(gw: &Gateway, email: &str, tenant: Uuid) -> (UserRecord, String) {
    let user = accounts::create_user(
        &gw.running.store,
        NewUser {
            email: email.into(),
            authority: Authority::TenantAdmin,
            tenant_id: Some(tenant),
            customer_id: None,
            first_name: "Quota".into(),
            last_name: String::new(),
        },
        PASSWORD.into(),
        &Default::default(),
    )
    .await
    .unwrap();
    let (_, key) = gw.api_key(&user, 0).await;
    (user, key)
}

/// Waits until more than `margin` remains of the current window of
/// `seconds`, so a test's requests all fall in one window.
async fn away_from_a_window_end(seconds: u64, margin: Duration) {
    let now = keygate::clock::now_ms() as u64;
    let left = Duration::from_millis(seconds * 1000 - now % (seconds * 1000));
    if left < margin {
        tokio::time::sleep(left + Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_failed_login_at_one_replica_counts_at_the_other() {
    let prefix = Prefix::new();
    let upstream = Upstream::start().await;
    let config = shared(
        &redis_url(),
        &prefix,
        "[login]\naccount_address_max_failures = 3\n",
    );
    let a = Gateway::start(&upstream.url(), &config).await;
    let b = Gateway::start(&upstream.url(), &config).await;
    wait_for(&a, "keygate_redis_up 1").await;
    wait_for(&b, "keygate_redis_up 1").await;

    for gw in [&a, &b, &a] {
        let (status, _) = error_body(gw.login("victim@example.com", "guess").await).await;
        assert_eq!(status, 401);
    }
    // Each replica saw at most two failures: only a shared count refuses now.
    for gw in [&b, &a] {
        let response = gw.login("victim@example.com", "guess").await;
        let retry_after: u64 = header(&response, "retry-after").unwrap().parse().unwrap();
        assert!((1..=900).contains(&retry_after), "{retry_after}");
        let (status, json) = error_body(response).await;
        assert_eq!(
            (status, json["errorCode"].as_u64()),
            (429, Some(33)),
            "{json}"
        );
    }
    // Another account from the same address is not affected.
    let (status, _) = error_body(b.login("other@example.com", "guess").await).await;
    assert_eq!(status, 401);
    // Redis holds account names only as keyed digests: people type passwords there.
    let keys = prefix.keys().await;
    assert!(
        keys.iter().any(|k| k.contains(":login:account:")),
        "{keys:?}"
    );
    assert!(!keys.iter().any(|k| k.contains("victim")), "{keys:?}");
    for gw in [&a, &b] {
        assert!(metric(gw, r#"keygate_redis_fallbacks_total{limits="login"} 0"#).await);
    }
}

#[tokio::test]
async fn a_quota_holds_across_two_replicas_within_the_documented_bound() {
    let prefix = Prefix::new();
    let upstream = Upstream::start().await;
    let config = shared(&redis_url(), &prefix, "[quota]\nper_tenant = \"20/h\"\n");
    let a = Gateway::start(&upstream.url(), &config).await;
    let b = Gateway::start(&upstream.url(), &config).await;
    wait_for(&a, "keygate_quota_replicas 2").await;
    wait_for(&b, "keygate_quota_replicas 2").await;
    // Each replica has its own store: one tenant, a user and key on each.
    let tenant = Uuid::new_v4();
    let (_, key_a) = tenant_key(&a, "a@tenant.example", tenant).await;
    let (_, key_b) = tenant_key(&b, "b@tenant.example", tenant).await;
    away_from_a_window_end(3600, Duration::from_secs(30)).await;

    let mut admitted = 0;
    for round in 0..30 {
        for (gw, key) in [(&a, &key_a), (&b, &key_b)] {
            let response = get(gw, "/api/devices", key).await;
            assert_eq!(
                header(&response, "ratelimit-policy"),
                Some(r#""per-tenant";q=20;w=3600"#)
            );
            let limit = header(&response, "ratelimit").unwrap().to_string();
            assert!(limit.starts_with(r#""per-tenant";r="#), "{limit}");
            if response.status() == 200 {
                admitted += 1;
            } else {
                assert!(header(&response, "retry-after").is_some());
                let (status, json) = error_body(response).await;
                assert_eq!(
                    (status, json["errorCode"].as_u64()),
                    (429, Some(33)),
                    "{json}"
                );
                assert_eq!(json["message"], "Too many requests");
            }
        }
        if round % 5 == 4 {
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }
    // limit + (replicas - 1) * ceil(limit / replicas) = 20 + 10.
    assert!((20..=30).contains(&admitted), "admitted {admitted} of 20");
    println!("two replicas admitted {admitted} requests under a quota of 20");
    // Once the counts met in Redis, neither replica admits more; until they
    // have, the bound above still holds for everything admitted.
    let mut late = 0;
    common::wait_until(
        "both replicas refuse",
        Duration::from_secs(30),
        async || {
            let mut refused = 0;
            for (gw, key) in [(&a, &key_a), (&b, &key_b)] {
                match get(gw, "/api/devices", key).await.status().as_u16() {
                    200 => late += 1,
                    429 => refused += 1,
                    other => panic!("status {other}"),
                }
            }
            refused == 2
        },
    )
    .await;
    assert!(
        admitted + late <= 30,
        "admitted {admitted}, then {late} more before the counts met"
    );
    let rejected = a.metrics().await + &b.metrics().await;
    assert!(rejected.contains(r#"keygate_quota_rejected_total{dimension="tenant"}"#));
    assert!(
        !rejected.contains(&tenant.to_string()),
        "no tenant id in the metrics"
    );
}

#[tokio::test]
async fn limits_fall_back_to_local_counters_while_redis_is_cut_and_share_again_when_it_returns() {
    let prefix = Prefix::new();
    let proxy = RedisProxy::start().await;
    let upstream = Upstream::start().await;
    let config = shared(
        &proxy.url(),
        &prefix,
        "[login]\naccount_address_max_failures = 3\n[quota]\nper_key = \"4/h\"\n",
    );
    let a = Gateway::start(&upstream.url(), &config).await;
    let b = Gateway::start(&upstream.url(), &config).await;
    wait_for(&a, "keygate_quota_replicas 2").await;
    wait_for(&b, "keygate_quota_replicas 2").await;
    let user = a.user("cut@example.com", Authority::TenantAdmin).await;
    let (_, key) = a.api_key(&user, 0).await;
    away_from_a_window_end(3600, Duration::from_secs(30)).await;

    proxy.set(Mode::Cut);
    wait_for(&a, "keygate_redis_up 0").await;
    // Password guesses are still limited, by this replica's own windows.
    for _ in 0..3 {
        let (status, _) = error_body(a.login("cut-victim@example.com", "guess").await).await;
        assert_eq!(status, 401);
    }
    let (status, _) = error_body(a.login("cut-victim@example.com", "guess").await).await;
    assert_eq!(status, 429, "never unchecked while Redis is away");
    assert!(!metric(&a, r#"keygate_redis_fallbacks_total{limits="login"} 0"#).await);
    // The quota keeps working from local state: this replica's share of 4.
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(get(&a, "/api/devices", &key).await.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 429, 429], "a share of ceil(4 / 2)");
    assert!(!metric(&a, r#"keygate_redis_fallbacks_total{limits="quota"} 0"#).await);

    proxy.set(Mode::Forward);
    wait_for(&a, "keygate_redis_up 1").await;
    wait_for(&b, "keygate_redis_up 1").await;
    // Shared again: failures at A count at B.
    for gw in [&a, &b, &a] {
        let (status, _) = error_body(gw.login("back@example.com", "guess").await).await;
        assert_eq!(status, 401);
    }
    let (status, _) = error_body(b.login("back@example.com", "guess").await).await;
    assert_eq!(status, 429);
}

#[tokio::test]
async fn a_route_with_its_own_quota_counts_apart_from_the_global_one() {
    let prefix = Prefix::new();
    let upstream = Upstream::start().await;
    let url = upstream.url();
    let routes = format!(
        "[quota]\nper_key = \"1000/h\"\n\
         [[route]]\nname = \"limited\"\nprefix = \"/api/limited/\"\nupstreams = [\"{url}\"]\nquota = {{ per_key = \"3/h\" }}\n\
         [[route]]\nname = \"free\"\nprefix = \"/api/free/\"\nupstreams = [\"{url}\"]\nquota = {{ per_key = \"off\" }}\n"
    );
    let gw = Gateway::start(&url, &shared(&redis_url(), &prefix, &routes)).await;
    let user = gw.user("route@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    away_from_a_window_end(3600, Duration::from_secs(30)).await;

    for remaining in [2, 1, 0] {
        let response = get(&gw, "/api/limited/devices", &key).await;
        assert_eq!(response.status(), 200);
        assert_eq!(
            header(&response, "ratelimit-policy"),
            Some(r#""per-key";q=3;w=3600"#)
        );
        let limit = header(&response, "ratelimit").unwrap();
        assert!(
            limit.starts_with(&format!("\"per-key\";r={remaining};t=")),
            "{limit}"
        );
    }
    let refused = get(&gw, "/api/limited/devices", &key).await;
    let retry_after: u64 = header(&refused, "retry-after").unwrap().parse().unwrap();
    assert!((1..=3600).contains(&retry_after));
    assert_eq!(
        header(&refused, "ratelimit-policy"),
        Some(r#""per-key";q=3;w=3600"#)
    );
    assert!(
        header(&refused, "ratelimit")
            .unwrap()
            .starts_with(r#""per-key";r=0;t="#)
    );
    let (status, json) = error_body(refused).await;
    assert_eq!((status, json["errorCode"].as_u64()), (429, Some(33)));

    // The global budget is another one, untouched by the route's.
    let response = get(&gw, "/api/devices", &key).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        header(&response, "ratelimit-policy"),
        Some(r#""per-key";q=1000;w=3600"#)
    );
    assert!(
        header(&response, "ratelimit")
            .unwrap()
            .starts_with(r#""per-key";r=999;t="#)
    );
    // A route that turns the quota off says nothing of it.
    let response = get(&gw, "/api/free/devices", &key).await;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "ratelimit-policy"), None);
    // A JWT names no key: the per-key quota does not apply to it.
    let (_, token) = gw.access_token(&user).await;
    let response = gw
        .client()
        .get(gw.https("/api/limited/devices"))
        .header("X-Authorization", format!("Bearer {token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "ratelimit"), None);
}

#[tokio::test]
async fn quotas_without_redis_are_kept_by_each_replica() {
    let (_upstream, gw) = common::gateway("[quota]\nper_user = \"2/h\"\n").await;
    assert!(!gw.metrics().await.contains("keygate_redis_up"));
    let user = gw.user("local@example.com", Authority::TenantAdmin).await;
    let (_, key) = gw.api_key(&user, 0).await;
    away_from_a_window_end(3600, Duration::from_secs(30)).await;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(get(&gw, "/api/devices", &key).await.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 429]);
    assert!(metric(&gw, r#"keygate_quota_rejected_total{dimension="user"} 1"#).await);
}

#[tokio::test]
async fn a_stalled_redis_delays_a_password_attempt_by_the_command_timeout_at_most() {
    let prefix = Prefix::new();
    let proxy = RedisProxy::start().await;
    let upstream = Upstream::start().await;
    let config = shared(
        &proxy.url(),
        &prefix,
        "[login]\naccount_address_max_failures = 2\n",
    );
    let gw = Gateway::start(&upstream.url(), &config).await;
    wait_for(&gw, "keygate_redis_up 1").await;
    let (status, _) = error_body(gw.login("slow@example.com", "guess").await).await;
    assert_eq!(status, 401);
    let started = Instant::now();
    let (status, _) = error_body(gw.login("warm@example.com", "guess").await).await;
    let with_redis = started.elapsed();
    assert_eq!(status, 401);

    proxy.set(Mode::Stall);
    // The first attempt waits out the command timeout (200 ms), then its
    // replica decides: the second failure of the pair window still counts.
    let started = Instant::now();
    let (status, _) = error_body(gw.login("slow@example.com", "guess").await).await;
    let stalled = started.elapsed();
    assert_eq!(status, 401);
    assert!(
        stalled < with_redis + Duration::from_millis(1500),
        "{stalled:?} against {with_redis:?} with Redis answering"
    );
    let (status, _) = error_body(gw.login("slow@example.com", "guess").await).await;
    assert_eq!(status, 429, "decided by the local windows, never unchecked");
    println!("a login took {with_redis:?} with Redis answering, {stalled:?} with Redis stalled");
    assert!(metric(&gw, "keygate_redis_up 0").await);
    assert!(!metric(&gw, r#"keygate_redis_fallbacks_total{limits="login"} 0"#).await);
    proxy.set(Mode::Forward);
    wait_for(&gw, "keygate_redis_up 1").await;
}

/// A login for `username` as a trusted proxy forwarded it from `client_ip`.
async fn login_from(gw: &Gateway, username: &str, client_ip: &str) -> u16 {
    gw.client()
        .post(gw.https("/api/auth/login"))
        .header("X-Forwarded-For", client_ip)
        .json(&serde_json::json!({ "username": username, "password": "guess" }))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn ipv6_rotation_within_one_64_shares_one_login_window_across_replicas() {
    let prefix = Prefix::new();
    let upstream = Upstream::start().await;
    let config = shared(
        &redis_url(),
        &prefix,
        "[login]\naccount_address_max_failures = 3\n\
         [proxy]\ntrusted_proxies = [\"127.0.0.1/32\"]\n",
    );
    let a = Gateway::start(&upstream.url(), &config).await;
    let b = Gateway::start(&upstream.url(), &config).await;
    wait_for(&a, "keygate_redis_up 1").await;
    wait_for(&b, "keygate_redis_up 1").await;
    let mut statuses = Vec::new();
    for (i, gw) in [&a, &b, &a, &b, &a, &b].into_iter().enumerate() {
        let from = format!("2001:db8:7:8:{i:x}::{:x}", i * 31 + 1);
        statuses.push(login_from(gw, "victim@example.com", &from).await);
    }
    // Each replica saw at most two of the three failures: the shared window
    // of the /64 refuses the rest.
    assert_eq!(statuses, [401, 401, 401, 429, 429, 429]);
    let keys = prefix.keys().await;
    let addresses: Vec<_> = keys
        .iter()
        .filter(|k| k.contains(":login:address:"))
        .collect();
    assert!(!addresses.is_empty(), "{keys:?}");
    assert!(
        addresses.iter().all(|k| k.ends_with(":2001:db8:7:8::/64")),
        "{addresses:?}"
    );
    for gw in [&a, &b] {
        assert!(metric(gw, r#"keygate_redis_fallbacks_total{limits="login"} 0"#).await);
    }
}
