-- The statements store/notifications.py sends, by name: LISTEN/NOTIFY: the listener's
-- heartbeat and the notifications sent. store/sql.py loads every store/*.sql (a name is
-- used once in all of them). Lock order, in every statement and function: as the top of
-- schema.sql says.

-- name: listener_check
-- The LISTEN connection's heartbeat: still listening on every channel, on a writable server.
SELECT array(SELECT pg_listening_channels()) AS channels,
       current_setting('transaction_read_only') = 'on' AS read_only;

-- name: notify
-- Notifications are not durable anyway: no need to wait for this commit's WAL flush.
SELECT set_config('synchronous_commit', 'off', true), count(pg_notify(n.c, n.p))
FROM unnest($1::text[], $2::text[]) AS n (c, p);
