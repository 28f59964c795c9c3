-- The statements store/database.py sends, by name: the store's own: whether the database
-- answers, writably. store/sql.py loads every store/*.sql (a name is used once in all of
-- them). Lock order, in every statement and function: as the top of schema.sql says.

-- name: ping
-- A standby (or a primary demoted by a failover) answers, but read-only.
SELECT current_setting('transaction_read_only') = 'on' AS read_only;
