-- The statements store/tokens.py sends, by name: API tokens. store/sql.py loads every
-- store/*.sql (a name is used once in all of them). Lock order, in every statement and
-- function: as the top of schema.sql says.

-- name: create_token
INSERT INTO tokens (token_id, name, role, host_id, secret_hash, team)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING *;

-- name: get_token
SELECT * FROM tokens WHERE token_id = $1;

-- name: revoke_token
-- Announced on amc_revoked (auth.REVOKED_CHANNEL) in the same transaction: every replica
-- drops the token from its cache, and only if the revocation commits.
WITH revoked AS (
    UPDATE tokens SET revoked_at = COALESCE(revoked_at, now()) WHERE token_id = $1
    RETURNING *
)
SELECT revoked.*, pg_notify('amc_revoked', revoked.token_id::text)::text AS notified
FROM revoked;

-- name: list_tokens
SELECT * FROM tokens ORDER BY created_at, token_id;
