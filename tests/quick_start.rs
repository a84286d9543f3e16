//! The quick start of `docs/in-front-of-the-platform.md`, run as written: a
//! PostgreSQL schema laid out as the platform's (the tables and columns the
//! import and the sync read, as the platform declares them), filled as the
//! platform fills it; then the documented commands with the real binary (the
//! dry run, the import, `keygate serve` with the sync on and the documented
//! config), the mailed links followed as a browser would, and changes made on
//! the platform's side reaching keygate within the documented wait. Needs
//! PostgreSQL: ignored unless run with `--include-ignored` and
//! KEYGATE_TEST_DATABASE_URL set (CI does both); the check of the facts
//! against the import's own list of columns always runs.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::platform::{NULL_UUID, PlatformDouble};
use common::totp::{step_now, totp_at};
use common::{Wire, api_key_header, drop_schema, fresh_schema, wait_until};
use serde_json::{Value, json};
use sqlx::Connection;
use sqlx::postgres::PgConnection;
use uuid::Uuid;

/// The platform's tables the import and the sync read, column by column, as
/// the platform's `schema-entities.sql` declares them: (table, column, type
/// as PostgreSQL's `information_schema` names it, nullable, the columns of
/// each UNIQUE constraint the column is in, `;` between two constraints).
/// Primary keys are not UNIQUE constraints there, so not here.
const FACTS: &[(&str, &str, &str, bool, &str)] = &[
    ("tb_user", "id", "uuid", false, ""),
    ("tb_user", "created_time", "bigint", false, ""),
    ("tb_user", "additional_info", "character varying", true, ""),
    ("tb_user", "authority", "character varying(255)", true, ""),
    ("tb_user", "customer_id", "uuid", true, ""),
    ("tb_user", "email", "character varying(255)", true, "email"),
    ("tb_user", "first_name", "character varying(255)", true, ""),
    ("tb_user", "last_name", "character varying(255)", true, ""),
    ("tb_user", "phone", "character varying(255)", true, ""),
    ("tb_user", "tenant_id", "uuid", true, ""),
    ("tb_user", "version", "bigint", true, ""),
    ("user_credentials", "id", "uuid", false, ""),
    ("user_credentials", "created_time", "bigint", false, ""),
    (
        "user_credentials",
        "activate_token",
        "character varying(255)",
        true,
        "activate_token",
    ),
    (
        "user_credentials",
        "activate_token_exp_time",
        "bigint",
        true,
        "",
    ),
    ("user_credentials", "enabled", "boolean", true, ""),
    (
        "user_credentials",
        "password",
        "character varying(255)",
        true,
        "",
    ),
    (
        "user_credentials",
        "reset_token",
        "character varying(255)",
        true,
        "reset_token",
    ),
    (
        "user_credentials",
        "reset_token_exp_time",
        "bigint",
        true,
        "",
    ),
    ("user_credentials", "user_id", "uuid", true, "user_id"),
    (
        "user_credentials",
        "additional_info",
        "character varying",
        true,
        "",
    ),
    ("user_credentials", "last_login_ts", "bigint", true, ""),
    (
        "user_credentials",
        "failed_login_attempts",
        "integer",
        true,
        "",
    ),
    ("api_key", "id", "uuid", false, ""),
    ("api_key", "created_time", "bigint", false, ""),
    ("api_key", "tenant_id", "uuid", true, ""),
    ("api_key", "user_id", "uuid", true, ""),
    ("api_key", "value", "character varying(512)", true, "value"),
    ("api_key", "enabled", "boolean", false, ""),
    ("api_key", "expiration_time", "bigint", true, ""),
    ("api_key", "description", "character varying(255)", true, ""),
    ("admin_settings", "id", "uuid", false, ""),
    ("admin_settings", "tenant_id", "uuid", false, ""),
    ("admin_settings", "created_time", "bigint", false, ""),
    (
        "admin_settings",
        "json_value",
        "character varying",
        true,
        "",
    ),
    ("admin_settings", "key", "character varying(255)", true, ""),
    ("customer", "id", "uuid", false, ""),
    ("customer", "created_time", "bigint", false, ""),
    ("customer", "additional_info", "character varying", true, ""),
    ("customer", "address", "character varying", true, ""),
    ("customer", "address2", "character varying", true, ""),
    ("customer", "city", "character varying(255)", true, ""),
    ("customer", "country", "character varying(255)", true, ""),
    ("customer", "email", "character varying(255)", true, ""),
    ("customer", "phone", "character varying(255)", true, ""),
    ("customer", "state", "character varying(255)", true, ""),
    (
        "customer",
        "tenant_id",
        "uuid",
        true,
        "tenant_id,external_id;tenant_id,title",
    ),
    (
        "customer",
        "title",
        "character varying(255)",
        true,
        "tenant_id,title",
    ),
    ("customer", "zip", "character varying(255)", true, ""),
    (
        "customer",
        "external_id",
        "uuid",
        true,
        "tenant_id,external_id",
    ),
    ("customer", "is_public", "boolean", true, ""),
    ("customer", "version", "bigint", true, ""),
    ("user_auth_settings", "id", "uuid", false, ""),
    ("user_auth_settings", "created_time", "bigint", false, ""),
    ("user_auth_settings", "user_id", "uuid", false, "user_id"),
    (
        "user_auth_settings",
        "two_fa_settings",
        "character varying",
        true,
        "",
    ),
];

/// Those tables, written from the facts above.
const PLATFORM_DDL: &str = "
CREATE TABLE tb_user (
    id uuid NOT NULL PRIMARY KEY,
    created_time bigint NOT NULL,
    additional_info varchar,
    authority varchar(255),
    customer_id uuid,
    email varchar(255) UNIQUE,
    first_name varchar(255),
    last_name varchar(255),
    phone varchar(255),
    tenant_id uuid,
    version bigint DEFAULT 1);
CREATE TABLE user_credentials (
    id uuid NOT NULL PRIMARY KEY,
    created_time bigint NOT NULL,
    activate_token varchar(255) UNIQUE,
    activate_token_exp_time bigint,
    enabled boolean,
    password varchar(255),
    reset_token varchar(255) UNIQUE,
    reset_token_exp_time bigint,
    user_id uuid UNIQUE,
    additional_info varchar DEFAULT '{}',
    last_login_ts bigint,
    failed_login_attempts int);
CREATE TABLE api_key (
    id uuid NOT NULL PRIMARY KEY,
    created_time bigint NOT NULL,
    tenant_id uuid,
    user_id uuid,
    value varchar(512),
    enabled boolean NOT NULL DEFAULT TRUE,
    expiration_time bigint DEFAULT 0,
    description varchar(255),
    UNIQUE (value));
CREATE TABLE admin_settings (
    id uuid NOT NULL PRIMARY KEY,
    tenant_id uuid NOT NULL,
    created_time bigint NOT NULL,
    json_value varchar,
    key varchar(255));
CREATE TABLE customer (
    id uuid NOT NULL PRIMARY KEY,
    created_time bigint NOT NULL,
    additional_info varchar,
    address varchar,
    address2 varchar,
    city varchar(255),
    country varchar(255),
    email varchar(255),
    phone varchar(255),
    state varchar(255),
    tenant_id uuid,
    title varchar(255),
    zip varchar(255),
    external_id uuid,
    is_public boolean,
    version bigint DEFAULT 1,
    UNIQUE (tenant_id, title),
    UNIQUE (tenant_id, external_id));
CREATE TABLE user_auth_settings (
    id uuid NOT NULL PRIMARY KEY,
    created_time bigint NOT NULL,
    user_id uuid UNIQUE NOT NULL REFERENCES tb_user(id),
    two_fa_settings varchar);
";

const PASSWORD: &str = "platform-Passw0rd!";
const NEW_PASSWORD: &str = "keygate-Passw0rd!2";
const CHANGED_ON_PLATFORM: &str = "changed-on-Platf0rm!";
const INVITATION: &str = "quickStartActivationToken0123456789";
const RESET: &str = "quickStartResetToken0123456789abcd";
const TOTP_SECRET: &str = "JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP";
const SIGNING_KEY: &str =
    "c2VjcmV0LXNpZ25pbmcta2V5LW9mLXRoZS1wbGF0Zm9ybS1mb3ItdGhlLWltcG9ydC10ZXN0cy0wMTIzNDU2Nzg5";
const ROTATED_KEY: &str =
    "cXVpY2stc3RhcnQtcm90YXRlZC1zaWduaW5nLWtleS1vZi10aGUtcGxhdGZvcm0tMDEyMzQ1Njc4OWFiY2RlZiE=";
/// The `sync_interval` the test serves with. The doc says a change on the
/// platform reaches keygate in the next round to start: within one interval
/// plus the time of two rounds.
const SYNC_INTERVAL: Duration = Duration::from_secs(1);
/// Beyond the interval: the two rounds' own reading and writing, and the
/// requests that look, on a machine shared with other builds.
const ALLOWANCE: Duration = Duration::from_secs(5);
/// The address the documented config gives users (`server.public_base_url`).
const PUBLIC_BASE: &str = "https://iot.example.com";

#[test]
fn every_column_the_import_reads_is_in_the_platform_facts() {
    let mut required: Vec<(&str, &str)> = keygate::import::source::REQUIRED
        .iter()
        .flat_map(|(table, columns)| columns.iter().map(move |c| (*table, *c)))
        .collect();
    let (two_fa_table, two_fa_columns) = keygate::import::source::TWO_FA_TABLE;
    required.extend(two_fa_columns.iter().map(|c| (two_fa_table, *c)));
    assert!(required.len() > 30, "{required:?}");
    for (table, column) in required {
        assert!(
            FACTS.iter().any(|(t, c, ..)| *t == table && *c == column),
            "the import reads {table}.{column}, which the platform facts do not list"
        );
    }
}

/// The columns of `schema`'s tables as PostgreSQL reports them, in the
/// facts' shape and order (table by table, in column order).
async fn columns_read_back(
    db: &mut PgConnection,
    schema: &str,
) -> Vec<(String, String, String, bool, String)> {
    let rows: Vec<(String, String, String, Option<i32>, String)> = sqlx::query_as(
        "SELECT table_name::text, column_name::text, data_type::text, \
         character_maximum_length::int, is_nullable::text FROM information_schema.columns \
         WHERE table_schema = $1 ORDER BY table_name, ordinal_position",
    )
    .bind(schema)
    .fetch_all(&mut *db)
    .await
    .unwrap();
    let uniques: Vec<(String, String)> = sqlx::query_as(
        "SELECT cl.relname::text, array_to_string(ARRAY(SELECT a.attname::text \
         FROM unnest(con.conkey) WITH ORDINALITY AS k(num, pos) \
         JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.num ORDER BY k.pos), ',') \
         FROM pg_constraint con JOIN pg_class cl ON cl.oid = con.conrelid \
         JOIN pg_namespace n ON n.oid = cl.relnamespace \
         WHERE n.nspname = $1 AND con.contype = 'u'",
    )
    .bind(schema)
    .fetch_all(&mut *db)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(table, column, data_type, length, nullable)| {
            let data_type = match length {
                Some(n) => format!("{data_type}({n})"),
                None => data_type,
            };
            let mut unique: Vec<&str> = uniques
                .iter()
                .filter(|(t, cols)| *t == table && cols.split(',').any(|c| c == column))
                .map(|(_, cols)| cols.as_str())
                .collect();
            unique.sort_unstable();
            let unique = unique.join(";");
            (table, column, data_type, nullable == "YES", unique)
        })
        .collect()
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn the_platform_tables_built_here_match_the_platforms_declared_columns() {
    let base = common::test_database_url();
    let (url, schema) = fresh_schema(&base).await;
    let mut db = PgConnection::connect(&url).await.unwrap();
    sqlx::raw_sql(PLATFORM_DDL).execute(&mut db).await.unwrap();
    let read_back = columns_read_back(&mut db, &schema).await;
    let mut facts: Vec<(String, String, String, bool, String)> = FACTS
        .iter()
        .map(|(t, c, ty, n, u)| ((*t).into(), (*c).into(), (*ty).into(), *n, (*u).into()))
        .collect();
    // Table by table in name order, each in its declared column order.
    facts.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(read_back.len(), facts.len());
    for (built, noted) in read_back.iter().zip(&facts) {
        assert_eq!(built, noted, "the DDL drifted from the platform's columns");
    }
    drop(db);
    drop_schema(&base, &schema).await;
}

/// The platform's database, filled as the platform fills it.
struct Platform {
    base: String,
    schema: String,
    url: String,
    tenant: Uuid,
    sysadmin: Uuid,
    admin: Uuid,
    customer_user: Uuid,
    admin_key: String,
}

fn bcrypt_2a(password: &str) -> String {
    bcrypt::hash_with_result(password, 10)
        .unwrap()
        .format_for_version(bcrypt::Version::TwoA)
}

/// The platform's `AccountTwoFaSettings` JSON, secrets in plain text.
fn two_fa_json(secret: &str, codes: &[&str]) -> String {
    json!({"configs": {
        "TOTP": {"providerType": "TOTP", "useByDefault": true,
                 "authUrl": format!("otpauth://totp/ThingsBoard:tenant%40platform.test?issuer=ThingsBoard&secret={secret}")},
        "BACKUP_CODE": {"providerType": "BACKUP_CODE", "useByDefault": false, "codes": codes, "codesLeft": codes.len()}
    }})
    .to_string()
}

impl Platform {
    async fn start() -> Platform {
        let base = common::test_database_url();
        let (url, schema) = fresh_schema(&base).await;
        let mut db = PgConnection::connect(&url).await.unwrap();
        sqlx::raw_sql(PLATFORM_DDL).execute(&mut db).await.unwrap();
        let platform = Platform {
            base,
            schema,
            url,
            tenant: Uuid::new_v4(),
            sysadmin: Uuid::new_v4(),
            admin: Uuid::new_v4(),
            customer_user: Uuid::new_v4(),
            admin_key: format!("tb_{}", Uuid::new_v4().simple()),
        };
        let customer = Uuid::new_v4();
        let invitee = Uuid::new_v4();
        let null = Uuid::parse_str(NULL_UUID).unwrap();
        let t = platform.tenant;
        sqlx::query(
            "INSERT INTO customer (id, created_time, tenant_id, title, is_public) \
             VALUES ($1::uuid, 1700000000000, $2::uuid, 'Customer A', FALSE)",
        )
        .bind(customer.to_string())
        .bind(t.to_string())
        .execute(&mut db)
        .await
        .unwrap();
        let hash = bcrypt_2a(PASSWORD);
        let in_an_hour = keygate::clock::now_ms() + 3_600_000;
        // (id, e-mail, authority, tenant, customer, enabled, password,
        // invitation, pending reset)
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
                None,
            ),
            (
                platform.admin,
                "tenant@platform.test",
                "TENANT_ADMIN",
                t,
                null,
                true,
                Some(&hash),
                None,
                None,
            ),
            (
                platform.customer_user,
                "customer@platform.test",
                "CUSTOMER_USER",
                t,
                customer,
                true,
                Some(&hash),
                None,
                Some(RESET),
            ),
            (
                invitee,
                "invitee@platform.test",
                "CUSTOMER_USER",
                t,
                customer,
                false,
                None,
                Some(INVITATION),
                None,
            ),
        ];
        for (id, email, authority, tenant, customer, enabled, password, invitation, reset) in users
        {
            sqlx::query(
                "INSERT INTO tb_user (id, created_time, additional_info, authority, customer_id, email, \
                 first_name, last_name, phone, tenant_id) VALUES ($1::uuid, 1700000000000, \
                 '{\"lang\":\"en_US\"}', $2, $3::uuid, $4, 'First', 'Last', '+100', $5::uuid)",
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
                 activate_token_exp_time, reset_token, reset_token_exp_time, user_id) \
                 VALUES ($1::uuid, 1700000000000, $2, $3, $4, $5, $6, $7, $8::uuid)",
            )
            .bind(Uuid::new_v4().to_string())
            .bind(enabled)
            .bind(password)
            .bind(invitation)
            .bind(invitation.map(|_| in_an_hour))
            .bind(reset)
            .bind(reset.map(|_| in_an_hour))
            .bind(id.to_string())
            .execute(&mut db)
            .await
            .unwrap();
        }
        sqlx::query(
            "INSERT INTO api_key (id, created_time, tenant_id, user_id, value, enabled, \
             expiration_time, description) VALUES ($1::uuid, 1700000000000, $2::uuid, $3::uuid, $4, TRUE, 0, 'integration')",
        )
        .bind(Uuid::new_v4().to_string())
        .bind(t.to_string())
        .bind(platform.admin.to_string())
        .bind(&platform.admin_key)
        .execute(&mut db)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO user_auth_settings (id, created_time, user_id, two_fa_settings) \
             VALUES ($1::uuid, 1700000000000, $2::uuid, $3)",
        )
        .bind(Uuid::new_v4().to_string())
        .bind(platform.admin.to_string())
        .bind(two_fa_json(TOTP_SECRET, &["0a1b2c3d", "4e5f6a7b"]))
        .execute(&mut db)
        .await
        .unwrap();
        platform.set_jwt(&mut db, SIGNING_KEY, true).await;
        platform
    }

    /// The platform's `jwt` admin setting (the system tenant's).
    async fn set_jwt(&self, db: &mut PgConnection, key: &str, insert: bool) {
        let jwt = format!(
            r#"{{"tokenExpirationTime":9000,"refreshTokenExpTime":604800,"tokenIssuer":"platform.test","tokenSigningKey":"{key}"}}"#
        );
        if insert {
            sqlx::query(
                "INSERT INTO admin_settings (id, tenant_id, created_time, json_value, key) \
                 VALUES ($1::uuid, $2::uuid, 1700000000000, $3, 'jwt')",
            )
            .bind(Uuid::new_v4().to_string())
            .bind(NULL_UUID)
            .bind(jwt)
            .execute(&mut *db)
            .await
            .unwrap();
        } else {
            sqlx::query("UPDATE admin_settings SET json_value = $1 WHERE key = 'jwt'")
                .bind(jwt)
                .execute(&mut *db)
                .await
                .unwrap();
        }
    }

    async fn db(&self) -> PgConnection {
        PgConnection::connect(&self.url).await.unwrap()
    }

    async fn drop(self) {
        drop_schema(&self.base, &self.schema).await;
    }
}

/// `keygate --config CONFIG ARGS...` with the platform's database in the
/// environment, as the doc's commands run.
fn keygate(config: &Path, database_url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keygate"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env("KEYGATE_PLATFORM_DATABASE_URL", database_url)
        .env("RUST_LOG", "warn")
        .env_remove("KEYGATE_CONFIG")
        .output()
        .unwrap()
}

/// `keygate --config CONFIG serve`, the platform's database in the
/// environment, once it logs its bound ports.
fn serve(config: &Path, database_url: &str) -> common::Process {
    let log = config.with_extension("log");
    let file = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_keygate"))
        .args(["--log-format", "json", "--config"])
        .arg(config)
        .arg("serve")
        .env("KEYGATE_PLATFORM_DATABASE_URL", database_url)
        .env("RUST_LOG", "info")
        .env_remove("KEYGATE_CONFIG")
        .env_remove("KEYGATE_BOOTSTRAP_PASSWORD")
        .stderr(file)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let line = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains("keygate is serving")) {
            break line.to_owned();
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("keygate exited ({status}) before serving:\n{text}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "keygate did not start:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let fields: Value = serde_json::from_str(&line).unwrap();
    let port = |name: &str| {
        fields["fields"][name]
            .as_str()
            .and_then(|a| a.parse::<SocketAddr>().ok())
            .map_or(0, |a| a.port())
    };
    common::Process {
        https: port("https"),
        http: port("http"),
        admin: port("admin"),
        child,
        log,
    }
}

/// `config/front-of-platform.toml` as the doc says to complete it: the
/// platform's address for `http://platform:8080`, and the lines the doc adds
/// (the data directory, the store, the sync's route and interval); listeners
/// on free loopback ports.
fn documented_config(data: &Path, platform_url: &str) -> String {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/front-of-platform.toml"
    ))
    .unwrap()
    .replace("http://platform:8080", platform_url);
    let mut config: toml::Table = text.parse().unwrap();
    let table = |config: &mut toml::Table, name: &str| -> toml::Table {
        config
            .get(name)
            .and_then(|v| v.as_table())
            .cloned()
            .unwrap_or_default()
    };
    let mut server = table(&mut config, "server");
    server.insert("data_dir".into(), data.display().to_string().into());
    config.insert("server".into(), server.into());
    let mut listen = table(&mut config, "listen");
    assert_eq!(listen["https"].as_str(), Some("0.0.0.0:8443"));
    listen.insert("https".into(), "127.0.0.1:0".into());
    listen.insert("admin".into(), "127.0.0.1:0".into());
    config.insert("listen".into(), listen.into());
    let mut store = toml::Table::new();
    store.insert(
        "url".into(),
        format!("sqlite://{}/keygate.db", data.display()).into(),
    );
    config.insert("store".into(), store.into());
    let mut platform = table(&mut config, "platform");
    platform.insert("upstream".into(), "platform".into());
    platform.insert(
        "sync_interval".into(),
        format!("{}s", SYNC_INTERVAL.as_secs()).into(),
    );
    config.insert("platform".into(), platform.into());
    toml::to_string(&config).unwrap()
}

/// A client trusting keygate's development CA, speaking `wire`, keeping no
/// cookies and following no redirects (as a browser landing from a mail).
fn client(ca_pem: &[u8], wire: Wire) -> reqwest::Client {
    let builder = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem).unwrap())
        .resolve("localhost", SocketAddr::from(([127, 0, 0, 1], 0)))
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(20));
    match wire {
        Wire::Http1 => builder.http1_only(),
        Wire::Http2 => builder,
    }
    .build()
    .unwrap()
}

struct Front {
    https: u16,
    ca_pem: Vec<u8>,
}

impl Front {
    fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.https)
    }

    async fn login(&self, wire: Wire, email: &str, password: &str) -> (u16, Value) {
        let response = client(&self.ca_pem, wire)
            .post(self.url("/api/auth/login"))
            .json(&json!({"username": email, "password": password}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), wire.version());
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, wire: Wire, path: &str, authorization: &str) -> (u16, Value) {
        let response = client(&self.ca_pem, wire)
            .get(self.url(path))
            .header("X-Authorization", authorization)
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), wire.version());
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

/// Waits for a change made on the platform to show through keygate, within
/// the documented wait; prints and returns the time it took.
async fn reaches_keygate(what: &str, done: impl AsyncFnMut() -> bool) -> Duration {
    let limit = SYNC_INTERVAL + ALLOWANCE;
    let took = wait_until(what, limit, done).await;
    eprintln!(
        "quick start: {what}: {} ms (sync_interval {} s)",
        took.as_millis(),
        SYNC_INTERVAL.as_secs()
    );
    took
}

#[tokio::test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn the_quick_start_in_front_of_the_platform_works_as_documented_step_by_step() {
    let platform = Platform::start().await;
    let double = PlatformDouble::start(SIGNING_KEY).await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();

    // 1. The documented config, completed as the doc says.
    let config = dir.path().join("keygate.toml");
    std::fs::write(&config, documented_config(&data, &double.url())).unwrap();

    // The config alone (no store yet: `--connect` waits for the import).
    let checked = keygate(&config, &platform.url, &["check-config"]);
    assert!(
        checked.status.success(),
        "{}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    // 2. The dry run: a report, nothing written.
    let dry = keygate(
        &config,
        &platform.url,
        &["import", "platform", "--dry-run", "--json"],
    );
    let stderr = String::from_utf8_lossy(&dry.stderr);
    assert!(dry.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&dry.stdout).unwrap();
    assert_eq!(report["dryRun"], true, "{report}");
    assert_eq!(report["users"]["added"], 4, "{report}");
    assert_eq!(report["keys"]["added"], 1, "{report}");
    assert_eq!(report["twoFactors"]["added"], 2, "{report}");
    assert_eq!(report["signing"]["state"], "imported", "{report}");
    assert!(
        !data.join("keygate.db").exists(),
        "a dry run creates nothing"
    );

    // 3. The import.
    let real = keygate(&config, &platform.url, &["import", "platform", "--json"]);
    let stderr = String::from_utf8_lossy(&real.stderr);
    assert!(real.status.success(), "{stderr}");
    let imported: Value = serde_json::from_slice(&real.stdout).unwrap();
    assert_eq!(imported["users"], report["users"], "{imported}");
    assert_eq!(imported["keys"], report["keys"], "{imported}");
    assert_eq!(imported["twoFactors"], report["twoFactors"], "{imported}");
    assert!(data.join("keygate.db").is_file());

    // What keygate reads from the platform's database, reached.
    let checked = keygate(&config, &platform.url, &["check-config", "--connect"]);
    let said = String::from_utf8_lossy(&checked.stdout).into_owned()
        + &String::from_utf8_lossy(&checked.stderr);
    assert!(checked.status.success(), "{said}");

    // 4. Serve with the sync on; ready once /readyz says so.
    let server = serve(&config, &platform.url);
    let readyz = format!("http://127.0.0.1:{}/readyz", server.admin);
    wait_until(
        "/readyz",
        Duration::from_secs(30),
        async || matches!(reqwest::get(&readyz).await, Ok(r) if r.status() == 200),
    )
    .await;
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(!log.contains("created the first administrator"), "{log}");
    // The imported rows serve at once; the sync's first round follows.
    let metrics_url = format!("http://127.0.0.1:{}/metrics", server.admin);
    let metrics = async || {
        reqwest::get(&metrics_url)
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    reaches_keygate("the sync's first round", async || {
        !metrics()
            .await
            .contains("keygate_platform_sync_last_success_timestamp_seconds 0\n")
    })
    .await;
    let text = metrics().await;
    assert!(
        text.contains("keygate_platform_sync_errors_total 0\n"),
        "{text}"
    );
    let ca_pem = std::fs::read(data.join("dev-ca.pem")).expect("the development CA");
    let front = Front {
        https: server.https,
        ca_pem,
    };

    for wire in common::WIRES {
        // Users log in with their platform passwords.
        let (status, body) = front.login(wire, "sysadmin@platform.test", PASSWORD).await;
        assert_eq!(status, 200, "{wire:?}: {body}");
        let bearer = format!("Bearer {}", body["token"].as_str().unwrap());
        let (status, me) = front.get(wire, "/api/auth/user", &bearer).await;
        assert_eq!(status, 200, "{wire:?}: {me}");
        assert_eq!(me["id"]["id"], platform.sysadmin.to_string(), "{me}");

        // The platform's second factor: the same authenticator app, and
        // its backup codes (a TOTP code is taken once, so the second wire
        // uses a backup code).
        let (status, body) = front.login(wire, "tenant@platform.test", PASSWORD).await;
        assert_eq!(status, 200, "{wire:?}: {body}");
        assert_eq!(body["scope"], "PRE_VERIFICATION_TOKEN", "{body}");
        let pre = body["token"].as_str().unwrap();
        let (provider, code) = match wire {
            Wire::Http1 => ("TOTP", totp_at(TOTP_SECRET, step_now())),
            Wire::Http2 => ("BACKUP_CODE", "4e5f6a7b".to_owned()),
        };
        let checked = client(&front.ca_pem, wire)
            .post(front.url(&format!(
                "/api/auth/2fa/verification/check?providerType={provider}&verificationCode={code}"
            )))
            .header("X-Authorization", format!("Bearer {pre}"))
            .send()
            .await
            .unwrap();
        assert_eq!(checked.status(), 200, "{wire:?}");

        // The platform's API key, the current user, and the platform's API
        // reached with the platform's own token.
        let key = api_key_header(&platform.admin_key);
        let (status, me) = front.get(wire, "/api/auth/user", &key).await;
        assert_eq!(status, 200, "{wire:?}: {me}");
        assert_eq!(me["email"], "tenant@platform.test", "{me}");
        let (status, through) = front
            .get(wire, "/api/tenant/devices?pageSize=10&page=0", &key)
            .await;
        assert_eq!(
            status, 200,
            "{wire:?}: the platform took keygate's token: {through}"
        );
        assert_eq!(through["id"], platform.admin.to_string(), "{through}");

        // The UI's pages reach the platform, without any credential.
        let seen = double.seen().len();
        let response = client(&front.ca_pem, wire)
            .get(front.url("/login"))
            .header("X-Authorization", &bearer)
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), wire.version());
        let page = double.seen()[seen..]
            .iter()
            .find(|s| s.uri == "/login")
            .cloned()
            .expect("the UI page reached the platform");
        assert!(page.header("x-authorization").is_none(), "{page:?}");
        assert!(page.header("authorization").is_none(), "{page:?}");
    }

    // The invitation in the invitee's mailbox, as the platform mailed it.
    let activate = format!("/api/noauth/activate?activateToken={INVITATION}");
    for wire in common::WIRES {
        let response = client(&front.ca_pem, wire)
            .get(front.url(&activate))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 303, "{wire:?}");
        assert_eq!(
            response.headers()["location"].to_str().unwrap(),
            format!("{PUBLIC_BASE}/login/createPassword?activateToken={INVITATION}")
        );
    }
    let set = client(&front.ca_pem, Wire::Http1)
        .post(front.url("/api/noauth/activate"))
        .json(&json!({"activateToken": INVITATION, "password": NEW_PASSWORD}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), 200);
    // The pending reset in the customer user's mailbox.
    let reset = format!("/api/noauth/resetPassword?resetToken={RESET}");
    for wire in common::WIRES {
        let response = client(&front.ca_pem, wire)
            .get(front.url(&reset))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 303, "{wire:?}");
        assert_eq!(
            response.headers()["location"].to_str().unwrap(),
            format!("{PUBLIC_BASE}/login/resetPassword?resetToken={RESET}")
        );
    }
    let set = client(&front.ca_pem, Wire::Http2)
        .post(front.url("/api/noauth/resetPassword"))
        .json(&json!({"resetToken": RESET, "password": NEW_PASSWORD}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), 200);
    for wire in common::WIRES {
        let (status, _) = front
            .login(wire, "invitee@platform.test", NEW_PASSWORD)
            .await;
        assert_eq!(status, 200, "{wire:?}: the invitee logs in");
        let (status, _) = front
            .login(wire, "customer@platform.test", NEW_PASSWORD)
            .await;
        assert_eq!(status, 200, "{wire:?}: the reset password logs in");
    }

    // Changes on the platform's side, each within the documented wait.
    let mut db = platform.db().await;
    // A password changed in the platform's UI: the old one and the tokens
    // issued with it stop working, the new one logs in.
    let (_, body) = front
        .login(Wire::Http2, "sysadmin@platform.test", PASSWORD)
        .await;
    let old = format!("Bearer {}", body["token"].as_str().unwrap());
    sqlx::query("UPDATE user_credentials SET password = $1 WHERE user_id = $2::uuid")
        .bind(bcrypt_2a(CHANGED_ON_PLATFORM))
        .bind(platform.sysadmin.to_string())
        .execute(&mut db)
        .await
        .unwrap();
    reaches_keygate("a password changed on the platform", async || {
        front.get(Wire::Http1, "/api/auth/user", &old).await.0 == 401
    })
    .await;
    for wire in common::WIRES {
        let (status, _) = front
            .login(wire, "sysadmin@platform.test", CHANGED_ON_PLATFORM)
            .await;
        assert_eq!(status, 200, "{wire:?}");
        let (status, _) = front.login(wire, "sysadmin@platform.test", PASSWORD).await;
        assert_eq!(status, 401, "{wire:?}");
    }

    // A user disabled on the platform.
    let (_, body) = front
        .login(Wire::Http1, "customer@platform.test", NEW_PASSWORD)
        .await;
    let customer_token = format!("Bearer {}", body["token"].as_str().unwrap());
    sqlx::query("UPDATE user_credentials SET enabled = FALSE WHERE user_id = $1::uuid")
        .bind(platform.customer_user.to_string())
        .execute(&mut db)
        .await
        .unwrap();
    reaches_keygate("a user disabled on the platform", async || {
        front
            .login(Wire::Http2, "customer@platform.test", NEW_PASSWORD)
            .await
            .0
            == 401
    })
    .await;
    for wire in common::WIRES {
        let (status, _) = front.get(wire, "/api/auth/user", &customer_token).await;
        assert_eq!(status, 401, "{wire:?}: the disabled user's token");
    }

    // A key created on the platform.
    let new_key = format!("tb_{}", Uuid::new_v4().simple());
    sqlx::query(
        "INSERT INTO api_key (id, created_time, tenant_id, user_id, value, enabled, expiration_time, description) \
         VALUES ($1::uuid, 1700000000001, $2::uuid, $3::uuid, $4, TRUE, 0, 'created later')",
    )
    .bind(Uuid::new_v4().to_string())
    .bind(platform.tenant.to_string())
    .bind(platform.admin.to_string())
    .bind(&new_key)
    .execute(&mut db)
    .await
    .unwrap();
    let new_key = api_key_header(&new_key);
    reaches_keygate("a key created on the platform", async || {
        front.get(Wire::Http1, "/api/auth/user", &new_key).await.0 == 200
    })
    .await;
    for wire in common::WIRES {
        let (status, me) = front.get(wire, "/api/auth/user", &new_key).await;
        assert_eq!(status, 200, "{wire:?}");
        assert_eq!(me["email"], "tenant@platform.test", "{me}");
    }

    // The platform's signing key rotated: the platform now takes only tokens
    // signed with the new key.
    platform.set_jwt(&mut db, ROTATED_KEY, false).await;
    double.rotate_key(ROTATED_KEY);
    let key = api_key_header(&platform.admin_key);
    reaches_keygate("a signing key rotated on the platform", async || {
        front.get(Wire::Http2, "/api/tenant/devices", &key).await.0 == 200
    })
    .await;
    for wire in common::WIRES {
        let (status, through) = front.get(wire, "/api/tenant/devices", &key).await;
        assert_eq!(status, 200, "{wire:?}: {through}");
        let last = double.seen().last().cloned().unwrap();
        let token = last
            .header("x-authorization")
            .and_then(|v| v.strip_prefix("Bearer "))
            .expect("a platform token")
            .to_owned();
        assert!(
            double.authenticate(&token).is_ok(),
            "signed with the rotated key"
        );
    }

    server.signal("TERM");
    drop(server);
    drop(db);
    platform.drop().await;
}
