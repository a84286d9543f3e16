-- Single sign-on states whose callback was taken (SHA-256 digests only), each
-- kept until its sign-in's cookie expires: a saved cookie presented again,
-- with a fresh code for the same state, is refused on every replica. Pruned
-- once expired.
CREATE TABLE sso_used_states (
    digest     TEXT PRIMARY KEY,
    expires_at BIGINT NOT NULL
);
CREATE INDEX sso_used_states_expires ON sso_used_states (expires_at);
