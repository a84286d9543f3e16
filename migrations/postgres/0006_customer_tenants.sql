-- Which tenant each customer id belongs to. keygate keeps no customers of its
-- own: the first user created with a customer id binds that id to the user's
-- tenant, and a user of another tenant is never created with it. Existing users
-- bind each customer id to the tenant of its earliest user.
CREATE TABLE customer_tenants (
    customer_id  TEXT PRIMARY KEY,
    tenant_id    TEXT NOT NULL,
    created_time BIGINT NOT NULL
);
INSERT INTO customer_tenants (customer_id, tenant_id, created_time)
SELECT u.customer_id, u.tenant_id, u.created_time
FROM users u
WHERE u.customer_id <> '13814000-1dd2-11b2-8080-808080808080'
  AND NOT EXISTS (
    SELECT 1 FROM users e
    WHERE e.customer_id = u.customer_id
      AND (e.created_time < u.created_time
           OR (e.created_time = u.created_time AND e.id < u.id))
  );
