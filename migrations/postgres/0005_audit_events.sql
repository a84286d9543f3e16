-- One row per change to users and API keys, written in the transaction of the
-- change itself: a change is never without its event, nor an event without
-- its change. Never a secret. Epoch ms; `seq` orders events as they were
-- written, also within one millisecond.
CREATE TABLE audit_events (
    seq          BIGSERIAL PRIMARY KEY,
    id           TEXT NOT NULL UNIQUE,
    created_time BIGINT NOT NULL,
    actor_id     TEXT NOT NULL,
    actor        TEXT NOT NULL,
    tenant_id    TEXT NOT NULL,
    action       TEXT NOT NULL,
    target_type  TEXT NOT NULL,
    target_id    TEXT NOT NULL
);
CREATE INDEX audit_events_time ON audit_events (created_time);
