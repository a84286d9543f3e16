-- One-time password reset tokens (digests only), sent by mail to active users.
CREATE TABLE reset_tokens (
    digest     TEXT PRIMARY KEY,
    user_id    TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    expires_at BIGINT NOT NULL
);
CREATE INDEX reset_tokens_user ON reset_tokens (user_id);
