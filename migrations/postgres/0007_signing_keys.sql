-- The asymmetric keys that sign identity assertions to upstreams. One key is
-- current (current_slot = 1: the column is unique, so two replicas starting
-- at once on an empty table end with one); rotating retires it (current_slot
-- NULL, retired_time set; 0 while current) and it stays published until
-- every assertion it signed has expired. public_key is the raw public key (base64url);
-- private_key is its PKCS#8 document (base64), '' for a key that lives in a
-- file (assertion.signing_key_file). Epoch ms.
CREATE TABLE signing_keys (
    id           TEXT PRIMARY KEY,
    kid          TEXT NOT NULL UNIQUE,
    algorithm    TEXT NOT NULL,
    public_key   TEXT NOT NULL,
    private_key  TEXT NOT NULL,
    created_time BIGINT NOT NULL,
    retired_time BIGINT NOT NULL,
    current_slot INTEGER UNIQUE
);
