-- The platform's customers marked public (`customer.is_public`), as the last
-- `keygate import platform` found them: their id is the `publicId` of
-- `POST /api/auth/login/public`, and their tenant goes into the public
-- user's tokens. keygate keeps no other customers.
CREATE TABLE public_customers (
    customer_id   TEXT PRIMARY KEY,
    tenant_id     TEXT NOT NULL,
    imported_time BIGINT NOT NULL
);
