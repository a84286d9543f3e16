-- When each session last rotated its refresh token (or was created) and when it
-- ended (0 while live), epoch ms, so dead sessions can be pruned. Rows that
-- exist already get the time of this migration for both: their last rotation
-- is unknown, and no refresh token issued before now outlives now + its
-- lifetime, so none of them is pruned while it could still be in use.
ALTER TABLE sessions ADD COLUMN refreshed_time BIGINT NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN ended_time BIGINT NOT NULL DEFAULT 0;
UPDATE sessions SET refreshed_time = CAST(strftime('%s', 'now') AS INTEGER) * 1000;
UPDATE sessions SET ended_time = refreshed_time WHERE ended = 1;
CREATE INDEX sessions_ended_time ON sessions (ended, ended_time);
CREATE INDEX sessions_refreshed_time ON sessions (ended, refreshed_time);
CREATE INDEX activation_tokens_expires ON activation_tokens (expires_at);
