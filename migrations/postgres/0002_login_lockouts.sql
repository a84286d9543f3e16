-- Consecutive failed logins per user, and whether the account was locked by them.
CREATE TABLE login_lockouts (
    user_id  TEXT PRIMARY KEY REFERENCES users (id) ON DELETE CASCADE,
    failures BIGINT NOT NULL DEFAULT 0,
    locked   BIGINT NOT NULL DEFAULT 0 CHECK (locked IN (0, 1))
);
