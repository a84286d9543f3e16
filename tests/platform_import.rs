//! Moving from the platform: `keygate import platform` reads a database laid
//! out as the platform's (its tables, built here from the platform's column
//! definitions) and its users, passwords, keys and invitations then work
//! through keygate as they did on the platform; with `[platform]
//! database_url`, `keygate serve` keeps in sync with it. Needs PostgreSQL: the tests
//! that do are ignored unless run with `--include-ignored` and
//! KEYGATE_TEST_DATABASE_URL set (CI does both); the test of an unreachable
//! database always runs.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::platform::{NULL_UUID, PlatformDouble};
use common::totp::{step_now, totp_at};
use common::{Gateway, Upstream, api_key_header, drop_schema, fresh_schema, gateway, wait_until};
use sqlx::Connection;
use sqlx::postgres::PgConnection;
use uuid::Uuid;

const NULL: &str = "13814000-1dd2-11b2-8080-808080808080";
const PLATFORM_PASSWORD: &str = "platform-Passw0rd!";
const NEW_PASSWORD: &str = "keygate-Passw0rd!2";
const INVITATION: &str = "platformActivationToken0123456789";
const SIGNING_KEY: &str =
    "c2VjcmV0LXNpZ25pbmcta2V5LW9mLXRoZS1wbGF0Zm9ybS1mb3ItdGhlLWltcG9ydC10ZXN0cy0wMTIzNDU2Nzg5";

/// The platform's tables the import reads, with the platform's columns.
const PLATFORM_SCHEMA: &str = "
CREATE TABLE tb_user (
    id uuid NOT NULL PRIMARY KEY, created_time bigint NOT NULL, additional_info varchar,
    authority varchar(255), customer_id uuid, email varchar(255) UNIQUE,
    first_name varchar(255), last_name varchar(255), phone varchar(255),
    tenant_id uuid, version BIGINT DEFAULT 1);
CREATE TABLE user_credentials (
    id uuid NOT NULL PRIMARY KEY, created_time bigint NOT NULL,
    activate_token varchar(255) UNIQUE, activate_token_exp_time BIGINT, enabled boolean,
    password varchar(255), reset_token varchar(255) UNIQUE, reset_token_exp_time BIGINT,
    user_id uuid UNIQUE, additional_info varchar DEFAULT '{}', last_login_ts BIGINT,
    failed_login_attempts INT);
CREATE TABLE api_key (
    id uuid NOT NULL PRIMARY KEY, created_time bigint NOT NULL, tenant_id uuid, user_id uuid,
    value varchar(512) UNIQUE, enabled boolean NOT NULL DEFAULT TRUE,
    expiration_time bigint DEFAULT 0, description varchar(255));
CREATE TABLE admin_settings (
    id uuid NOT NULL PRIMARY KEY, tenant_id uuid NOT NULL, created_time bigint NOT NULL,
    json_value varchar, key varchar(255));
CREATE TABLE customer (
    id uuid NOT NULL PRIMARY KEY, created_time bigint NOT NULL, tenant_id uuid,
    title varchar(255), is_public boolean, version BIGINT DEFAULT 1);
CREATE TABLE user_auth_settings (
    id uuid NOT NULL PRIMARY KEY, created_time bigint NOT NULL,
    user_id uuid UNIQUE NOT NULL REFERENCES tb_user(id), two_fa_settings varchar);
";

/// The platform's database, filled: a user of every authority, a disabled
/// and a pending one, and keys enabled, disabled and expired.
struct Platform {
    base: String,
    schema: String,
    url: String,
    tenant: Uuid,
    customer: Uuid,
    sysadmin: Uuid,
    admin: Uuid,
    customer_user: Uuid,
    disabled: Uuid,
    pending: Uuid,
    admin_key: String,
    customer_key: String,
    disabled_key: String,
    expired_key: String,
}

fn bcrypt_2a(password: &str) -> String {
    bcrypt::hash_with_result(password, 10)
        .unwrap()
        .format_for_version(bcrypt::Version::TwoA)
}

impl Platform {
    async fn start() -> Platform {
        let base = common::test_database_url();
        let (url, schema) = fresh_schema(&base).await;
        let mut db = PgConnection::connect(&url).await.unwrap();
        sqlx::raw_sql(PLATFORM_SCHEMA)
            .execute(&mut db)
            .await
            .unwrap();
        let platform = Platform {
            base,
            schema,
            url,
            tenant: Uuid::new_v4(),
            customer: Uuid::new_v4(),
            sysadmin: Uuid::new_v4(),
            admin: Uuid::new_v4(),
            customer_user: Uuid::new_v4(),
            disabled: Uuid::new_v4(),
            pending: Uuid::new_v4(),
            admin_key: format!("tb_{}", Uuid::new_v4().simple()),
            customer_key: format!("tb_{}", Uuid::new_v4().simple()),
            disabled_key: format!("tb_{}", Uuid::new_v4().simple()),
            expired_key: format!("tb_{}", Uuid::new_v4().simple()),
        };
        let hash = bcrypt_2a(PLATFORM_PASSWORD);
        let null = Uuid::parse_str(NULL).unwrap();
        let (t, c) = (platform.tenant, platform.customer);
        let users = [
            (
                platform.sysadmin,
                "sysadmin@platform.test",
                "SYS_ADMIN",
                null,
                null,
                true,
                Some(&hash),
                None,
            ),
            (
                platform.admin,
                "Tenant@Platform.test",
                "TENANT_ADMIN",
                t,
                null,
                true,
                Some(&hash),
                None,
            ),
            (
                platform.customer_user,
                "customer@platform.test",
                "CUSTOMER_USER",
                t,
                c,
                true,
                Some(&hash),
                None,
            ),
            (
                platform.disabled,
                "disabled@platform.test",
                "TENANT_ADMIN",
                t,
                null,
                false,
                Some(&hash),
                None,
            ),
            (
                platform.pending,
                "pending@platform.test",
                "CUSTOMER_USER",
                t,
                c,
                false,
                None,
                Some(INVITATION),
            ),
        ];
        for (id, email, authority, tenant, customer, enabled, password, invitation) in users {
            sqlx::query(
                "INSERT INTO tb_user (id, created_time, additional_info, authority, customer_id, email, \
                 first_name, last_name, phone, tenant_id) VALUES ($1::uuid, 1700000000000, '{\"lang\":\"en_US\"}', \
                 $2, $3::uuid, $4, 'First', 'Last', '+100', $5::uuid)",
            )
            .bind(id.to_string())
            .bind(authority)
            .bind(customer.to_string())
            .bind(email)
            .bind(tenant.to_string())
            .execute(&mut db)
            .await
            .unwrap();
            sqlx::query(
                "INSERT INTO user_credentials (id, created_time, enabled, password, activate_token, \
                 activate_token_exp_time, user_id) VALUES ($1::uuid, 1700000000000, $2, $3, $4, $5, $6::uuid)",
            )
            .bind(Uuid::new_v4().to_string())
            .bind(enabled)
            .bind(password)
            .bind(invitation)
            .bind(keygate::clock::now_ms() + 3_600_000)
            .bind(id.to_string())
            .execute(&mut db)
            .await
            .unwrap();
        }
        let keys = [
            (platform.admin, &platform.admin_key, true, 0_i64),
            (platform.customer_user, &platform.customer_key, true, 0),
            (platform.admin, &platform.disabled_key, false, 0),
            (platform.admin, &platform.expired_key, true, 1_000),
        ];
        for (owner, value, enabled, expiration) in keys {
            sqlx::query(
                "INSERT INTO api_key (id, created_time, tenant_id, user_id, value, enabled, \
                 expiration_time, description) VALUES ($1::uuid, 1700000000000, $2::uuid, $3::uuid, $4, $5, $6, 'integration')",
            )
            .bind(Uuid::new_v4().to_string())
            .bind(t.to_string())
            .bind(owner.to_string())
            .bind(value)
            .bind(enabled)
            .bind(expiration)
            .execute(&mut db)
            .await
            .unwrap();
        }
        // The customer of the customer users, in their tenant.
        sqlx::query(
            "INSERT INTO customer (id, created_time, tenant_id, title, is_public) \
             VALUES ($1::uuid, 1, $2::uuid, 'Customer', FALSE)",
        )
        .bind(c.to_string())
        .bind(t.to_string())
        .execute(&mut db)
        .await
        .unwrap();
        let jwt = format!(
            r#"{{"tokenExpirationTime":9000,"refreshTokenExpTime":604800,"tokenIssuer":"platform.test","tokenSigningKey":"{SIGNING_KEY}"}}"#
        );
        sqlx::query(
            "INSERT INTO admin_settings (id, tenant_id, created_time, json_value, key) \
             VALUES ($1::uuid, $2::uuid, 1, $3, 'jwt')",
        )
        .bind(Uuid::new_v4().to_string())
        .bind(null.to_string())
        .bind(jwt)
        .execute(&mut db)
        .await
        .unwrap();
        platform
    }

    async fn execute(&self, sql: &str) {
        let mut db = PgConnection::connect(&self.url).await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&mut db)
            .await
            .unwrap();
    }

    /// Adds users with password hashes, as the platform's tables hold them
    /// (whatever the platform's own checks would have said of them), in one
    /// transaction: a sync round sees all of them or none.
    async fn add_users(&self, users: &[(&str, &str, Uuid, Uuid, &str)]) -> Vec<Uuid> {
        let mut db = PgConnection::connect(&self.url).await.unwrap();
        let mut tx = db.begin().await.unwrap();
        let mut ids = Vec::new();
        for (email, authority, tenant, customer, hash) in users {
            let id = Uuid::new_v4();
            sqlx::query(
                "INSERT INTO tb_user (id, created_time, authority, customer_id, email, first_name, tenant_id) \
                 VALUES ($1::uuid, 1700000000002, $2, $3::uuid, $4, 'First', $5::uuid)",
            )
            .bind(id.to_string())
            .bind(*authority)
            .bind(customer.to_string())
            .bind(*email)
            .bind(tenant.to_string())
            .execute(&mut *tx)
            .await
            .unwrap();
            sqlx::query(
                "INSERT INTO user_credentials (id, created_time, enabled, password, user_id) \
                 VALUES ($1::uuid, 1700000000002, TRUE, $2, $3::uuid)",
            )
            .bind(Uuid::new_v4().to_string())
            .bind(*hash)
            .bind(id.to_string())
            .execute(&mut *tx)
            .await
            .unwrap();
            ids.push(id);
        }
        tx.commit().await.unwrap();
        ids
    }

    async fn add_user(
        &self,
        email: &str,
        authority: &str,
        tenant: Uuid,
        customer: Uuid,
        hash: &str,
    ) -> Uuid {
        self.add_users(&[(email, authority, tenant, customer, hash)])
            .await[0]
    }

    async fn drop(self) {
        drop_schema(&self.base, &self.schema).await;
    }
}

/// Runs `keygate import platform` on the gateway's store.
async fn import(gw: &Gateway, database_url: &str, extra: &[&str]) -> Output {
    let config = gw.dir.path().join("keygate.toml");
    let mut args = vec![
        "import".to_owned(),
        "platform".to_owned(),
        "--database-url".to_owned(),
        database_url.to_owned(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    tokio::task::spawn_blocking(move || keygate(&config, &args))
        .await
        .unwrap()
}

fn keygate(config: &Path, args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keygate"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("KEYGATE_CONFIG")
        .env_remove("KEYGATE_PLATFORM_DATABASE_URL")
        .output()
        .unwrap()
}

/// The `--json` report of a successful import.
async fn import_json(gw: &Gateway, platform: &Platform, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["--json"];
    args.extend_from_slice(extra);
    let out = import(gw, &platform.url, &args).await;
    assert!(
        out.status.success(),
        "import failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

async fn current_user(gw: &Gateway, authorization: &str) -> reqwest::Response {
    gw.client()
        .get(gw.https("/api/auth/user"))
        .header("X-Authorization", authorization)
        .send()
        .await
        .unwrap()
}

async fn bearer(gw: &Gateway, email: &str, password: &str) -> Option<String> {
    let response = gw.login(email, password).await;
    if response.status() != 200 {
        return None;
    }
    let body: serde_json::Value = response.json().await.unwrap();
    Some(format!("Bearer {}", body["token"].as_str().unwrap()))
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn imported_users_log_in_with_their_platform_passwords_and_keys_as_themselves() {
    let platform = Platform::start().await;
    let (_upstream, gw) = gateway("").await;
    let report = import_json(&gw, &platform, &[]).await;
    assert_eq!(report["users"]["added"], 5, "{report}");
    assert_eq!(report["keys"]["added"], 4, "{report}");
    assert_eq!(report["signing"]["state"], "imported", "{report}");
    assert_eq!(
        gw.running.store.platform_signing().await.unwrap(),
        Some((SIGNING_KEY.to_owned(), "platform.test".to_owned()))
    );

    // The platform's password, and the platform's ids.
    let token = bearer(&gw, "tenant@platform.test", PLATFORM_PASSWORD)
        .await
        .expect("the platform password logs in");
    let me: serde_json::Value = current_user(&gw, &token).await.json().await.unwrap();
    assert_eq!(me["id"]["id"], platform.admin.to_string(), "{me}");
    assert_eq!(me["tenantId"]["id"], platform.tenant.to_string(), "{me}");
    assert_eq!(me["authority"], "TENANT_ADMIN", "{me}");
    assert_eq!(me["firstName"], "First", "{me}");
    let customer = bearer(&gw, "customer@platform.test", PLATFORM_PASSWORD)
        .await
        .expect("a customer user logs in");
    let me: serde_json::Value = current_user(&gw, &customer).await.json().await.unwrap();
    assert_eq!(
        me["customerId"]["id"],
        platform.customer.to_string(),
        "{me}"
    );
    assert!(
        bearer(&gw, "sysadmin@platform.test", PLATFORM_PASSWORD)
            .await
            .is_some()
    );

    // The platform's key values, as their owners.
    for (value, owner) in [
        (&platform.admin_key, platform.admin),
        (&platform.customer_key, platform.customer_user),
    ] {
        let response = current_user(&gw, &api_key_header(value)).await;
        assert_eq!(response.status(), 200);
        let me: serde_json::Value = response.json().await.unwrap();
        assert_eq!(me["id"]["id"], owner.to_string(), "{me}");
    }
    for refused in [&platform.disabled_key, &platform.expired_key] {
        let response = current_user(&gw, &api_key_header(refused)).await;
        assert_eq!(response.status(), 401, "a disabled or expired key works");
    }

    // Disabled stays disabled; the pending user has no password yet.
    assert!(
        bearer(&gw, "disabled@platform.test", PLATFORM_PASSWORD)
            .await
            .is_none()
    );

    // The invitation already sent activates the pending user.
    let activated = gw
        .client()
        .post(gw.https("/api/noauth/activate"))
        .json(&serde_json::json!({ "activateToken": INVITATION, "password": NEW_PASSWORD }))
        .send()
        .await
        .unwrap();
    assert_eq!(
        activated.status(),
        200,
        "{}",
        activated.text().await.unwrap()
    );
    let pending = bearer(&gw, "pending@platform.test", NEW_PASSWORD)
        .await
        .expect("the activated user logs in");
    let me: serde_json::Value = current_user(&gw, &pending).await.json().await.unwrap();
    assert_eq!(me["id"]["id"], platform.pending.to_string());

    // The platform keeps the values in plain text; keygate never does.
    let events = gw.running.store.audit_events(100).await.unwrap();
    let imports = events
        .iter()
        .filter(|e| e.action.ends_with(".import"))
        .count();
    assert_eq!(imports, 9, "an audit event per imported user and key");
    let keys = gw
        .running
        .store
        .list_api_keys(platform.admin)
        .await
        .unwrap();
    assert!(
        keys.iter()
            .all(|k| !k.digest.contains(&platform.admin_key[3..]))
    );

    // A second import changes nothing, also for the activated user.
    let again = import_json(&gw, &platform, &[]).await;
    for kind in ["users", "keys"] {
        assert_eq!(again[kind]["added"], 0, "{again}");
        assert_eq!(again[kind]["updated"], 0, "{again}");
    }
    assert_eq!(again["users"]["unchanged"], 5, "{again}");
    assert_eq!(again["keys"]["unchanged"], 4, "{again}");
    assert_eq!(again["signing"]["state"], "unchanged", "{again}");
    platform.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_password_changed_in_keygate_survives_a_reimport() {
    let platform = Platform::start().await;
    let (_upstream, gw) = gateway("").await;
    import_json(&gw, &platform, &[]).await;
    let token = bearer(&gw, "tenant@platform.test", PLATFORM_PASSWORD)
        .await
        .unwrap();
    let changed = gw
        .client()
        .post(gw.https("/api/auth/changePassword"))
        .header("X-Authorization", &token)
        .json(&serde_json::json!({ "currentPassword": PLATFORM_PASSWORD, "newPassword": NEW_PASSWORD }))
        .send()
        .await
        .unwrap();
    assert_eq!(changed.status(), 200);
    // The platform's side changes too, after keygate's change.
    platform
        .execute(&format!(
            "UPDATE user_credentials SET password = '{}' WHERE user_id = '{}'",
            bcrypt_2a("older-Platform-1"),
            platform.admin
        ))
        .await;
    import_json(&gw, &platform, &[]).await;
    assert!(
        bearer(&gw, "tenant@platform.test", NEW_PASSWORD)
            .await
            .is_some()
    );
    assert!(
        bearer(&gw, "tenant@platform.test", "older-Platform-1")
            .await
            .is_none()
    );
    platform.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_platform_password_change_reaches_a_user_rehashed_at_login_at_a_reimport() {
    let platform = Platform::start().await;
    let (_upstream, gw) = gateway("").await;
    import_json(&gw, &platform, &[]).await;
    // The first login re-hashes the imported bcrypt hash: no password change.
    assert!(
        bearer(&gw, "tenant@platform.test", PLATFORM_PASSWORD)
            .await
            .is_some()
    );
    let again = import_json(&gw, &platform, &[]).await;
    assert_eq!(again["users"]["updated"], 0, "{again}");
    platform
        .execute(&format!(
            "UPDATE user_credentials SET password = '{}' WHERE user_id = '{}'",
            bcrypt_2a("newer-Platform-1"),
            platform.admin
        ))
        .await;
    let report = import_json(&gw, &platform, &[]).await;
    assert_eq!(report["users"]["updated"], 1, "{report}");
    for wire in common::WIRES {
        assert_eq!(
            login_over(&gw, wire, "tenant@platform.test", PLATFORM_PASSWORD).await,
            401
        );
        assert_eq!(
            login_over(&gw, wire, "tenant@platform.test", "newer-Platform-1").await,
            200
        );
    }
    // The import ran in another process on this SQLite store: the running
    // server hears of the revocation within its cache bound; the store has
    // outdated the user's tokens already.
    let users = gw.running.store.list_users().await.unwrap();
    let user = users.iter().find(|u| u.id == platform.admin).unwrap();
    assert!(user.tokens_valid_after > 0);
    platform.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_dry_run_writes_nothing() {
    let platform = Platform::start().await;
    let (_upstream, gw) = gateway("").await;
    let before = gw.running.store.list_users().await.unwrap().len();
    let report = import_json(&gw, &platform, &["--dry-run"]).await;
    assert_eq!(report["dryRun"], true);
    assert_eq!(report["users"]["added"], 5, "{report}");
    assert_eq!(report["keys"]["added"], 4, "{report}");
    assert_eq!(gw.running.store.list_users().await.unwrap().len(), before);
    assert_eq!(gw.running.store.platform_signing().await.unwrap(), None);
    assert!(
        bearer(&gw, "tenant@platform.test", PLATFORM_PASSWORD)
            .await
            .is_none()
    );
    let human = import(&gw, &platform.url, &["--dry-run"]).await;
    let summary = String::from_utf8_lossy(&human.stdout);
    assert!(
        summary.contains("dry run: nothing was written"),
        "{summary}"
    );
    assert!(summary.contains("users: 5 would be added"), "{summary}");
    platform.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_user_disabled_or_deleted_on_the_platform_follows_at_the_next_import() {
    let platform = Platform::start().await;
    // keygate on PostgreSQL: the import's revocations reach the running
    // server by notification, long before its 5 min cache expires.
    let (store_url, store_schema) = fresh_schema(&platform.base).await;
    let upstream = Upstream::start().await;
    let gw = Gateway::start_on(
        &upstream.url(),
        "[cache]\nttl = \"300s\"\n",
        Some(&store_url),
    )
    .await;
    import_json(&gw, &platform, &[]).await;
    let token = bearer(&gw, "tenant@platform.test", PLATFORM_PASSWORD)
        .await
        .unwrap();
    assert_eq!(current_user(&gw, &token).await.status(), 200);
    platform
        .execute(&format!(
            "UPDATE user_credentials SET enabled = false WHERE user_id = '{}'; \
             UPDATE tb_user SET last_name = 'Renamed' WHERE id = '{}'; \
             DELETE FROM api_key WHERE user_id = '{}'; DELETE FROM tb_user WHERE id = '{}';",
            platform.admin, platform.sysadmin, platform.customer_user, platform.customer_user
        ))
        .await;
    let report = import_json(&gw, &platform, &[]).await;
    assert_eq!(report["users"]["updated"], 2, "{report}");
    assert_eq!(report["users"]["deletedOnPlatform"], 1, "{report}");
    assert_eq!(report["keys"]["deletedOnPlatform"], 1, "{report}");
    // The disabled user's token and key stop working at once.
    let at_once = Duration::from_secs(10);
    wait_until("the disabled user's token refused", at_once, async || {
        current_user(&gw, &token).await.status() == 401
    })
    .await;
    wait_until("the disabled user's key refused", at_once, async || {
        current_user(&gw, &api_key_header(&platform.admin_key))
            .await
            .status()
            == 401
    })
    .await;
    // The deleted one stays until --prune.
    assert!(
        bearer(&gw, "customer@platform.test", PLATFORM_PASSWORD)
            .await
            .is_some()
    );
    let pruned = import_json(&gw, &platform, &["--prune"]).await;
    assert_eq!(pruned["users"]["removed"], 1, "{pruned}");
    assert!(
        bearer(&gw, "customer@platform.test", PLATFORM_PASSWORD)
            .await
            .is_none()
    );
    wait_until("the pruned user's key refused", at_once, async || {
        current_user(&gw, &api_key_header(&platform.customer_key))
            .await
            .status()
            == 401
    })
    .await;
    drop(gw);
    drop_schema(&platform.base, &store_schema).await;
    platform.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_database_that_is_not_the_platforms_is_refused_naming_what_is_missing() {
    let base = common::test_database_url();
    let (url, schema) = fresh_schema(&base).await;
    let (_upstream, gw) = gateway("").await;
    let out = import(&gw, &url, &[]).await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not the platform's database"), "{stderr}");
    assert!(stderr.contains("table tb_user"), "{stderr}");
    assert!(stderr.contains("table api_key"), "{stderr}");
    drop_schema(&base, &schema).await;
}

/// `check-config --connect` on a config whose sync reads `database_url`.
async fn check_connect(gw: &Gateway, database_url: &str, platform_upstream: &str) -> Output {
    let config = gw.dir.path().join("checked.toml");
    let text = std::fs::read_to_string(gw.dir.path().join("keygate.toml")).unwrap();
    std::fs::write(
        &config,
        format!(
            "{text}\n{}",
            sync_config(database_url, platform_upstream, SYNC_INTERVAL)
        ),
    )
    .unwrap();
    let args = ["check-config".to_owned(), "--connect".to_owned()];
    tokio::task::spawn_blocking(move || keygate(&config, &args))
        .await
        .unwrap()
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn check_config_connect_reads_the_platforms_tables_and_finds_its_signing_key_row() {
    let (upstream, gw) = gateway("").await;
    // Without Redis and without a platform database: each is said to be not
    // configured, never "reached".
    let args = ["check-config".to_owned(), "--connect".to_owned()];
    let config = gw.dir.path().join("keygate.toml");
    let out = tokio::task::spawn_blocking(move || keygate(&config, &args))
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("store reached"), "{stdout}");
    assert!(stdout.contains("Redis not configured"), "{stdout}");
    assert!(
        stdout.contains("platform database not configured"),
        "{stdout}"
    );

    // A database without the platform's tables: each missing one is named.
    let base = common::test_database_url();
    let (empty_url, empty_schema) = fresh_schema(&base).await;
    let out = check_connect(&gw, &empty_url, &upstream.url()).await;
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("platform.database_url"), "{stderr}");
    assert!(stderr.contains("table tb_user"), "{stderr}");
    assert!(stderr.contains("table admin_settings"), "{stderr}");

    // The platform's tables without its `jwt` row: no signing key.
    let platform = Platform::start().await;
    platform
        .execute("DELETE FROM admin_settings WHERE key = 'jwt'")
        .await;
    let out = check_connect(&gw, &platform.url, &upstream.url()).await;
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no signing key"), "{stderr}");

    // A key too short for HS512 is named as such.
    platform
        .execute(
            "INSERT INTO admin_settings (id, tenant_id, created_time, json_value, key) VALUES \
             (gen_random_uuid(), '13814000-1dd2-11b2-8080-808080808080', 1, \
             '{\"tokenIssuer\":\"platform.test\",\"tokenSigningKey\":\"c2hvcnQ=\"}', 'jwt')",
        )
        .await;
    let out = check_connect(&gw, &platform.url, &upstream.url()).await;
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("fewer than the 512 HS512 needs"),
        "{stderr}"
    );

    // With the row as the platform writes it, all is reached.
    platform
        .execute(&format!(
            "UPDATE admin_settings SET json_value = \
             '{{\"tokenIssuer\":\"platform.test\",\"tokenSigningKey\":\"{SIGNING_KEY}\"}}' \
             WHERE key = 'jwt'"
        ))
        .await;
    let out = check_connect(&gw, &platform.url, &upstream.url()).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("platform database reached, its tables and signing key found"),
        "{stdout}"
    );
    drop_schema(&base, &empty_schema).await;
    platform.drop().await;
}

#[tokio::test]
async fn an_unreachable_platform_database_is_named_with_host_port_and_cause() {
    let (_upstream, gw) = gateway("").await;
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://reader@127.0.0.1:{port}/thingsboard");
    let before = gw.running.store.list_users().await.unwrap();
    let out = import(&gw, &url, &[]).await;
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.contains("cannot reach"))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    assert!(line.contains(&format!("127.0.0.1:{port}")), "{line}");
    assert!(line.contains("thingsboard"), "{line}");
    assert!(line.to_lowercase().contains("refused"), "{line}");
    assert_eq!(gw.running.store.list_users().await.unwrap(), before);
}

/// A platform route in front of `double`, with no `[platform] signing_key`:
/// the key comes from the store, where the import put it.
fn platform_route(double: &PlatformDouble) -> String {
    format!(
        r#"
[[route]]
name = "platform"
prefix = "/api/tb/"
identity = "platform"
upstreams = ["{}"]
"#,
        double.url()
    )
}

async fn public_login(gw: &Gateway, public_id: Uuid) -> reqwest::Response {
    gw.client()
        .post(gw.https("/api/auth/login/public"))
        .json(&serde_json::json!({ "publicId": public_id.to_string() }))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn an_imported_key_reaches_an_unmodified_platform_as_its_owner_with_the_platforms_ids() {
    let platform = Platform::start().await;
    let (_upstream, gw) = gateway("").await;
    let report = import_json(&gw, &platform, &[]).await;
    assert_eq!(report["signing"]["state"], "imported", "{report}");

    // A replica started after the import signs with the platform's own key:
    // the double checks the signature with that key alone.
    let double = PlatformDouble::start(SIGNING_KEY).await;
    let store_url = format!("sqlite://{}/keygate.db", gw.dir.path().display());
    let upstream = Upstream::start().await;
    let replica =
        Gateway::start_on(&upstream.url(), &platform_route(&double), Some(&store_url)).await;
    for (value, owner, email, customer) in [
        (
            &platform.admin_key,
            platform.admin,
            "tenant@platform.test",
            NULL_UUID.to_owned(),
        ),
        (
            &platform.customer_key,
            platform.customer_user,
            "customer@platform.test",
            platform.customer.to_string(),
        ),
    ] {
        let response = replica
            .client()
            .get(replica.https("/api/tb/user"))
            .header("X-Authorization", api_key_header(value))
            .send()
            .await
            .unwrap();
        let status = response.status();
        let user: serde_json::Value = response.json().await.unwrap();
        assert_eq!(status, 200, "the platform accepted keygate's token: {user}");
        assert_eq!(user["id"], owner.to_string(), "{user}");
        assert_eq!(
            user["email"].as_str().unwrap().to_lowercase(),
            email,
            "{user}"
        );
        assert_eq!(user["tenantId"], platform.tenant.to_string(), "{user}");
        assert_eq!(user["customerId"], customer, "{user}");
    }
    // The platform never sees the client's key.
    assert!(
        double
            .seen()
            .iter()
            .all(|seen| !seen.contains(&platform.admin_key)
                && !seen.contains(&platform.customer_key))
    );
    platform.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_platform_key_shorter_than_hs512_needs_is_not_imported_and_keygate_still_starts() {
    let platform = Platform::start().await;
    // A 55-byte key: the platform itself replaces such a key at install.
    platform
        .execute(
            "UPDATE admin_settings SET json_value = '{\"tokenIssuer\":\"platform.test\",\
             \"tokenSigningKey\":\"c2VjcmV0LXNpZ25pbmcta2V5LW9mLXRoZS1wbGF0Zm9ybS0xMjM0NTY3ODkwMTIzNDU2Nzg5MA==\"}' \
             WHERE key = 'jwt'",
        )
        .await;
    let (_upstream, gw) = gateway("").await;
    let report = import_json(&gw, &platform, &[]).await;
    assert_eq!(report["signing"]["state"], "invalid", "{report}");
    assert!(
        report["signing"]["reason"]
            .as_str()
            .unwrap()
            .contains("440 bits"),
        "{report}"
    );
    assert_eq!(gw.running.store.platform_signing().await.unwrap(), None);
    // Users and keys came in all the same, and a restart on the store works.
    assert_eq!(report["users"]["added"], 5, "{report}");
    let store_url = format!("sqlite://{}/keygate.db", gw.dir.path().display());
    let upstream = Upstream::start().await;
    let replica = Gateway::start_on(&upstream.url(), "", Some(&store_url)).await;
    let response = current_user(&replica, &api_key_header(&platform.admin_key)).await;
    assert_eq!(response.status(), 200);
    platform.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn customers_the_platform_marks_public_open_a_public_login_after_the_import() {
    let platform = Platform::start().await;
    let public = Uuid::new_v4();
    platform
        .execute(&format!(
            "INSERT INTO customer (id, created_time, tenant_id, title, is_public) VALUES \
             ('{public}', 1, '{tenant}', 'Public', TRUE), \
             ('{orphan}', 3, NULL, 'Orphan', TRUE)",
            tenant = platform.tenant,
            orphan = Uuid::new_v4(),
        ))
        .await;
    let (_upstream, gw) = gateway("").await;
    let dry = import_json(&gw, &platform, &["--dry-run"]).await;
    assert_eq!(dry["publicCustomers"], 1, "{dry}");
    assert_eq!(
        public_login(&gw, public).await.status(),
        401,
        "a dry run stores none"
    );
    let report = import_json(&gw, &platform, &[]).await;
    assert_eq!(report["publicCustomers"], 1, "{report}");
    let skipped = report["skipped"].as_array().unwrap();
    assert!(
        skipped
            .iter()
            .any(|s| s["kind"] == "public customer" && s["reason"] == "it has no tenant"),
        "{report}"
    );
    let response = public_login(&gw, public).await;
    assert_eq!(response.status(), 200);
    let pair: serde_json::Value = response.json().await.unwrap();
    let token = pair["token"].as_str().unwrap();
    let me: serde_json::Value = current_user(&gw, &format!("Bearer {token}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(me["tenantId"]["id"], platform.tenant.to_string());
    assert_eq!(me["customerId"]["id"], public.to_string());
    assert_eq!(public_login(&gw, platform.customer).await.status(), 401);
    // The platform stops marking it public: the next import follows.
    platform
        .execute(&format!(
            "UPDATE customer SET is_public = FALSE WHERE id = '{public}'"
        ))
        .await;
    let report = import_json(&gw, &platform, &[]).await;
    assert_eq!(report["publicCustomers"], 0, "{report}");
    assert_eq!(public_login(&gw, public).await.status(), 401);
    let human = import(&gw, &platform.url, &[]).await;
    assert!(
        String::from_utf8_lossy(&human.stdout).contains("public customers: 0 stored"),
        "{}",
        String::from_utf8_lossy(&human.stdout)
    );
    platform.drop().await;
}

// --- second factors ---------------------------------------------------------------

const PLATFORM_TOTP: &str = "JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP";
const OTHER_TOTP: &str = "KRSXG5CTMVRXEZLUKRSXG5CTMVRXEZLU";

/// The platform's `AccountTwoFaSettings` JSON, as it stores it (secrets in
/// plain text).
fn two_fa_json(secret: &str, codes: &[&str]) -> String {
    serde_json::json!({"configs": {
        "TOTP": {"providerType": "TOTP", "useByDefault": true,
                 "authUrl": format!("otpauth://totp/ThingsBoard:tenant%40platform.test?issuer=ThingsBoard&secret={secret}")},
        "BACKUP_CODE": {"providerType": "BACKUP_CODE", "useByDefault": false, "codes": codes, "codesLeft": codes.len()}
    }})
    .to_string()
}

impl Platform {
    async fn set_two_fa(&self, user: Uuid, json: &str) {
        let mut db = PgConnection::connect(&self.url).await.unwrap();
        sqlx::query(
            "INSERT INTO user_auth_settings (id, created_time, user_id, two_fa_settings) \
             VALUES ($1::uuid, 1700000000000, $2::uuid, $3) \
             ON CONFLICT (user_id) DO UPDATE SET two_fa_settings = excluded.two_fa_settings",
        )
        .bind(Uuid::new_v4().to_string())
        .bind(user.to_string())
        .bind(json)
        .execute(&mut db)
        .await
        .unwrap();
    }
}

/// A password login that must answer a pre-verification token.
async fn pre_token(gw: &Gateway, email: &str) -> String {
    let body: serde_json::Value = gw
        .login(email, PLATFORM_PASSWORD)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body["scope"], "PRE_VERIFICATION_TOKEN", "{body}");
    body["token"].as_str().unwrap().to_owned()
}

async fn check(gw: &Gateway, pre: &str, provider: &str, code: &str) -> reqwest::Response {
    gw.client()
        .post(gw.https(&format!(
            "/api/auth/2fa/verification/check?providerType={provider}&verificationCode={code}"
        )))
        .header("X-Authorization", format!("Bearer {pre}"))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn platform_second_factors_are_imported_sealed_and_log_in_with_the_platform_codes() {
    let platform = Platform::start().await;
    let (_upstream, gw) = gateway("").await;
    platform
        .set_two_fa(
            platform.admin,
            &two_fa_json(PLATFORM_TOTP, &["0a1b2c3d", "4e5f6a7b"]),
        )
        .await;
    platform
        .set_two_fa(
            platform.customer_user,
            r#"{"configs":{"EMAIL":{"providerType":"EMAIL","useByDefault":true,"email":"customer@platform.test"}}}"#,
        )
        .await;
    let report = import_json(&gw, &platform, &[]).await;
    assert_eq!(report["twoFactors"]["added"], 2, "{report}");
    assert_eq!(report["twoFactors"]["skipped"], 1, "{report}");
    let skipped = report["skipped"].as_array().unwrap();
    assert!(
        skipped.iter().any(|s| s["kind"] == "second factor"
            && s["id"] == platform.customer_user.to_string()
            && s["reason"].as_str().unwrap().starts_with("EMAIL")),
        "{report}"
    );

    // Stored the keygate way: neither the secret nor a code in clear.
    let url = format!("sqlite://{}/keygate.db", gw.dir.path().display());
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&url).await.unwrap();
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT provider, secret FROM two_factor WHERE user_id = $1")
            .bind(platform.admin.to_string())
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), 2);
    for (provider, stored) in &rows {
        assert!(!stored.to_uppercase().contains(PLATFORM_TOTP), "{provider}");
        assert!(
            !stored.contains("0a1b2c3d") && !stored.contains("4e5f6a7b"),
            "{provider}"
        );
    }
    pool.close().await;

    // The platform's authenticator app and backup codes log in.
    let pre = pre_token(&gw, "tenant@platform.test").await;
    let response = check(&gw, &pre, "TOTP", &totp_at(PLATFORM_TOTP, step_now())).await;
    assert_eq!(response.status(), 200);
    let pre = pre_token(&gw, "tenant@platform.test").await;
    let response = check(&gw, &pre, "BACKUP_CODE", "4e5f6a7b").await;
    assert_eq!(response.status(), 200);
    let pair: serde_json::Value = response.json().await.unwrap();
    assert_eq!(pair["codesLeft"], 1);
    // A user whose only provider keygate does not offer has no second step.
    assert!(
        bearer(&gw, "customer@platform.test", PLATFORM_PASSWORD)
            .await
            .is_some()
    );

    // Unchanged on the platform: a re-import changes nothing (the used
    // backup code stays used).
    let again = import_json(&gw, &platform, &[]).await;
    assert_eq!(again["twoFactors"]["added"], 0, "{again}");
    assert_eq!(again["twoFactors"]["updated"], 0, "{again}");
    assert_eq!(again["twoFactors"]["unchanged"], 2, "{again}");
    let pre = pre_token(&gw, "tenant@platform.test").await;
    assert_eq!(
        check(&gw, &pre, "BACKUP_CODE", "4e5f6a7b").await.status(),
        400
    );
    platform.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_second_factor_changed_in_keygate_survives_a_reimport_and_platform_changes_follow() {
    let platform = Platform::start().await;
    let (_upstream, gw) = gateway("").await;
    platform
        .set_two_fa(platform.admin, &two_fa_json(PLATFORM_TOTP, &["0a1b2c3d"]))
        .await;
    import_json(&gw, &platform, &[]).await;
    let pre = pre_token(&gw, "tenant@platform.test").await;
    let step = step_now();
    let pair: serde_json::Value = check(&gw, &pre, "TOTP", &totp_at(PLATFORM_TOTP, step))
        .await
        .json()
        .await
        .unwrap();
    let access = format!("Bearer {}", pair["token"].as_str().unwrap());
    // In keygate, the user removes the backup codes.
    let removed = gw
        .client()
        .delete(gw.https("/api/2fa/account/config?providerType=BACKUP_CODE"))
        .header("X-Authorization", &access)
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), 200);

    // On the platform, both change: the TOTP secret (still keygate's
    // imported one) follows; the backup codes (removed in keygate) do not
    // come back.
    platform
        .set_two_fa(platform.admin, &two_fa_json(OTHER_TOTP, &["99998888"]))
        .await;
    let report = import_json(&gw, &platform, &[]).await;
    assert_eq!(report["twoFactors"]["updated"], 1, "{report}");
    assert_eq!(report["twoFactors"]["added"], 0, "{report}");
    let pre = pre_token(&gw, "tenant@platform.test").await;
    assert_eq!(
        check(&gw, &pre, "BACKUP_CODE", "99998888").await.status(),
        400
    );
    let response = check(&gw, &pre, "TOTP", &totp_at(OTHER_TOTP, step_now())).await;
    assert_eq!(response.status(), 200);

    // Converges: the same import again changes nothing.
    let again = import_json(&gw, &platform, &[]).await;
    assert_eq!(again["twoFactors"]["updated"], 0, "{again}");
    assert_eq!(again["twoFactors"]["added"], 0, "{again}");

    // Gone from the platform: keygate's imported TOTP goes too.
    platform
        .execute(&format!(
            "DELETE FROM user_auth_settings WHERE user_id = '{}'",
            platform.admin
        ))
        .await;
    let report = import_json(&gw, &platform, &[]).await;
    assert_eq!(report["twoFactors"]["removed"], 1, "{report}");
    let body: serde_json::Value = gw
        .login("tenant@platform.test", PLATFORM_PASSWORD)
        .await
        .json()
        .await
        .unwrap();
    assert!(body["refreshToken"].is_string(), "{body}");
    platform.drop().await;
}

// Keeping in sync: `[platform] database_url` makes `keygate serve` read the
// platform's database every `sync_interval` and apply it as a re-import
// with `--prune` does. A short interval here; the store is SQLite (one
// replica), so what the sync revokes takes effect through this replica's
// own revocation path.

/// How long a change on the platform may take to arrive: many sync rounds
/// of [`SYNC_INTERVAL`] on a loaded machine.
const SYNCED: Duration = Duration::from_secs(20);
const SYNC_INTERVAL: &str = "200ms";

/// The platform's signing key as configured for the platform route (the
/// fixture's own is shorter than the platform accepts for minting).
const MINTING_KEY: &str =
    "a2V5Z2F0ZS1zeW5jLXRlc3RzLW1pbnRpbmcta2V5LWZvci10aGUtcGxhdGZvcm0tcm91dGUtMTIzNDU2Nzg5MA==";

/// The config of a syncing keygate: the platform's database, and the route
/// with the platform's own tokens the user endpoints go to. A cached
/// credential state lives 300 s: what ends sooner was revoked.
fn sync_config(database_url: &str, platform_upstream: &str, interval: &str) -> String {
    format!(
        "[cache]\nttl = \"300s\"\n[platform]\nsigning_key = \"{MINTING_KEY}\"\ndatabase_url = \"{database_url}\"\n\
         sync_interval = \"{interval}\"\nupstream = \"platform\"\n\
         [[route]]\nname = \"platform\"\nprefix = \"/platform-only/\"\n\
         upstreams = [\"{platform_upstream}\"]\nidentity = \"platform\"\n"
    )
}

/// keygate syncing with `platform` in front of `upstream`, once the first
/// round has brought the platform's users in.
async fn syncing(
    platform: &Platform,
    upstream: &str,
    platform_upstream: &str,
    interval: &str,
) -> Gateway {
    let gw = Gateway::start(
        upstream,
        &sync_config(&platform.url, platform_upstream, interval),
    )
    .await;
    wait_until("the first sync", SYNCED, async || {
        bearer(&gw, "tenant@platform.test", PLATFORM_PASSWORD)
            .await
            .is_some()
    })
    .await;
    gw
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn the_sync_picks_up_a_new_user_a_changed_email_and_a_deleted_user() {
    let platform = Platform::start().await;
    let upstream = Upstream::start().await;
    let gw = syncing(&platform, &upstream.url(), &upstream.url(), SYNC_INTERVAL).await;
    let metrics = gw.metrics().await;
    assert_eq!(
        common::counter(
            &metrics,
            "keygate_platform_sync_rows_applied_total{kind=\"users_added\"}"
        ),
        5,
        "{metrics}"
    );
    assert!(!metrics.contains("keygate_platform_sync_last_success_timestamp_seconds 0\n"));

    let newcomer = Uuid::new_v4();
    let hash = bcrypt_2a(PLATFORM_PASSWORD);
    platform
        .execute(&format!(
            "INSERT INTO tb_user (id, created_time, authority, customer_id, email, tenant_id) \
             VALUES ('{newcomer}', 1700000000001, 'TENANT_ADMIN', '{NULL}', 'new@platform.test', '{}'); \
             INSERT INTO user_credentials (id, created_time, enabled, password, user_id) \
             VALUES ('{}', 1700000000001, true, '{hash}', '{newcomer}'); \
             UPDATE tb_user SET email = 'renamed@platform.test' WHERE id = '{}';",
            platform.tenant,
            Uuid::new_v4(),
            platform.admin
        ))
        .await;
    wait_until("the new user logs in", SYNCED, async || {
        bearer(&gw, "new@platform.test", PLATFORM_PASSWORD)
            .await
            .is_some()
    })
    .await;
    wait_until("the changed e-mail logs in", SYNCED, async || {
        bearer(&gw, "renamed@platform.test", PLATFORM_PASSWORD)
            .await
            .is_some()
    })
    .await;
    assert!(
        bearer(&gw, "tenant@platform.test", PLATFORM_PASSWORD)
            .await
            .is_none(),
        "the old address no longer logs in"
    );

    let customer = bearer(&gw, "customer@platform.test", PLATFORM_PASSWORD)
        .await
        .unwrap();
    platform
        .execute(&format!(
            "DELETE FROM api_key WHERE user_id = '{0}'; DELETE FROM user_credentials WHERE user_id = '{0}'; \
             DELETE FROM tb_user WHERE id = '{0}';",
            platform.customer_user
        ))
        .await;
    wait_until("the deleted user's token refused", SYNCED, async || {
        current_user(&gw, &customer).await.status() == 401
    })
    .await;
    assert_eq!(
        current_user(&gw, &api_key_header(&platform.customer_key))
            .await
            .status(),
        401
    );
    assert!(
        bearer(&gw, "customer@platform.test", PLATFORM_PASSWORD)
            .await
            .is_none()
    );
    let metrics = gw.metrics().await;
    assert_eq!(
        common::counter(
            &metrics,
            "keygate_platform_sync_rows_applied_total{kind=\"users_removed\"}"
        ),
        1,
        "{metrics}"
    );
    assert_eq!(
        common::counter(&metrics, "keygate_platform_sync_errors_total"),
        0
    );
    drop(gw);
    platform.drop().await;
}

mod socket {
    use std::time::Duration;

    use futures_util::{SinkExt, StreamExt};
    use tokio::net::TcpStream;
    use tokio_tungstenite::WebSocketStream;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    use super::common::Gateway;

    pub type Socket = WebSocketStream<tokio_rustls::client::TlsStream<TcpStream>>;

    /// A socket to `/api/ws` authenticated by its first frame with the API
    /// key `key`, its first message echoed by the reference service.
    pub async fn keyed(gw: &Gateway, key: &str) -> Socket {
        opened(gw, "apiKey", key).await
    }

    /// A socket to `/api/ws` authenticated by its first frame with the
    /// access token `jwt` (without `Bearer `).
    pub async fn with_token(gw: &Gateway, jwt: &str) -> Socket {
        opened(gw, "token", jwt).await
    }

    async fn opened(gw: &Gateway, field: &str, value: &str) -> Socket {
        let port = gw.running.https.unwrap().port();
        let request = format!("wss://localhost:{port}/api/ws")
            .into_client_request()
            .unwrap();
        let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        let tls = super::common::tls_connector(&gw.ca_pem)
            .connect(name, tcp)
            .await
            .unwrap();
        let (mut socket, _) = tokio_tungstenite::client_async(request, tls).await.unwrap();
        let auth = serde_json::json!({"authCmd": {"cmdId": 0, field: value}}).to_string();
        socket.send(Message::text(auth)).await.unwrap();
        socket.send(Message::text("up")).await.unwrap();
        loop {
            match tokio::time::timeout(Duration::from_secs(10), socket.next()).await {
                Ok(Some(Ok(Message::Text(text)))) if text.contains("up") => return socket,
                Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => {}
                other => panic!("expected the echo, got {other:?}"),
            }
        }
    }

    /// The close frame's code and reason.
    pub async fn close_of(socket: &mut Socket, within: Duration) -> (u16, String) {
        let read = async {
            loop {
                match socket.next().await {
                    Some(Ok(Message::Close(Some(frame)))) => {
                        return (u16::from(frame.code), frame.reason.to_string());
                    }
                    Some(Ok(Message::Close(None))) => return (1005, String::new()),
                    Some(Ok(_)) => {}
                    other => panic!("expected a close frame, got {other:?}"),
                }
            }
        };
        tokio::time::timeout(within, read)
            .await
            .expect("a close frame in time")
    }
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_user_disabled_on_the_platform_is_refused_after_the_next_sync_and_their_socket_closes() {
    let platform = Platform::start().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let reference = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(keygate::dev::serve_reference_upstream_counted(
        listener,
        std::future::pending(),
        Default::default(),
    ));
    let gw = syncing(&platform, &reference, &reference, SYNC_INTERVAL).await;
    let token = bearer(&gw, "tenant@platform.test", PLATFORM_PASSWORD)
        .await
        .unwrap();
    let mut socket = socket::keyed(&gw, &platform.admin_key).await;
    let started = std::time::Instant::now();
    platform
        .execute(&format!(
            "UPDATE user_credentials SET enabled = false WHERE user_id = '{}'",
            platform.admin
        ))
        .await;
    let close = socket::close_of(&mut socket, SYNCED).await;
    println!(
        "disabled on the platform: socket closed {:?} later",
        started.elapsed()
    );
    assert_eq!(close, (1008, "User account is not active".into()));
    assert_eq!(current_user(&gw, &token).await.status(), 401);
    assert_eq!(
        current_user(&gw, &api_key_header(&platform.admin_key))
            .await
            .status(),
        401
    );
    assert_eq!(
        gw.login("tenant@platform.test", PLATFORM_PASSWORD)
            .await
            .status(),
        401
    );
    drop(gw);
    platform.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_fresh_platform_invitation_activates_before_the_next_sync() {
    let platform = Platform::start().await;
    let upstream = Upstream::start().await;
    // One round at start, the next in an hour: only the lookup can help.
    let gw = syncing(&platform, &upstream.url(), &upstream.url(), "1h").await;
    let invited = Uuid::new_v4();
    let token = format!("freshInvitation{}", Uuid::new_v4().simple());
    platform
        .execute(&format!(
            "INSERT INTO tb_user (id, created_time, authority, customer_id, email, tenant_id) \
             VALUES ('{invited}', 1700000000002, 'TENANT_ADMIN', '{NULL}', 'invited@platform.test', '{}'); \
             INSERT INTO user_credentials (id, created_time, enabled, activate_token, activate_token_exp_time, user_id) \
             VALUES ('{}', 1700000000002, false, '{token}', {}, '{invited}');",
            platform.tenant,
            Uuid::new_v4(),
            keygate::clock::now_ms() + 3_600_000
        ))
        .await;
    let activate = |token: String| {
        gw.client()
            .post(gw.https("/api/noauth/activate"))
            .json(&serde_json::json!({"activateToken": token, "password": NEW_PASSWORD}))
            .send()
    };
    let bogus = activate("notAnInvitationAnywhere".into()).await.unwrap();
    assert_eq!(bogus.status(), 400);
    let activated = activate(token.clone()).await.unwrap();
    assert_eq!(
        activated.status(),
        200,
        "{}",
        activated.text().await.unwrap()
    );
    assert!(
        bearer(&gw, "invited@platform.test", NEW_PASSWORD)
            .await
            .is_some()
    );
    // Used once.
    assert_eq!(activate(token).await.unwrap().status(), 400);
    drop(gw);
    platform.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_fresh_platform_invitation_link_redirects_before_the_next_sync_and_an_expired_one_goes_to_the_expired_page()
 {
    let platform = Platform::start().await;
    let upstream = Upstream::start().await;
    // One round at start, the next in an hour: only the lookup can help.
    let gw = syncing(&platform, &upstream.url(), &upstream.url(), "1h").await;
    let now = keygate::clock::now_ms();
    let fresh = format!("freshInvitation{}", Uuid::new_v4().simple());
    let late = format!("lateInvitation{}", Uuid::new_v4().simple());
    for (email, token, expires_at) in [
        ("fresh@platform.test", &fresh, now + 3_600_000),
        ("late@platform.test", &late, now - 1_000),
    ] {
        let invited = Uuid::new_v4();
        platform
            .execute(&format!(
                "INSERT INTO tb_user (id, created_time, authority, customer_id, email, tenant_id) \
                 VALUES ('{invited}', 1700000000002, 'TENANT_ADMIN', '{NULL}', '{email}', '{}'); \
                 INSERT INTO user_credentials (id, created_time, enabled, activate_token, activate_token_exp_time, user_id) \
                 VALUES ('{}', 1700000000002, false, '{token}', {expires_at}, '{invited}');",
                platform.tenant,
                Uuid::new_v4(),
            ))
            .await;
    }
    let base = format!("https://{}", gw.running.https.unwrap());
    for wire in common::WIRES {
        let builder = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&gw.ca_pem).unwrap())
            .redirect(reqwest::redirect::Policy::none());
        let client = match wire {
            common::Wire::Http1 => builder.http1_only(),
            common::Wire::Http2 => builder,
        }
        .build()
        .unwrap();
        for (token, expected) in [
            (
                &fresh,
                format!("{base}/login/createPassword?activateToken={fresh}"),
            ),
            (&late, format!("{base}/activationLinkExpired")),
        ] {
            let response = client
                .get(gw.https(&format!("/api/noauth/activate?activateToken={token}")))
                .send()
                .await
                .unwrap();
            assert_eq!(response.version(), wire.version());
            assert_eq!(response.status(), 303, "{wire:?} {token}");
            assert_eq!(response.headers()["location"].to_str().unwrap(), expected);
        }
    }
    // Followed, the fresh one still activates; the expired one does not.
    let activate = |token: String| {
        gw.client()
            .post(gw.https("/api/noauth/activate"))
            .json(&serde_json::json!({"activateToken": token, "password": NEW_PASSWORD}))
            .send()
    };
    assert_eq!(activate(late).await.unwrap().status(), 400);
    assert_eq!(activate(fresh).await.unwrap().status(), 200);
    assert!(upstream.requests().is_empty());
    drop(gw);
    platform.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn with_the_sync_on_user_endpoints_reach_the_platform_with_its_own_token() {
    let platform = Platform::start().await;
    let upstream = Upstream::start().await;
    let double = common::platform::PlatformDouble::start(MINTING_KEY).await;
    let gw = syncing(&platform, &upstream.url(), &double.url(), SYNC_INTERVAL).await;
    let token = bearer(&gw, "tenant@platform.test", PLATFORM_PASSWORD)
        .await
        .unwrap();
    let paths = [
        format!("/api/user/{}", platform.admin),
        "/api/users?pageSize=10&page=0".to_owned(),
        "/api/userInfos/all?pageSize=10&page=0".to_owned(),
        format!(
            "/api/customer/{}/users?pageSize=10&page=0",
            platform.customer
        ),
    ];
    for path in &paths {
        let response = gw
            .client()
            .get(gw.https(path))
            .header("X-Authorization", &token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
    }
    let seen = double.seen();
    assert_eq!(seen.len(), paths.len(), "{seen:?}");
    for (seen, path) in seen.iter().zip(&paths) {
        assert!(seen.uri.ends_with(path.as_str()), "{seen:?}");
        assert!(
            !seen.contains(token.trim_start_matches("Bearer ")),
            "the client's token stays with keygate"
        );
        let minted = seen
            .header("X-Authorization")
            .unwrap()
            .trim_start_matches("Bearer ");
        let user = double
            .authenticate(minted)
            .expect("a token the platform accepts");
        assert_eq!(user["id"], platform.admin.to_string(), "{user}");
    }
    // Credentials stay keygate's.
    assert_eq!(current_user(&gw, &token).await.status(), 200);
    assert_eq!(double.seen().len(), paths.len());
    assert!(upstream.requests().is_empty());
    drop(gw);
    platform.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn with_the_sync_on_a_read_only_key_never_reaches_the_platforms_activation_link() {
    let platform = Platform::start().await;
    let upstream = Upstream::start().await;
    let double = common::platform::PlatformDouble::start(MINTING_KEY).await;
    let gw = syncing(&platform, &upstream.url(), &double.url(), SYNC_INTERVAL).await;
    let created = gw
        .client()
        .post(gw.https("/api/apiKey"))
        .header("X-Authorization", api_key_header(&platform.admin_key))
        .json(&serde_json::json!({
            "userId": {"id": platform.admin, "entityType": "USER"},
            "description": "read-only",
            "scopes": [{"path": "/", "methods": ["GET", "POST"]}],
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 200);
    let created: serde_json::Value = created.json().await.unwrap();
    let scoped = api_key_header(created["value"].as_str().unwrap());
    let pending = platform.pending;
    for wire in common::WIRES {
        let client = gw.client_over(wire);
        for (method, path) in [
            ("GET", format!("/api/user/{pending}/activationLink")),
            ("GET", format!("/api/user/{pending}/activationLinkInfo")),
            ("GET", format!("/api/user/{pending}/token")),
            (
                "POST",
                format!("/api/user/{pending}/userCredentialsEnabled?userCredentialsEnabled=true"),
            ),
        ] {
            let response = client
                .request(method.parse().unwrap(), gw.https(&path))
                .header("X-Authorization", &scoped)
                .send()
                .await
                .unwrap();
            assert_eq!(response.version(), wire.version());
            let (status, body) = common::error_body(response).await;
            assert_eq!(
                (status, &body["errorCode"]),
                (403, &serde_json::json!(20)),
                "{wire:?} {method} {path}: {body}"
            );
        }
    }
    assert!(
        double.seen().is_empty(),
        "the platform route never saw a scoped key's request"
    );
    assert!(upstream.requests().is_empty());
    // The route is the platform's: an unscoped key's request reaches it.
    let response = gw
        .client()
        .get(gw.https(&format!("/api/user/{pending}/activationLink")))
        .header("X-Authorization", api_key_header(&platform.admin_key))
        .send()
        .await
        .unwrap();
    assert_ne!(response.status(), 403);
    assert_eq!(double.seen().len(), 1);
    drop(gw);
    platform.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn the_platform_database_down_keeps_keygate_ready_counts_and_logs_once() {
    let platform = Platform::start().await;
    let upstream = Upstream::start().await;
    // keygate reaches the platform's database through a relay the test cuts.
    let target: std::net::SocketAddr = "127.0.0.1:5432".parse().unwrap();
    assert!(
        platform.url.contains("@127.0.0.1:5432/"),
        "the relay stands in for 127.0.0.1:5432: {}",
        platform.url
    );
    let relay = common::Relay::start(target).await;
    let relayed = platform
        .url
        .replace("@127.0.0.1:5432/", &format!("@{}/", relay.addr));
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    common::certificate_into(dir.path(), &data);
    let config = dir.path().join("keygate.toml");
    common::write_config(
        &config,
        &data,
        &upstream.url(),
        &sync_config(&relayed, &upstream.url(), SYNC_INTERVAL),
    );
    let keygate = common::Process::spawn(&config, "info");
    let admin = |path: &str| format!("http://127.0.0.1:{}{path}", keygate.admin);
    let scrape = async || {
        reqwest::get(admin("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let errors = async || common::counter(&scrape().await, "keygate_platform_sync_errors_total");
    wait_until("the first sync", SYNCED, async || {
        !scrape()
            .await
            .contains("keygate_platform_sync_last_success_timestamp_seconds 0\n")
    })
    .await;
    let log = || std::fs::read_to_string(&keygate.log).unwrap();
    let failed = "sync with the platform's database failed";
    let recovered = "reachable again";

    relay.cut();
    wait_until("several failed rounds", SYNCED, async || {
        errors().await >= 5
    })
    .await;
    let ready = reqwest::get(admin("/readyz")).await.unwrap();
    assert_eq!(ready.status(), 200, "keygate serves from its own store");
    assert_eq!(log().matches(failed).count(), 1, "{}", log());
    assert_eq!(log().matches(recovered).count(), 0);

    relay.restore();
    wait_until("the recovery logged", SYNCED, async || {
        log().contains(recovered)
    })
    .await;
    let after = errors().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(errors().await, after, "no error once recovered");
    assert_eq!(log().matches(failed).count(), 1);
    assert_eq!(log().matches(recovered).count(), 1);
    keygate.signal("TERM");
    drop(keygate);
    platform.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn replicas_on_one_store_take_turns_at_the_sync_and_other_stores_do_not_wait() {
    let base = common::test_database_url();
    let (url, schema) = fresh_schema(&base).await;
    let (other_url, other_schema) = fresh_schema(&base).await;
    let replica_a = keygate::store::Store::connect(&url, 4).await.unwrap();
    let replica_b = keygate::store::Store::connect(&url, 4).await.unwrap();
    let elsewhere = keygate::store::Store::connect(&other_url, 4).await.unwrap();
    let held = replica_a
        .try_sync_lock()
        .await
        .unwrap()
        .expect("free at first");
    assert!(
        replica_b.try_sync_lock().await.unwrap().is_none(),
        "one at a time"
    );
    let other = elsewhere.try_sync_lock().await.unwrap();
    assert!(other.is_some(), "another store's sync is its own");
    held.release().await;
    let next = replica_b.try_sync_lock().await.unwrap();
    assert!(next.is_some(), "free again once released");
    // A replica that stops midway gives the lock up with its connection.
    drop(next);
    wait_until(
        "the lock freed by a dropped holder",
        Duration::from_secs(10),
        async || match replica_a.try_sync_lock().await.unwrap() {
            Some(lock) => {
                lock.release().await;
                true
            }
            None => false,
        },
    )
    .await;
    if let Some(other) = other {
        other.release().await;
    }
    drop_schema(&base, &schema).await;
    drop_schema(&base, &other_schema).await;
}

/// A second `tokenSigningKey`, as the platform's key rotation writes one.
const ROTATED_KEY: &str = "cm90YXRlZC1zaWduaW5nLWtleS1vZi10aGUtcGxhdGZvcm0tYWZ0ZXItaXRzLW93bi1rZXktcm90YXRpb24tMDEyMzQ1Njc4OQ==";

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_signing_key_rotated_on_the_platform_signs_platform_tokens_from_the_next_round() {
    let platform = Platform::start().await;
    let double = PlatformDouble::start(SIGNING_KEY).await;
    let upstream = Upstream::start().await;
    let base = common::test_database_url();
    let (store_url, store_schema) = fresh_schema(&base).await;
    // The import brings the platform's key into the store; a replica that
    // starts on that store with no configured key signs with it, and
    // follows it when the platform rotates it.
    let importer = Gateway::start_on(&upstream.url(), "", Some(&store_url)).await;
    import_json(&importer, &platform, &[]).await;
    let config = format!(
        "[platform]\ndatabase_url = \"{}\"\nsync_interval = \"{SYNC_INTERVAL}\"\nupstream = \"platform\"\n\
         [[route]]\nname = \"platform\"\nprefix = \"/api/tb/\"\nupstreams = [\"{}\"]\nidentity = \"platform\"\n",
        platform.url,
        double.url()
    );
    let gw = Gateway::start_on(&upstream.url(), &config, Some(&store_url)).await;
    let key = api_key_header(&platform.admin_key);
    let through = async |gw: &Gateway| {
        gw.client()
            .get(gw.https("/api/tb/devices"))
            .header("X-Authorization", &key)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(through(&gw).await, 200, "the imported key signs at first");

    platform
        .execute(&format!(
            "UPDATE admin_settings SET json_value = '{{\"tokenIssuer\":\"platform.test\",\
             \"tokenSigningKey\":\"{ROTATED_KEY}\"}}' WHERE key = 'jwt'"
        ))
        .await;
    double.rotate_key(ROTATED_KEY);
    // The token kept for reuse was signed with the old key.
    let took = wait_until(
        "platform tokens signed with the rotated key",
        SYNCED,
        async || through(&gw).await == 200,
    )
    .await;
    eprintln!(
        "a rotated platform signing key was followed after {} ms (sync_interval {SYNC_INTERVAL})",
        took.as_millis()
    );
    let last = double
        .seen()
        .last()
        .cloned()
        .expect("the double was reached");
    let token = last
        .header("x-authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .expect("a platform token")
        .to_owned();
    assert!(
        double.authenticate(&token).is_ok(),
        "the token that reached the platform is signed with the rotated key"
    );
    drop(gw);
    drop(importer);
    drop_schema(&base, &store_schema).await;
    platform.drop().await;
}

#[tokio::test]
async fn a_sync_without_a_route_for_the_user_endpoints_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().display();
    let text = format!(
        "[server]\ndata_dir = \"{data}\"\n[listen]\nhttps = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
         [store]\nurl = \"sqlite://{data}/k.db\"\n\
         [platform]\ndatabase_url = \"postgres://reader@127.0.0.1:1/thingsboard\"\n\
         [[route]]\nname = \"api\"\nprefix = \"/api/\"\nupstreams = [\"http://127.0.0.1:9\"]\n"
    );
    let path = dir.path().join("keygate.toml");
    std::fs::write(&path, text).unwrap();
    let settings = keygate::config::load(&keygate::config::Source {
        file: Some(&path),
        env: vec![],
    })
    .unwrap();
    let refused = keygate::server::start(settings, keygate::server::StartOptions::default()).await;
    let error = refused.err().expect("refused").to_string();
    assert!(error.contains("set platform.upstream"), "{error}");
}

#[tokio::test]
async fn the_import_reads_the_syncs_database_url_from_the_config_and_says_when_there_is_none() {
    let (_upstream, gw) = gateway("").await;
    let config = gw.dir.path().join("keygate.toml");
    let args = ["import".to_owned(), "platform".to_owned()];
    let out = tokio::task::spawn_blocking({
        let (config, args) = (config.clone(), args.clone());
        move || keygate(&config, &args)
    })
    .await
    .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no platform database"), "{stderr}");
    // A port nothing listens on, named in the config: the import goes there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!("{text}\n[platform]\ndatabase_url = \"postgres://reader@127.0.0.1:{port}/tb\"\n"),
    )
    .unwrap();
    let out = tokio::task::spawn_blocking(move || keygate(&config, &args))
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("127.0.0.1:{port}")), "{stderr}");
}

// --- reset links and EMAIL second factors ------------------------------------------------

const PLATFORM_RESET: &str = "platformResetToken0123456789abcdef";

impl Platform {
    /// A pending password reset on the platform, as its `resetPasswordByEmail`
    /// leaves it in `user_credentials`.
    async fn set_reset_token(&self, user: Uuid, token: &str, expires_at: i64) {
        self.execute(&format!(
            "UPDATE user_credentials SET reset_token = '{token}', reset_token_exp_time = {expires_at} \
             WHERE user_id = '{user}'"
        ))
        .await;
    }
}

/// The reset link's check, without following its redirect: the status and
/// the `Location`'s path and query, on the listener (no public base URL).
async fn follow_reset_link(gw: &Gateway, token: &str) -> (u16, String) {
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&gw.ca_pem).unwrap())
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let response = client
        .get(gw.https(&format!("/api/noauth/resetPassword?resetToken={token}")))
        .send()
        .await
        .unwrap();
    let location = response
        .headers()
        .get("location")
        .map(|l| l.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let base = format!("https://{}", gw.running.https.unwrap());
    let location = match location.strip_prefix(&base) {
        Some(path) => path.to_owned(),
        None => {
            assert_eq!(location, "", "a Location on the listener");
            location
        }
    };
    (response.status().as_u16(), location)
}

async fn reset_password(gw: &Gateway, token: &str, password: &str) -> reqwest::Response {
    gw.client()
        .post(gw.https("/api/noauth/resetPassword"))
        .json(&serde_json::json!({"resetToken": token, "password": password}))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_platform_reset_link_in_the_mailbox_resets_the_password_after_the_import_once() {
    let platform = Platform::start().await;
    let (_upstream, gw) = gateway("").await;
    let now = keygate::clock::now_ms();
    platform
        .set_reset_token(platform.admin, PLATFORM_RESET, now + 3_600_000)
        .await;
    let expired = "platformExpiredResetToken0123456789";
    platform
        .set_reset_token(platform.customer_user, expired, now - 1_000)
        .await;
    import_json(&gw, &platform, &[]).await;

    // Stored as keygate stores its own: the digest, with the platform's expiry.
    let url = format!("sqlite://{}/keygate.db", gw.dir.path().display());
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&url).await.unwrap();
    let rows: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT digest, user_id, expires_at FROM reset_tokens")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), 1, "the expired link is not imported: {rows:?}");
    assert_eq!(rows[0].1, platform.admin.to_string());
    assert_eq!(rows[0].2, now + 3_600_000);
    assert!(!rows[0].0.contains(PLATFORM_RESET));

    assert_eq!(
        follow_reset_link(&gw, PLATFORM_RESET).await,
        (
            303,
            format!("/login/resetPassword?resetToken={PLATFORM_RESET}")
        )
    );
    assert_eq!(follow_reset_link(&gw, expired).await.0, 409);
    assert_eq!(
        reset_password(&gw, expired, NEW_PASSWORD).await.status(),
        400
    );
    let response = reset_password(&gw, PLATFORM_RESET, NEW_PASSWORD).await;
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    assert!(
        bearer(&gw, "tenant@platform.test", NEW_PASSWORD)
            .await
            .is_some()
    );
    assert!(
        bearer(&gw, "tenant@platform.test", PLATFORM_PASSWORD)
            .await
            .is_none()
    );

    // A re-import does not bring the used link back, nor the old password.
    let report = import_json(&gw, &platform, &[]).await;
    assert_eq!(report["users"]["updated"], 0, "{report}");
    assert_eq!(
        reset_password(&gw, PLATFORM_RESET, "another-Passw0rd!3")
            .await
            .status(),
        400
    );
    assert!(
        bearer(&gw, "tenant@platform.test", NEW_PASSWORD)
            .await
            .is_some()
    );
    drop(gw);
    pool.close().await;
    platform.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_fresh_platform_reset_link_works_before_the_next_sync() {
    let platform = Platform::start().await;
    let upstream = Upstream::start().await;
    // One round at start, the next in an hour: only the lookup can help.
    let gw = syncing(&platform, &upstream.url(), &upstream.url(), "1h").await;
    let token = format!("freshReset{}", Uuid::new_v4().simple());
    platform
        .set_reset_token(platform.admin, &token, keygate::clock::now_ms() + 3_600_000)
        .await;
    assert_eq!(
        follow_reset_link(&gw, "notAResetTokenAnywhere").await.0,
        409
    );
    assert_eq!(
        follow_reset_link(&gw, &token).await,
        (303, format!("/login/resetPassword?resetToken={token}"))
    );
    // The POST alone finds it too: a second fresh link, never checked.
    let second = format!("freshReset{}", Uuid::new_v4().simple());
    platform
        .set_reset_token(
            platform.admin,
            &second,
            keygate::clock::now_ms() + 3_600_000,
        )
        .await;
    let response = reset_password(&gw, &second, NEW_PASSWORD).await;
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    assert!(
        bearer(&gw, "tenant@platform.test", NEW_PASSWORD)
            .await
            .is_some()
    );
    // Only the newest link works, and each once.
    assert_eq!(
        reset_password(&gw, &token, PLATFORM_PASSWORD)
            .await
            .status(),
        400
    );
    assert_eq!(
        reset_password(&gw, &second, PLATFORM_PASSWORD)
            .await
            .status(),
        400
    );
    drop(gw);
    platform.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_platform_email_second_factor_logs_in_with_the_mailed_code_and_never_mails_another_address()
 {
    let platform = Platform::start().await;
    let sink = common::smtp::SmtpSink::start().await;
    let (_upstream, gw) = gateway(&sink.config()).await;
    let email_config = |email: &str| {
        serde_json::json!({"configs": {"EMAIL":
            {"providerType": "EMAIL", "useByDefault": true, "email": email}}})
        .to_string()
    };
    platform
        .set_two_fa(
            platform.customer_user,
            &email_config("Customer@Platform.test"),
        )
        .await;
    platform
        .set_two_fa(platform.admin, &email_config("attacker@elsewhere.test"))
        .await;
    let report = import_json(&gw, &platform, &[]).await;
    assert_eq!(report["twoFactors"]["added"], 1, "{report}");
    let skipped = report["skipped"].as_array().unwrap();
    assert!(
        skipped.iter().any(|s| s["kind"] == "second factor"
            && s["id"] == platform.admin.to_string()
            && s["reason"]
                .as_str()
                .unwrap()
                .contains("another address than the account's")),
        "{report}"
    );

    // The admin's config named another address: no second factor, no mail.
    assert!(
        bearer(&gw, "tenant@platform.test", PLATFORM_PASSWORD)
            .await
            .is_some()
    );

    let pre = pre_token(&gw, "customer@platform.test").await;
    let sent = gw
        .client()
        .post(gw.https("/api/auth/2fa/verification/send?providerType=EMAIL"))
        .header("X-Authorization", format!("Bearer {pre}"))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 200, "{}", sent.text().await.unwrap());
    let code = sink.wait_for("customer@platform.test", 0).await.code();
    assert_eq!(check(&gw, &pre, "EMAIL", "000000").await.status(), 400);
    let response = check(&gw, &pre, "EMAIL", &code).await;
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    let body: serde_json::Value = response.json().await.unwrap();
    assert!(body["refreshToken"].is_string(), "{body}");
    assert_eq!(sink.count_to("attacker@elsewhere.test"), 0);

    // A re-import changes nothing.
    let report = import_json(&gw, &platform, &[]).await;
    assert_eq!(report["twoFactors"]["added"], 0, "{report}");
    assert_eq!(report["twoFactors"]["unchanged"], 1, "{report}");
    drop(gw);
    platform.drop().await;
}

// --- rows the platform could not have written -------------------------------------

/// The report's skipped rows of users, by id: (code, reason).
fn skipped_users(
    report: &serde_json::Value,
) -> std::collections::HashMap<String, (String, String)> {
    report["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["kind"] == "user")
        .map(|s| {
            (
                s["id"].as_str().unwrap().to_owned(),
                (
                    s["code"].as_str().unwrap().to_owned(),
                    s["reason"].as_str().unwrap().to_owned(),
                ),
            )
        })
        .collect()
}

/// Logs in over `wire`: the status.
async fn login_over(gw: &Gateway, wire: common::Wire, email: &str, password: &str) -> u16 {
    gw.client_over(wire)
        .post(gw.https("/api/auth/login"))
        .json(&serde_json::json!({ "username": email, "password": password }))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn an_imported_row_never_takes_another_users_login_name() {
    let platform = Platform::start().await;
    let (_upstream, gw) = gateway("").await;
    // A user keygate holds already, created in keygate.
    let policy = gw.running.app.settings().password_policy;
    let owner = keygate::accounts::create_user(
        &gw.running.store,
        keygate::accounts::NewUser {
            email: "owner@ex.test".into(),
            authority: keygate::identity::Authority::TenantAdmin,
            tenant_id: Some(platform.tenant),
            customer_id: None,
            first_name: String::new(),
            last_name: String::new(),
        },
        NEW_PASSWORD.into(),
        &policy,
    )
    .await
    .unwrap();
    let hash = bcrypt_2a(PLATFORM_PASSWORD);
    let null = Uuid::parse_str(NULL).unwrap();
    let t = platform.tenant;
    let boss_upper = platform
        .add_user("Boss@Ex.test", "TENANT_ADMIN", t, null, &hash)
        .await;
    let boss_lower = platform
        .add_user("boss@ex.test", "TENANT_ADMIN", t, null, &hash)
        .await;
    let kelvin = platform
        .add_user("kelvin@ex.test", "TENANT_ADMIN", t, null, &hash)
        .await;
    let kelvin_sign = platform
        .add_user("\u{212A}elvin@Ex.test", "TENANT_ADMIN", t, null, &hash)
        .await;
    let claimant = platform
        .add_user("OWNER@ex.test", "TENANT_ADMIN", t, null, &hash)
        .await;

    let out = import(&gw, &platform.url, &["--json"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let skipped = skipped_users(&report);
    for (id, other) in [(boss_upper, boss_lower), (boss_lower, boss_upper)] {
        let (code, reason) = &skipped[&id.to_string()];
        assert_eq!(code, "email_collision", "{report}");
        assert!(
            reason.contains("boss@ex.test") && reason.contains(&other.to_string()),
            "{reason}"
        );
    }
    assert_eq!(
        skipped[&kelvin_sign.to_string()].0,
        "invalid_email",
        "{report}"
    );
    assert_eq!(skipped[&claimant.to_string()].0, "email_taken", "{report}");
    assert!(!skipped.contains_key(&kelvin.to_string()), "{report}");
    // A warning and an audit event name each row held back.
    let stderr = String::from_utf8_lossy(&out.stderr);
    for id in [boss_upper, boss_lower, kelvin_sign, claimant] {
        assert!(
            stderr
                .lines()
                .any(|l| l.contains("not imported") && l.contains(&id.to_string())),
            "{stderr}"
        );
    }
    let events = gw.running.store.audit_events(200).await.unwrap();
    for id in [boss_upper, boss_lower, claimant] {
        assert!(
            events
                .iter()
                .any(|e| e.action == "user.import_skipped" && e.target_id == id),
            "{events:?}"
        );
    }

    for wire in common::WIRES {
        // Neither claimant of boss@ex.test logs in under any spelling.
        for typed in ["boss@ex.test", "Boss@Ex.test"] {
            assert_eq!(
                login_over(&gw, wire, typed, PLATFORM_PASSWORD).await,
                401,
                "{wire:?}"
            );
        }
        // The KELVIN SIGN is not a K: the row is not kelvin's.
        assert_eq!(
            login_over(&gw, wire, "kelvin@ex.test", PLATFORM_PASSWORD).await,
            200
        );
        assert_eq!(
            login_over(&gw, wire, "\u{212A}elvin@ex.test", PLATFORM_PASSWORD).await,
            401,
            "{wire:?}"
        );
        // The user keygate held keeps the name and their own password.
        assert_eq!(
            login_over(&gw, wire, "Owner@Ex.test", NEW_PASSWORD).await,
            200
        );
        assert_eq!(
            login_over(&gw, wire, "owner@ex.test", PLATFORM_PASSWORD).await,
            401
        );
    }
    let held = gw
        .running
        .store
        .user_by_email("owner@ex.test")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(held.id, owner.id);

    // Once the platform's rows name one user per address, the one left in
    // is imported.
    platform
        .execute(&format!("DELETE FROM user_credentials WHERE user_id = '{boss_upper}'; DELETE FROM tb_user WHERE id = '{boss_upper}'"))
        .await;
    let report = import_json(&gw, &platform, &[]).await;
    assert!(
        !skipped_users(&report).contains_key(&boss_lower.to_string()),
        "{report}"
    );
    assert_eq!(
        login_over(&gw, common::Wire::Http1, "Boss@Ex.test", PLATFORM_PASSWORD).await,
        200
    );
    // A later claimant of that address is held back; the user keygate
    // holds keeps it, and the platform's changes to them still apply.
    let late = platform
        .add_user("BOSS@ex.test", "TENANT_ADMIN", t, null, &hash)
        .await;
    platform
        .execute(&format!(
            "UPDATE tb_user SET last_name = 'Renamed' WHERE id = '{boss_lower}'"
        ))
        .await;
    let report = import_json(&gw, &platform, &[]).await;
    let skipped = skipped_users(&report);
    assert_eq!(skipped[&late.to_string()].0, "email_collision", "{report}");
    assert!(
        skipped[&late.to_string()]
            .1
            .contains(&format!("keygate holds it for user {boss_lower}")),
        "{report}"
    );
    assert!(!skipped.contains_key(&boss_lower.to_string()), "{report}");
    assert_eq!(report["users"]["updated"], 1, "{report}");
    for wire in common::WIRES {
        assert_eq!(
            login_over(&gw, wire, "boss@ex.test", PLATFORM_PASSWORD).await,
            200
        );
    }
    let kept = gw
        .running
        .store
        .user_by_email("BOSS@ex.test")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((kept.id, kept.last_name.as_str()), (boss_lower, "Renamed"));
    platform.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn the_sync_holds_back_colliding_rows_and_a_keygate_users_name_and_tells_once() {
    let platform = Platform::start().await;
    let upstream = Upstream::start().await;
    let gw = syncing(&platform, &upstream.url(), &upstream.url(), SYNC_INTERVAL).await;
    let policy = gw.running.app.settings().password_policy;
    keygate::accounts::create_user(
        &gw.running.store,
        keygate::accounts::NewUser {
            email: "owner@ex.test".into(),
            authority: keygate::identity::Authority::TenantAdmin,
            tenant_id: Some(platform.tenant),
            customer_id: None,
            first_name: String::new(),
            last_name: String::new(),
        },
        NEW_PASSWORD.into(),
        &policy,
    )
    .await
    .unwrap();
    let hash = bcrypt_2a(PLATFORM_PASSWORD);
    let null = Uuid::parse_str(NULL).unwrap();
    let t = platform.tenant;
    // The two claimants of one address appear on the platform at once: no
    // round sees one without the other.
    platform
        .add_users(&[
            ("Boss@Ex.test", "TENANT_ADMIN", t, null, &hash),
            ("boss@ex.test", "TENANT_ADMIN", t, null, &hash),
            ("OWNER@ex.test", "TENANT_ADMIN", t, null, &hash),
        ])
        .await;
    let skipped = async |reason: &str| {
        common::counter(
            &gw.metrics().await,
            &format!("keygate_platform_sync_skipped_total{{reason=\"{reason}\"}}"),
        )
    };
    wait_until("the rows held back", SYNCED, async || {
        skipped("email_collision").await == 2 && skipped("email_taken").await == 1
    })
    .await;
    for wire in common::WIRES {
        assert_eq!(
            login_over(&gw, wire, "boss@ex.test", PLATFORM_PASSWORD).await,
            401
        );
        assert_eq!(
            login_over(&gw, wire, "owner@ex.test", NEW_PASSWORD).await,
            200
        );
        assert_eq!(
            login_over(&gw, wire, "owner@ex.test", PLATFORM_PASSWORD).await,
            401
        );
    }
    // More rounds: the rows still held back are counted and audited once.
    platform
        .add_user("later@ex.test", "TENANT_ADMIN", t, null, &hash)
        .await;
    wait_until("a later round", SYNCED, async || {
        bearer(&gw, "later@ex.test", PLATFORM_PASSWORD)
            .await
            .is_some()
    })
    .await;
    assert_eq!(skipped("email_collision").await, 2);
    assert_eq!(skipped("email_taken").await, 1);
    let events = gw.running.store.audit_events(500).await.unwrap();
    let held = events
        .iter()
        .filter(|e| e.action == "user.import_skipped")
        .count();
    assert_eq!(held, 3, "{events:?}");
    platform.drop().await;
}

/// A bcrypt hash in the platform's format: cost `cost`, never to be run.
fn bcrypt_of_cost(cost: u32) -> String {
    format!("$2a${cost:02}$N9qo8uLOickgx2ZMRZoMyeIjZAgcfl7p92ldGxad68LJZdL17lhWy")
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn imported_rows_the_platform_could_not_have_written_are_skipped_with_the_reason() {
    let platform = Platform::start().await;
    let (_upstream, gw) = gateway("").await;
    let hash = bcrypt_2a(PLATFORM_PASSWORD);
    let null = Uuid::parse_str(NULL).unwrap();
    let t = platform.tenant;
    let megabyte = "x".repeat(1 << 20);
    let crlf = platform
        .add_user(
            "evil@ex.test\r\nBcc: all@ex.test",
            "TENANT_ADMIN",
            t,
            null,
            &hash,
        )
        .await;
    let space = platform
        .add_user("a b@ex.test", "TENANT_ADMIN", t, null, &hash)
        .await;
    let words = platform
        .add_user("not an email", "TENANT_ADMIN", t, null, &hash)
        .await;
    let long = platform
        .add_user("long@ex.test", "TENANT_ADMIN", t, null, &hash)
        .await;
    platform
        .execute(&format!(
            "ALTER TABLE tb_user ALTER COLUMN first_name TYPE varchar; \
             UPDATE tb_user SET first_name = '{megabyte}' WHERE id = '{long}'"
        ))
        .await;
    let cost13 = platform
        .add_user(
            "cost13@ex.test",
            "TENANT_ADMIN",
            t,
            null,
            &bcrypt_of_cost(13),
        )
        .await;
    let cost31 = platform
        .add_user(
            "cost31@ex.test",
            "TENANT_ADMIN",
            t,
            null,
            &bcrypt_of_cost(31),
        )
        .await;
    // A SYS_ADMIN row holding a tenant and a customer.
    let admin = platform
        .add_user("root@ex.test", "SYS_ADMIN", t, platform.customer, &hash)
        .await;
    // A customer user of tenant t whose customer is another tenant's.
    let other_tenant = Uuid::new_v4();
    let foreign = Uuid::new_v4();
    platform
        .execute(&format!(
            "INSERT INTO customer (id, created_time, tenant_id, title, is_public) \
             VALUES ('{foreign}', 1, '{other_tenant}', 'Other', FALSE)"
        ))
        .await;
    let intruder = platform
        .add_user("intruder@ex.test", "CUSTOMER_USER", t, foreign, &hash)
        .await;
    let unknown = platform
        .add_user(
            "nocustomer@ex.test",
            "CUSTOMER_USER",
            t,
            Uuid::new_v4(),
            &hash,
        )
        .await;

    let report = import_json(&gw, &platform, &[]).await;
    let skipped = skipped_users(&report);
    for (id, code, words) in [
        (crlf, "invalid_email", "Invalid email address"),
        (space, "invalid_email", "Invalid email address"),
        (words, "invalid_email", "Invalid email address"),
        (long, "too_long", "first_name is 1048576 characters"),
        (
            cost13,
            "bcrypt_cost",
            "cost 13, above login.max_bcrypt_cost 12",
        ),
        (cost31, "bcrypt_cost", "cost 31"),
        (
            intruder,
            "foreign_customer",
            &format!("belongs to tenant {other_tenant}"),
        ),
        (
            unknown,
            "foreign_customer",
            "not in the platform's customer table",
        ),
    ] {
        let (got, reason) = skipped
            .get(&id.to_string())
            .unwrap_or_else(|| panic!("{id} not skipped: {report}"));
        assert_eq!(got, code, "{reason}");
        assert!(reason.contains(words), "{reason}");
    }
    let human = import(&gw, &platform.url, &["--dry-run"]).await;
    let summary = String::from_utf8_lossy(&human.stdout);
    assert!(
        summary.contains(&format!("skipped user {cost31}")),
        "{summary}"
    );
    assert!(
        !summary.contains(&megabyte[..1000]),
        "the report never echoes the field"
    );
    // The SYS_ADMIN is in, with no tenant and no customer.
    let root = gw
        .running
        .store
        .user_by_email("root@ex.test")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(root.id, admin);
    assert_eq!((root.tenant_id, root.customer_id), (null, null));
    for wire in common::WIRES {
        for refused in [
            "evil@ex.test",
            "a b@ex.test",
            "not an email",
            "cost31@ex.test",
            "intruder@ex.test",
        ] {
            assert_eq!(
                login_over(&gw, wire, refused, PLATFORM_PASSWORD).await,
                401,
                "{refused}"
            );
        }
    }
    // A user imported before whose row now breaks a rule is held back, but
    // the platform disabling them still applies.
    assert_eq!(
        login_over(
            &gw,
            common::Wire::Http2,
            "tenant@platform.test",
            PLATFORM_PASSWORD
        )
        .await,
        200
    );
    platform
        .execute(&format!(
            "UPDATE tb_user SET first_name = '{megabyte}' WHERE id = '{admin}'; \
             UPDATE user_credentials SET enabled = FALSE WHERE user_id = '{admin}'",
            admin = platform.admin
        ))
        .await;
    let report = import_json(&gw, &platform, &[]).await;
    assert_eq!(
        skipped_users(&report)[&platform.admin.to_string()].0,
        "too_long",
        "{report}"
    );
    for wire in common::WIRES {
        assert_eq!(
            login_over(&gw, wire, "tenant@platform.test", PLATFORM_PASSWORD).await,
            401,
            "{wire:?}: disabled on the platform"
        );
    }
    // Fixed and enabled on the platform again: it follows.
    platform
        .execute(&format!(
            "UPDATE tb_user SET first_name = 'First' WHERE id = '{admin}'; \
             UPDATE user_credentials SET enabled = TRUE WHERE user_id = '{admin}'",
            admin = platform.admin
        ))
        .await;
    import_json(&gw, &platform, &[]).await;
    assert_eq!(
        login_over(
            &gw,
            common::Wire::Http1,
            "tenant@platform.test",
            PLATFORM_PASSWORD
        )
        .await,
        200
    );
    platform.drop().await;
}

/// Everything logged in this test process, as text (installed once).
fn captured_log() -> std::sync::Arc<std::sync::Mutex<Vec<u8>>> {
    static LOG: std::sync::OnceLock<std::sync::Arc<std::sync::Mutex<Vec<u8>>>> =
        std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        #[derive(Clone)]
        struct Writer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Writer {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let writer = Writer(buffer.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
        buffer
    })
    .clone()
}

/// Runs the import with `login.max_bcrypt_cost` = `cap` (the gateway's own
/// config otherwise): how a hash above the serving cap gets into the store.
async fn import_with_cap(gw: &Gateway, platform: &Platform, cap: u32) {
    let config = gw.dir.path().join("import.toml");
    let text = std::fs::read_to_string(gw.dir.path().join("keygate.toml")).unwrap();
    std::fs::write(
        &config,
        format!("{text}\n[login]\nmax_bcrypt_cost = {cap}\n"),
    )
    .unwrap();
    let args: Vec<String> = ["import", "platform", "--database-url", &platform.url]
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
    let out = tokio::task::spawn_blocking(move || keygate(&config, &args))
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_stored_bcrypt_hash_above_the_cap_is_refused_at_login_without_hashing() {
    let log = captured_log();
    let platform = Platform::start().await;
    let (_upstream, gw) = gateway("").await;
    let null = Uuid::parse_str(NULL).unwrap();
    let days = platform
        .add_user(
            "days@ex.test",
            "TENANT_ADMIN",
            platform.tenant,
            null,
            &bcrypt_of_cost(31),
        )
        .await;
    import_with_cap(&gw, &platform, 31).await;
    let stored = gw
        .running
        .store
        .user_by_email("days@ex.test")
        .await
        .unwrap()
        .unwrap();
    assert!(stored.password_hash.starts_with("$2a$31$"));
    let hashes = async || {
        common::counter(
            &gw.metrics().await,
            "keygate_password_hashes_total{purpose=\"login\"}",
        )
    };
    let before = hashes().await;
    for wire in common::WIRES {
        assert_eq!(
            login_over(&gw, wire, "days@ex.test", PLATFORM_PASSWORD).await,
            401
        );
    }
    assert_eq!(hashes().await, before, "no hashing slot was taken");
    // Another user logs in as ever, and that is hashed.
    assert_eq!(
        login_over(
            &gw,
            common::Wire::Http2,
            "tenant@platform.test",
            PLATFORM_PASSWORD
        )
        .await,
        200
    );
    assert_eq!(hashes().await, before + 1);
    let text = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
    let refused = text
        .lines()
        .filter(|l| l.contains("above login.max_bcrypt_cost") && l.contains(&days.to_string()))
        .count();
    assert_eq!(refused, 2, "one line per refused check:\n{text}");
    platform.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn concurrent_wrong_logins_to_one_account_take_one_hashing_slot_while_another_user_logs_in() {
    let platform = Platform::start().await;
    // One hashing slot for logins; waits and per-account limits wide enough
    // that only the hashing decides.
    let (_upstream, gw) = gateway(
        "[login]\nmax_concurrent_hashes = 1\nhash_wait = \"120s\"\n\
         account_address_max_failures = 1000\naccount_max_failures = 1000\naddress_max_failures = 1000\n",
    )
    .await;
    let null = Uuid::parse_str(NULL).unwrap();
    // Cost 12: the highest the import takes, each check several times the
    // platform's cost 10.
    let slow = bcrypt::hash_with_result(PLATFORM_PASSWORD, 12)
        .unwrap()
        .format_for_version(bcrypt::Version::TwoA);
    platform
        .add_user(
            "victim@ex.test",
            "TENANT_ADMIN",
            platform.tenant,
            null,
            &slow,
        )
        .await;
    import_json(&gw, &platform, &[]).await;
    let hashes = async || {
        common::counter(
            &gw.metrics().await,
            "keygate_password_hashes_total{purpose=\"login\"}",
        )
    };
    const WRONG: usize = 6;
    for wire in common::WIRES {
        let start = hashes().await;
        let mut wrong = Vec::new();
        for _ in 0..WRONG {
            let client = gw.client_over(wire);
            let url = gw.https("/api/auth/login");
            wrong.push(tokio::spawn(async move {
                client
                    .post(url)
                    .json(&serde_json::json!({ "username": "victim@ex.test", "password": "wrong-guess" }))
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            }));
        }
        wait_until("the first wrong check hashing", SYNCED, async || {
            hashes().await > start
        })
        .await;
        let before = hashes().await;
        assert_eq!(
            login_over(&gw, wire, "tenant@platform.test", PLATFORM_PASSWORD).await,
            200
        );
        // The other login took the slot after at most the victim's check
        // running when it came and the one next in the account's turn;
        // without one turn per account it would wait behind every queued
        // wrong guess.
        let after = hashes().await;
        assert!(
            after - before <= 3,
            "{wire:?}: {} checks took the slot between (at most 3 allowed; {} wrong guesses were queued)",
            after - before,
            WRONG - 1
        );
        for status in wrong {
            assert_eq!(status.await.unwrap(), 401, "{wire:?}");
        }
        assert_eq!(
            hashes().await,
            start + WRONG as u64 + 1,
            "each check hashed once"
        );
    }
    platform.drop().await;
}

// While the sync is on, the platform owns passwords: a password it changes
// replaces keygate's, the re-hash made at a login through keygate included,
// and ends the user's sessions, tokens and sockets in the round that sees it.

const RESET_ON_PLATFORM: &str = "platform-Reset-Passw0rd!3";

/// A refresh over `wire` with `refresh_token`: the status.
async fn refresh_over(gw: &Gateway, wire: common::Wire, refresh_token: &str) -> u16 {
    gw.client_over(wire)
        .post(gw.https("/api/auth/token"))
        .json(&serde_json::json!({ "refreshToken": refresh_token }))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// `GET /api/auth/user` over `wire` with `authorization`: the status.
async fn current_user_over(gw: &Gateway, wire: common::Wire, authorization: &str) -> u16 {
    gw.client_over(wire)
        .get(gw.https("/api/auth/user"))
        .header("X-Authorization", authorization)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// A login of `email`: its access token (as `Bearer ...`) and refresh token.
async fn token_pair(gw: &Gateway, email: &str, password: &str) -> (String, String) {
    let response = gw.login(email, password).await;
    assert_eq!(response.status(), 200);
    let body: serde_json::Value = response.json().await.unwrap();
    (
        format!("Bearer {}", body["token"].as_str().unwrap()),
        body["refreshToken"].as_str().unwrap().to_owned(),
    )
}

/// The password hash keygate holds for `email`.
async fn stored_hash(gw: &Gateway, email: &str) -> String {
    let users = gw.running.store.list_users().await.unwrap();
    let user = users.iter().find(|u| u.email == email).unwrap();
    user.password_hash.clone()
}

/// Sets the platform's password of `user`, as its UI's reset does.
async fn set_platform_password(platform: &Platform, user: Uuid, password: &str) {
    platform
        .execute(&format!(
            "UPDATE user_credentials SET password = '{}' WHERE user_id = '{user}'",
            bcrypt_2a(password)
        ))
        .await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_password_changed_on_the_platform_replaces_a_rehashed_one_and_ends_sessions_within_a_round()
 {
    let platform = Platform::start().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let reference = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(keygate::dev::serve_reference_upstream_counted(
        listener,
        std::future::pending(),
        Default::default(),
    ));
    let gw = syncing(&platform, &reference, &reference, SYNC_INTERVAL).await;
    let email = "tenant@platform.test";
    // The first login through keygate re-hashes the platform's bcrypt hash.
    let (token, refresh) = token_pair(&gw, email, PLATFORM_PASSWORD).await;
    assert!(stored_hash(&gw, email).await.starts_with("$argon2id$"));
    for wire in common::WIRES {
        assert_eq!(current_user_over(&gw, wire, &token).await, 200);
    }
    let jwt = token.trim_start_matches("Bearer ").to_owned();
    let mut socket = socket::with_token(&gw, &jwt).await;

    // An operator resets the account in the platform's UI.
    set_platform_password(&platform, platform.admin, RESET_ON_PLATFORM).await;
    // The round that writes the new hash revokes in the same transaction:
    // once the old token is refused, the new password is in place.
    let took = wait_until("the old token refused", SYNCED, async || {
        current_user(&gw, &token).await.status() == 401
    })
    .await;
    println!(
        "a password changed on the platform: the old token refused {} ms later (sync_interval {SYNC_INTERVAL})",
        took.as_millis()
    );
    let (code, _) = socket::close_of(&mut socket, SYNCED).await;
    assert_eq!(code, 1008, "the socket of the old token closes");
    for wire in common::WIRES {
        assert_eq!(login_over(&gw, wire, email, PLATFORM_PASSWORD).await, 401);
        assert_eq!(login_over(&gw, wire, email, RESET_ON_PLATFORM).await, 200);
        assert_eq!(current_user_over(&gw, wire, &token).await, 401);
        assert_eq!(refresh_over(&gw, wire, &refresh).await, 401);
    }
    // Its login re-hashed the new one: the platform's next change is still
    // the platform's.
    assert!(stored_hash(&gw, email).await.starts_with("$argon2id$"));
    drop(gw);
    platform.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_password_changed_in_keygate_stays_across_rounds_until_the_platform_changes_it_again() {
    let platform = Platform::start().await;
    let upstream = Upstream::start().await;
    let gw = syncing(&platform, &upstream.url(), &upstream.url(), SYNC_INTERVAL).await;
    let email = "tenant@platform.test";
    let token = bearer(&gw, email, PLATFORM_PASSWORD).await.unwrap();
    let changed = gw
        .client()
        .post(gw.https("/api/auth/changePassword"))
        .header("X-Authorization", &token)
        .json(&serde_json::json!({ "currentPassword": PLATFORM_PASSWORD, "newPassword": NEW_PASSWORD }))
        .send()
        .await
        .unwrap();
    assert_eq!(changed.status(), 200);
    let body: serde_json::Value = changed.json().await.unwrap();
    let keygate_token = format!("Bearer {}", body["token"].as_str().unwrap());

    // Rounds that apply the platform's other changes to this user keep the
    // password set in keygate.
    for round in 1..=2 {
        let name = format!("Renamed{round}");
        platform
            .execute(&format!(
                "UPDATE tb_user SET last_name = '{name}' WHERE id = '{}'",
                platform.admin
            ))
            .await;
        wait_until("the platform's new name applied", SYNCED, async || {
            let users = gw.running.store.list_users().await.unwrap();
            users
                .iter()
                .any(|u| u.email == email && u.last_name == name)
        })
        .await;
        for wire in common::WIRES {
            assert_eq!(login_over(&gw, wire, email, NEW_PASSWORD).await, 200);
            assert_eq!(login_over(&gw, wire, email, PLATFORM_PASSWORD).await, 401);
            assert_eq!(current_user_over(&gw, wire, &keygate_token).await, 200);
        }
    }

    // The platform changes it again: the platform's replaces keygate's.
    set_platform_password(&platform, platform.admin, RESET_ON_PLATFORM).await;
    let took = wait_until(
        "the token of keygate's password refused",
        SYNCED,
        async || current_user(&gw, &keygate_token).await.status() == 401,
    )
    .await;
    println!(
        "a platform password replaced one set in keygate: its token refused {} ms later (sync_interval {SYNC_INTERVAL})",
        took.as_millis()
    );
    for wire in common::WIRES {
        assert_eq!(login_over(&gw, wire, email, NEW_PASSWORD).await, 401);
        assert_eq!(login_over(&gw, wire, email, RESET_ON_PLATFORM).await, 200);
    }
    drop(gw);
    platform.drop().await;
}

/// The files in `dir`, sorted.
fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The real binary, in the order docs/moving-from-the-platform.md gives, on
/// a fresh data directory: `keygate import platform --dry-run` (a report,
/// nothing created), `keygate import platform` (creates the store and fills
/// it), then `keygate serve`, which starts at once with the imported signing
/// key and no bootstrap administrator beside the platform's own.
#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_first_run_in_the_documented_order_works_the_first_time() {
    let platform = Platform::start().await;
    let double = PlatformDouble::start(SIGNING_KEY).await;
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let ca_pem = common::certificate_into(&dir.path().join("ca"), &data);
    let config = dir.path().join("keygate.toml");
    common::write_config(&config, &data, &upstream.url(), &platform_route(&double));
    let run = |extra: &[&str]| {
        let mut args: Vec<String> = ["import", "platform", "--database-url", &platform.url]
            .iter()
            .map(|a| (*a).to_owned())
            .collect();
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        keygate(&config, &args)
    };
    let fresh = files_in(&data);

    // 1. The report: everything is new; no file, no schema.
    let dry = run(&["--dry-run", "--json"]);
    let stderr = String::from_utf8_lossy(&dry.stderr);
    assert!(dry.status.success(), "{stderr}");
    assert!(stderr.contains("no store yet"), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&dry.stdout).unwrap();
    assert_eq!(report["dryRun"], true, "{report}");
    assert_eq!(report["users"]["added"], 5, "{report}");
    assert_eq!(report["users"]["unchanged"], 0, "{report}");
    assert_eq!(report["keys"]["added"], 4, "{report}");
    assert_eq!(report["signing"]["state"], "imported", "{report}");
    assert!(report.get("bootstrapAdmin").is_none(), "{report}");
    assert_eq!(files_in(&data), fresh, "a dry run creates nothing");

    // 2. The import creates the store and fills it, as the dry run said.
    let real = run(&["--json"]);
    let stderr = String::from_utf8_lossy(&real.stderr);
    assert!(real.status.success(), "{stderr}");
    assert!(stderr.contains("creating it"), "{stderr}");
    let imported: serde_json::Value = serde_json::from_slice(&real.stdout).unwrap();
    assert_eq!(imported["users"], report["users"], "{imported}");
    assert_eq!(imported["keys"], report["keys"], "{imported}");
    assert!(data.join("k.db").is_file());

    // 3. The server starts the first time, signing with the imported key.
    let keygate = common::Process::spawn(&config, "info");
    let log = std::fs::read_to_string(&keygate.log).unwrap();
    assert!(!log.contains("created the first administrator"), "{log}");
    assert!(!data.join("bootstrap-admin-password").exists());
    for wire in common::WIRES {
        let client = {
            let builder = reqwest::Client::builder()
                .add_root_certificate(reqwest::Certificate::from_pem(&ca_pem).unwrap())
                .resolve("localhost", ([127, 0, 0, 1], 0).into())
                .timeout(Duration::from_secs(10));
            match wire {
                common::Wire::Http1 => builder.http1_only(),
                common::Wire::Http2 => builder,
            }
            .build()
            .unwrap()
        };
        let https = |path: &str| format!("https://localhost:{}{path}", keygate.https);
        let login = |email: &str, password: &str| {
            client
                .post(https("/api/auth/login"))
                .json(&serde_json::json!({ "username": email, "password": password }))
                .send()
        };
        let platform_admin = login("sysadmin@platform.test", PLATFORM_PASSWORD)
            .await
            .unwrap();
        assert_eq!(platform_admin.status(), 200, "{wire:?}");
        assert_eq!(platform_admin.version(), wire.version());
        let bootstrap = login("sysadmin@keygate.local", "bootstrap-password")
            .await
            .unwrap();
        assert_eq!(
            bootstrap.status(),
            401,
            "{wire:?}: no bootstrap administrator"
        );
        let through = client
            .get(https("/api/tb/user"))
            .header("X-Authorization", api_key_header(&platform.admin_key))
            .send()
            .await
            .unwrap();
        let status = through.status();
        let user: serde_json::Value = through.json().await.unwrap();
        assert_eq!(
            status, 200,
            "{wire:?}: the platform took keygate's token: {user}"
        );
        assert_eq!(user["id"], platform.admin.to_string(), "{user}");
    }
    keygate.signal("TERM");
    drop(keygate);
    platform.drop().await;
}

/// The audit events of `action`, newest first.
async fn audited(gw: &Gateway, action: &str) -> Vec<keygate::store::AuditEvent> {
    let filter = keygate::store::AuditFilter {
        action: Some(action.to_owned()),
        ..Default::default()
    };
    gw.running
        .store
        .audit_events_where(&filter, 100)
        .await
        .unwrap()
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn an_unused_bootstrap_admin_gives_way_to_the_platforms_admin_and_its_removal_is_audited() {
    let platform = Platform::start().await;
    let (_upstream, gw) = gateway("").await;
    let bootstrap = "sysadmin@keygate.local";
    let admin = gw.running.store.user_by_email(bootstrap).await.unwrap();
    let admin = admin.expect("the server created its bootstrap administrator");
    // Where a first start with the JSON log wrote its generated password.
    let password_file = gw.dir.path().join("bootstrap-admin-password");
    std::fs::write(&password_file, "generated\n").unwrap();

    let dry = import_json(&gw, &platform, &["--dry-run"]).await;
    assert_eq!(dry["bootstrapAdmin"]["state"], "removed", "{dry}");
    let summary = String::from_utf8_lossy(&import(&gw, &platform.url, &["--dry-run"]).await.stdout)
        .into_owned();
    assert!(
        summary.contains("bootstrap administrator sysadmin@keygate.local: would be removed"),
        "{summary}"
    );
    assert!(
        gw.running
            .store
            .user_by_email(bootstrap)
            .await
            .unwrap()
            .is_some()
    );
    assert!(password_file.exists(), "a dry run removes nothing");

    let report = import_json(&gw, &platform, &[]).await;
    assert_eq!(report["bootstrapAdmin"]["state"], "removed", "{report}");
    assert!(!password_file.exists(), "its password file goes with it");
    assert!(
        gw.running
            .store
            .user_by_email(bootstrap)
            .await
            .unwrap()
            .is_none()
    );
    let events = audited(&gw, "user.bootstrap_remove").await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].target_id, admin.id);
    for wire in common::WIRES {
        assert_eq!(
            login_over(&gw, wire, bootstrap, common::PASSWORD).await,
            401
        );
        let platform_admin = login_over(&gw, wire, "sysadmin@platform.test", PLATFORM_PASSWORD);
        assert_eq!(platform_admin.await, 200);
    }
    // A re-import has nothing more to say of it.
    let again = import_json(&gw, &platform, &[]).await;
    assert!(again.get("bootstrapAdmin").is_none(), "{again}");
    platform.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_bootstrap_admin_in_use_is_kept_beside_the_platforms_and_the_import_says_why() {
    let platform = Platform::start().await;
    let (_upstream, gw) = gateway("").await;
    let bootstrap = "sysadmin@keygate.local";
    // The operator logged in with it: it is in use.
    assert!(bearer(&gw, bootstrap, common::PASSWORD).await.is_some());

    let report = import_json(&gw, &platform, &[]).await;
    assert_eq!(report["bootstrapAdmin"]["state"], "kept", "{report}");
    let reason = report["bootstrapAdmin"]["reason"].as_str().unwrap();
    assert!(reason.contains("it has logged in"), "{reason}");
    assert!(
        reason.contains("keygate user delete sysadmin@keygate.local"),
        "{reason}"
    );
    assert!(audited(&gw, "user.bootstrap_remove").await.is_empty());
    let summary =
        String::from_utf8_lossy(&import(&gw, &platform.url, &[]).await.stdout).into_owned();
    assert!(
        summary.contains("bootstrap administrator sysadmin@keygate.local: kept: it has been used"),
        "{summary}"
    );
    for wire in common::WIRES {
        assert_eq!(
            login_over(&gw, wire, bootstrap, common::PASSWORD).await,
            200
        );
    }
    platform.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_platform_key_tried_before_the_sync_brings_it_works_from_that_round_despite_the_negative_cache()
 {
    let platform = Platform::start().await;
    let upstream = Upstream::start().await;
    let config = sync_config(&platform.url, &upstream.url(), "1s")
        .replace("[cache]\n", "[cache]\nnegative_ttl = \"300s\"\n");
    let gw = Gateway::start(&upstream.url(), &config).await;
    wait_until("the first sync", SYNCED, async || {
        bearer(&gw, "tenant@platform.test", PLATFORM_PASSWORD)
            .await
            .is_some()
    })
    .await;
    let value = format!("tb_{}", Uuid::new_v4().simple());
    let status = async |wire: common::Wire| {
        gw.client_over(wire)
            .get(gw.https("/api/auth/user"))
            .header("X-Authorization", api_key_header(&value))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    for wire in common::WIRES {
        assert_eq!(status(wire).await, 401, "{wire:?}: not on the platform yet");
    }
    platform
        .execute(&format!(
            "INSERT INTO api_key (id, created_time, tenant_id, user_id, value, enabled, expiration_time, description) \
             VALUES ('{}', 1700000000003, '{}', '{}', '{value}', TRUE, 0, 'added later')",
            Uuid::new_v4(),
            platform.tenant,
            platform.admin
        ))
        .await;
    // A round comes within 1 s; 300 s of negative cache would outlast the wait.
    wait_until("the key to work", Duration::from_secs(5), async || {
        status(common::Wire::Http1).await == 200
    })
    .await;
    for wire in common::WIRES {
        assert_eq!(status(wire).await, 200, "{wire:?}");
    }
    platform.drop().await;
}

/// `keygate serve` before the import, with a route that needs the platform's
/// signing key: refused, naming the import, and with no bootstrap
/// administrator left behind for the import to find beside the platform's.
#[tokio::test]
async fn a_start_refused_for_want_of_the_platforms_key_creates_no_bootstrap_admin() {
    let double = PlatformDouble::start(SIGNING_KEY).await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    common::certificate_into(&dir.path().join("ca"), &data);
    let config = dir.path().join("keygate.toml");
    common::write_config(&config, &data, &double.url(), &platform_route(&double));
    let mut child = Command::new(env!("CARGO_BIN_EXE_keygate"))
        .arg("--config")
        .arg(&config)
        .arg("serve")
        .env("RUST_LOG", "warn")
        .env_remove("KEYGATE_CONFIG")
        .env_remove("KEYGATE_BOOTSTRAP_PASSWORD")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("keygate serve started without the platform's signing key");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success());
    assert!(stderr.contains("keygate import platform"), "{stderr}");
    assert!(
        !stderr.contains("created the first administrator"),
        "{stderr}"
    );
    assert!(!data.join("bootstrap-admin-password").exists());
    let url = format!("sqlite://{}/k.db", data.display());
    if data.join("k.db").is_file() {
        let store = keygate::store::Store::connect(&url, 1).await.unwrap();
        assert!(store.list_users().await.unwrap().is_empty());
        store.close().await;
    }
}

/// The tables in `schema`.
async fn tables_in(base: &str, schema: &str) -> Vec<String> {
    let mut db = PgConnection::connect(base).await.unwrap();
    sqlx::query_scalar("SELECT tablename::text FROM pg_catalog.pg_tables WHERE schemaname = $1")
        .bind(schema)
        .fetch_all(&mut db)
        .await
        .unwrap()
}

/// On a PostgreSQL store too: the dry run leaves an empty database without
/// keygate's tables, and the import creates them.
#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_dry_run_before_the_first_import_creates_no_schema_in_a_postgresql_store() {
    let platform = Platform::start().await;
    let (store_url, schema) = fresh_schema(&platform.base).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("keygate.toml");
    std::fs::write(&config, format!("[store]\nurl = \"{store_url}\"\n")).unwrap();
    let run = |extra: &[&str]| {
        let mut args: Vec<String> = [
            "import",
            "platform",
            "--json",
            "--database-url",
            &platform.url,
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        keygate(&config, &args)
    };
    let dry = run(&["--dry-run"]);
    assert!(
        dry.status.success(),
        "{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&dry.stdout).unwrap();
    assert_eq!(report["users"]["added"], 5, "{report}");
    assert!(
        tables_in(&platform.base, &schema).await.is_empty(),
        "no schema"
    );
    let real = run(&[]);
    assert!(
        real.status.success(),
        "{}",
        String::from_utf8_lossy(&real.stderr)
    );
    let tables = tables_in(&platform.base, &schema).await;
    assert!(tables.contains(&"users".to_owned()), "{tables:?}");
    drop_schema(&platform.base, &schema).await;
    platform.drop().await;
}

/// Two replicas on one PostgreSQL store, both syncing: the one that does not
/// apply the round that brings a key forgets having found it unknown too.
#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn a_platform_key_tried_on_every_replica_before_the_sync_brings_it_works_on_each_from_the_next_round()
 {
    let platform = Platform::start().await;
    let upstream = Upstream::start().await;
    let (store_url, store_schema) = fresh_schema(&platform.base).await;
    let config = sync_config(&platform.url, &upstream.url(), "1s")
        .replace("[cache]\n", "[cache]\nnegative_ttl = \"300s\"\n");
    let a = Gateway::start_on(&upstream.url(), &config, Some(&store_url)).await;
    let b = Gateway::start_on(&upstream.url(), &config, Some(&store_url)).await;
    for gw in [&a, &b] {
        wait_until("the first sync", SYNCED, async || {
            bearer(gw, "tenant@platform.test", PLATFORM_PASSWORD)
                .await
                .is_some()
        })
        .await;
    }
    let value = format!("tb_{}", Uuid::new_v4().simple());
    let status = async |gw: &Gateway, wire: common::Wire| {
        gw.client_over(wire)
            .get(gw.https("/api/auth/user"))
            .header("X-Authorization", api_key_header(&value))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    for gw in [&a, &b] {
        for wire in common::WIRES {
            assert_eq!(
                status(gw, wire).await,
                401,
                "{wire:?}: not on the platform yet"
            );
        }
    }
    platform
        .execute(&format!(
            "INSERT INTO api_key (id, created_time, tenant_id, user_id, value, enabled, expiration_time, description) \
             VALUES ('{}', 1700000000003, '{}', '{}', '{value}', TRUE, 0, 'added later')",
            Uuid::new_v4(),
            platform.tenant,
            platform.admin
        ))
        .await;
    // Rounds come every second on each replica; 300 s of negative cache
    // would outlast the wait.
    for gw in [&a, &b] {
        wait_until("the key to work", Duration::from_secs(5), async || {
            status(gw, common::Wire::Http1).await == 200
        })
        .await;
        for wire in common::WIRES {
            assert_eq!(status(gw, wire).await, 200, "{wire:?}");
        }
    }
    drop(a);
    drop(b);
    drop_schema(&platform.base, &store_schema).await;
    platform.drop().await;
}
