-- The grants a key is limited to, as JSON text ([{"path": ..., "methods": [...]}]).
-- NULL: the key has its owner's full rights, as every key made before.
ALTER TABLE api_keys ADD COLUMN scopes TEXT;
-- The grants of a key created scoped, recorded with its creation.
ALTER TABLE audit_events ADD COLUMN scopes TEXT;
