-- What each user and API key imported from the platform looked like there when
-- it was last imported (JSON of the platform's values; secrets only as the
-- bcrypt hash keygate stores anyway or a SHA-256 digest). A re-import compares
-- the platform's current values with these, so it changes only what changed
-- on the platform's side since, and never undoes a change made in keygate.
CREATE TABLE platform_rows (
    kind          TEXT NOT NULL,
    id            TEXT NOT NULL,
    fields        TEXT NOT NULL,
    imported_time BIGINT NOT NULL,
    PRIMARY KEY (kind, id)
);
