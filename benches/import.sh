#!/usr/bin/env bash
# Times `keygate import platform` of a large platform database, and its peak
# memory: fills a fresh schema of a PostgreSQL database with the platform's
# tables (USERS users with bcrypt passwords, KEYS API keys, the jwt settings),
# imports it into an empty SQLite store (or KEYGATE_BENCH_STORE_URL), then
# re-imports it (nothing changes: the cost of a converging re-run).
#
#   benches/import.sh                          # 100,000 users and 100,000 keys, target/debug/keygate
#   KEYGATE_BIN=target/release/keygate benches/import.sh
#   USERS=10000 KEYS=10000 benches/import.sh   # smaller
#
# Needs psql and GNU time (/usr/bin/time). The schema is dropped at the end.
set -euo pipefail

DB=${KEYGATE_BENCH_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
USERS=${USERS:-100000}
KEYS=${KEYS:-100000}
BIN=${KEYGATE_BIN:-target/debug/keygate}
SCHEMA=kg_import_bench_$$
WORK=$(mktemp -d)
trap 'psql -q "$DB" -c "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT

[ -x "$BIN" ] || cargo build --locked --bin keygate
STORE=${KEYGATE_BENCH_STORE_URL:-sqlite://$WORK/keygate.db}
cat >"$WORK/keygate.toml" <<TOML
[server]
data_dir = "$WORK"
[listen]
https = "127.0.0.1:0"
http = ""
admin = "127.0.0.1:0"
[store]
url = "$STORE"
TOML

# The store is made by the server, as in production: management commands
# (the import too) never create one. Started until it is ready, then stopped.
KEYGATE_BOOTSTRAP_PASSWORD=import-bench-bootstrap RUST_LOG=info \
  "$BIN" --config "$WORK/keygate.toml" serve >"$WORK/serve.log" 2>&1 &
SERVE=$!
for _ in $(seq 300); do grep -q 'keygate is serving' "$WORK/serve.log" && break; sleep 0.1; done
grep -q 'keygate is serving' "$WORK/serve.log" || { cat "$WORK/serve.log" >&2; echo "keygate did not start" >&2; exit 1; }
kill "$SERVE"; wait "$SERVE" 2>/dev/null || true

# One bcrypt hash for every user (its cost is the platform's: 10).
HASH='$2a$10$N9qo8uLOickgx2ZMRZoMyeIjZAgcfl7p92ldGxad68LJZdL17lhWy'
echo "filling $USERS users and $KEYS API keys into schema $SCHEMA"
psql -q -v ON_ERROR_STOP=1 "$DB" <<SQL
CREATE SCHEMA $SCHEMA;
SET search_path = $SCHEMA;
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
-- 100 tenants; every tenth user a tenant administrator, the others customer users.
INSERT INTO tb_user
SELECT md5('user' || n)::uuid, 1700000000000 + n, '{"lang":"en_US"}',
       CASE WHEN n % 10 = 0 THEN 'TENANT_ADMIN' ELSE 'CUSTOMER_USER' END,
       CASE WHEN n % 10 = 0 THEN '13814000-1dd2-11b2-8080-808080808080'::uuid
            ELSE md5('customer' || (n % 1000))::uuid END,
       'user' || n || '@bench.test', 'First' || n, 'Last', '+1' || n,
       md5('tenant' || (n % 1000 % 100))::uuid, 1
FROM generate_series(1, $USERS) AS n;
INSERT INTO user_credentials (id, created_time, enabled, password, user_id)
SELECT md5('cred' || n)::uuid, 1700000000000 + n, true, '$HASH', md5('user' || n)::uuid
FROM generate_series(1, $USERS) AS n;
INSERT INTO api_key
SELECT md5('key' || n)::uuid, 1700000000000 + n,
       md5('tenant' || (((n - 1) % $USERS + 1) % 1000 % 100))::uuid,
       md5('user' || ((n - 1) % $USERS + 1))::uuid,
       'tb_' || md5('value' || n) || md5('more' || n), true, 0, 'integration ' || n
FROM generate_series(1, $KEYS) AS n;
INSERT INTO admin_settings VALUES (gen_random_uuid(), '13814000-1dd2-11b2-8080-808080808080', 1,
  '{"tokenIssuer":"bench.test","tokenSigningKey":"c2lnbmluZy1rZXktb2YtdGhlLXBsYXRmb3JtLWZvci10aGUtaW1wb3J0LWJlbmNobWFyay0wMTIzNDU2Nzg5YWI="}', 'jwt');
SQL

SEP='?'; case "$DB" in *\?*) SEP='&';; esac
URL="$DB${SEP}options=-c%20search_path%3D$SCHEMA"

run() {
    echo "== $1"
    RUST_LOG=warn /usr/bin/time -v "$BIN" --config "$WORK/keygate.toml" import platform \
        --database-url "$URL" 2>"$WORK/time.txt" | sed 's/^/   /'
    grep -E "User time|System time|Elapsed \(wall clock\)|Maximum resident set size" "$WORK/time.txt" | sed 's/^\s*/   /'
}
run "first import (into an empty store)"
run "re-import (nothing changed)"
