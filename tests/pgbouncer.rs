//! keygate behind PgBouncer in transaction mode (`store.pooler =
//! "transaction"`), the test's own PgBouncer before the test database:
//! replicas with `store.notify_url` (a direct connection) hear a revocation
//! made on another within a second; without it, `/readyz` says the channel
//! does not listen and a revocation still lands, polled. Runs when
//! KEYGATE_TEST_DATABASE_URL is set (CI sets it) and pgbouncer is installed.

mod common;

use std::time::{Duration, Instant};

use common::pgbouncer::PgBouncer;
use common::{Gateway, Upstream};
use keygate::identity::Authority;
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection};

/// A database of its own on the test server, reached through a PgBouncer
/// started for it; dropped (PgBouncer first) at [`Behind::finish`].
struct Behind {
    bouncer: Option<PgBouncer>,
    base: String,
    database: String,
}

impl Behind {
    async fn start(check: &str) -> Option<Behind> {
        let base = common::test_database_url();
        let Some(bouncer) = PgBouncer::before(&base) else {
            common::skipped_without("pgbouncer", check);
            return None;
        };
        let database = format!("kg_pgb_{}", uuid::Uuid::new_v4().simple());
        let mut admin = PgConnection::connect(&base).await.unwrap();
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {database}")))
            .execute(&mut admin)
            .await
            .unwrap();
        let _ = admin.close().await;
        Some(Behind {
            bouncer: Some(bouncer),
            base,
            database,
        })
    }

    /// The store URL, through PgBouncer.
    fn pooled_url(&self) -> String {
        self.bouncer.as_ref().unwrap().url(&self.database)
    }

    /// The same database, directly.
    fn direct_url(&self) -> String {
        let (server, _) = self.base.rsplit_once('/').unwrap();
        format!("{server}/{}", self.database)
    }

    async fn finish(mut self) {
        drop(self.bouncer.take());
        if let Ok(mut admin) = PgConnection::connect(&self.base).await {
            let drop = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.database);
            let _ = sqlx::raw_sql(AssertSqlSafe(drop)).execute(&mut admin).await;
        }
    }
}

/// The replicas trust a credential state for 300 s: a revocation seen
/// sooner came through the channel or the poll, not the cache's expiry.
/// `more`: further `[store]` lines.
fn config(pooled_url: &str, notify_url: Option<&str>, more: &str) -> String {
    let notify = notify_url.map_or(String::new(), |url| format!("notify_url = \"{url}\"\n"));
    format!(
        "[cache]\nttl = \"300s\"\n[store]\nurl = \"{pooled_url}\"\npooler = \"transaction\"\n{notify}{more}"
    )
}

/// An access token of a fresh login.
async fn login(gw: &Gateway, username: &str) -> String {
    let response = gw.login(username, common::PASSWORD).await;
    assert_eq!(response.status(), 200);
    let body: serde_json::Value = response.json().await.unwrap();
    body["token"].as_str().unwrap().into()
}

async fn wait_for(what: &str, limit: Duration, mut done: impl AsyncFnMut() -> bool) -> Duration {
    let started = Instant::now();
    loop {
        if done().await {
            return started.elapsed();
        }
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn status_with(gw: &Gateway, header: &str) -> u16 {
    gw.client()
        .get(gw.https("/api/devices"))
        .header("X-Authorization", header)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn readyz(gw: &Gateway) -> (u16, String) {
    let response = reqwest::get(gw.admin("/readyz")).await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

async fn listener_up(gw: &Gateway) -> bool {
    gw.metrics()
        .await
        .contains("keygate_revocation_listener_up 1")
}

/// A key disabled on `a` is refused by `b` within `limit`; the time it took.
async fn key_revocation_reaches(a: &Gateway, b: &Gateway, limit: Duration) -> Duration {
    let user = a.user("pooled@example.com", Authority::TenantAdmin).await;
    let (key_id, key) = a.api_key(&user, 0).await;
    let (_, token) = a.access_token(&user).await;
    let key = common::api_key_header(&key);
    assert_eq!(status_with(b, &key).await, 200, "B shares the store");
    let disabled = a
        .client()
        .put(a.https(&format!("/api/apiKey/{key_id}/enabled/false")))
        .header("X-Authorization", format!("Bearer {token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(disabled.status(), 200);
    wait_for("B refuses the disabled key", limit, async || {
        status_with(b, &key).await == 401
    })
    .await
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn replicas_behind_pgbouncer_with_a_notify_url_hear_a_revocation_within_a_second() {
    let Some(db) = Behind::start("replicas behind PgBouncer").await else {
        return;
    };
    let upstream = Upstream::start().await;
    let extra = config(&db.pooled_url(), Some(&db.direct_url()), "");
    let a = Gateway::start_on(&upstream.url(), &extra, None).await;
    let b = Gateway::start_on(&upstream.url(), &extra, None).await;
    for gw in [&a, &b] {
        // "ready" alone: the channel listens.
        wait_for("the replica listens", Duration::from_secs(10), async || {
            readyz(gw).await == (200, "ready".into())
        })
        .await;
    }
    assert!(listener_up(&b).await);

    let took = key_revocation_reaches(&a, &b, Duration::from_secs(1)).await;
    println!("a key revoked on A was refused by B after {took:?}");

    // A logout ends one session: no audit event, only the channel says so.
    let bearer = format!("Bearer {}", login(&a, "pooled@example.com").await);
    assert_eq!(status_with(&b, &bearer).await, 200, "B knows the session");
    let logout = a
        .client()
        .post(a.https("/api/auth/logout"))
        .header("X-Authorization", &bearer)
        .send()
        .await
        .unwrap();
    assert_eq!(logout.status(), 200);
    let took = wait_for(
        "B refuses the ended session",
        Duration::from_secs(1),
        async || status_with(&b, &bearer).await == 401,
    )
    .await;
    println!("a logout on A was refused by B after {took:?}");

    a.running.shutdown();
    b.running.shutdown();
    db.finish().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn without_a_notify_url_behind_pgbouncer_readyz_says_so_and_a_revocation_is_polled() {
    let Some(db) = Behind::start("replicas behind PgBouncer without notify_url").await else {
        return;
    };
    let upstream = Upstream::start().await;
    let extra = config(&db.pooled_url(), None, "");
    let a = Gateway::start_on(&upstream.url(), &extra, None).await;
    let b = Gateway::start_on(&upstream.url(), &extra, None).await;
    let (status, detail) = readyz(&b).await;
    assert_eq!(status, 200, "polled is slower, not wrong: still ready");
    assert!(detail.starts_with("ready\n"), "{detail}");
    assert!(
        detail.contains("revocation channel: not listening")
            && detail.contains("store.notify_url is not set")
            && detail.contains("polled every 1 s"),
        "{detail}"
    );
    assert!(
        !b.metrics().await.contains("keygate_revocation_listener_up"),
        "no listener is tried through the pooler"
    );

    // The bound: one poll interval, and a little for the poll itself.
    let bound = keygate::auth::revocation::POLL_INTERVAL + Duration::from_millis(500);
    let took = key_revocation_reaches(&a, &b, bound).await;
    println!("without the channel, a key revoked on A was refused by B after {took:?}");

    a.running.shutdown();
    b.running.shutdown();
    db.finish().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_notify_url_that_cannot_listen_is_named_in_readyz_which_stays_ready() {
    let Some(db) = Behind::start("a notify_url that cannot listen").await else {
        return;
    };
    let upstream = Upstream::start().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = format!(
        "postgres://postgres@127.0.0.1:{}/{}",
        closed.local_addr().unwrap().port(),
        db.database
    );
    drop(closed);
    // Migrations go over notify_url too: this store is migrated already.
    let migrated = config(&db.pooled_url(), None, "");
    Gateway::start_on(&upstream.url(), &migrated, None)
        .await
        .running
        .shutdown();
    let extra = config(&db.pooled_url(), Some(&nowhere), "migrate = \"never\"\n");
    let gw = Gateway::start_on(&upstream.url(), &extra, None).await;
    wait_for(
        "readyz names the failure",
        Duration::from_secs(5),
        async || {
            let (status, detail) = readyz(&gw).await;
            assert_eq!(status, 200, "{detail}");
            detail.contains("revocation channel: not listening (cannot connect or LISTEN")
        },
    )
    .await;
    gw.running.shutdown();
    db.finish().await;
}
