-- Second factors of users: one row per configured provider. `secret` holds
-- a TOTP secret sealed with AES-256-GCM, or the JSON list of keyed digests of
-- the unused backup codes; never a secret in clear. `last_step` is the last
-- TOTP step accepted, so a code is accepted once.
CREATE TABLE two_factor (
    user_id        TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    provider       TEXT NOT NULL,
    use_by_default BIGINT NOT NULL DEFAULT 0 CHECK (use_by_default IN (0, 1)),
    secret         TEXT NOT NULL,
    last_step      BIGINT NOT NULL DEFAULT 0,
    created_time   BIGINT NOT NULL,
    PRIMARY KEY (user_id, provider)
);
