-- The hash a user's password hash is a re-hash of (at login: the platform's
-- bcrypt hash replaced with Argon2id), kept across later re-hashes and
-- cleared by any password set (a change, a reset, an activation, the
-- import's). An import compares the platform's hash with what it imported
-- last, and tells keygate's re-hash of that hash from a password set in
-- keygate by this column.
ALTER TABLE users ADD COLUMN password_rehashed_from TEXT;
