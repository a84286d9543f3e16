-- One-time activation tokens (digests only) for users created without a password.
CREATE TABLE activation_tokens (
    digest     TEXT PRIMARY KEY,
    user_id    TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    expires_at BIGINT NOT NULL
);
CREATE INDEX activation_tokens_user ON activation_tokens (user_id);
