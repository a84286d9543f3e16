-- Users, API keys (stored only as a digest), sessions and settings.
-- Flags are BIGINT 0/1 in both dialects, so one set of queries serves both.
CREATE TABLE users (
    id                 TEXT PRIMARY KEY,
    created_time       BIGINT NOT NULL,
    tenant_id          TEXT NOT NULL,
    customer_id        TEXT NOT NULL,
    email              TEXT NOT NULL UNIQUE,
    authority          TEXT NOT NULL,
    first_name         TEXT NOT NULL DEFAULT '',
    last_name          TEXT NOT NULL DEFAULT '',
    phone              TEXT NOT NULL DEFAULT '',
    additional_info    TEXT,
    version            BIGINT NOT NULL DEFAULT 1,
    enabled            BIGINT NOT NULL CHECK (enabled IN (0, 1)),
    password_hash      TEXT NOT NULL,
    tokens_valid_after BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX users_tenant ON users (tenant_id, customer_id);

CREATE TABLE api_keys (
    id              TEXT PRIMARY KEY,
    created_time    BIGINT NOT NULL,
    tenant_id       TEXT NOT NULL,
    user_id         TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    digest          TEXT NOT NULL UNIQUE,
    description     TEXT NOT NULL,
    enabled         BIGINT NOT NULL CHECK (enabled IN (0, 1)),
    expiration_time BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX api_keys_user ON api_keys (user_id, created_time);

CREATE TABLE sessions (
    id           TEXT PRIMARY KEY,
    user_id      TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    created_time BIGINT NOT NULL,
    ended        BIGINT NOT NULL DEFAULT 0 CHECK (ended IN (0, 1)),
    refresh_jti  TEXT NOT NULL DEFAULT ''
);
CREATE INDEX sessions_user ON sessions (user_id);

CREATE TABLE settings (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
