-- The statements store/retention.py sends, by name: retention: old tasks and forgotten
-- hosts, removed in batches. store/sql.py loads every store/*.sql (a name is used once in
-- all of them). Lock order, in every statement and function: as the top of schema.sql
-- says.
--
-- One batch per statement, so one short transaction. Only one replica at a time runs a
-- batch: each takes the retention advisory lock ("AMC", 1) for its transaction, and a
-- replica that does not get it removes nothing (it looks again at its next round). Rows
-- another transaction holds are skipped (SKIP LOCKED), so a batch never waits on them.

-- name: delete_old_tasks
-- Up to $2 terminal tasks that finished before now() - $1, oldest first, with their
-- attempts (and their steps), events and artifacts (their chunks follow by ON DELETE
-- CASCADE). Locks the tasks first, then what hangs off them (the lock order); no task in
-- flight is looked at.
WITH doomed AS (
    SELECT task_id FROM tasks
    WHERE status IN ('done', 'failed', 'cancelled') AND finished_at < now() - $1::interval
      AND (SELECT pg_try_advisory_xact_lock(4279619, 1))
    ORDER BY finished_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), events AS (
    DELETE FROM task_events e USING doomed d WHERE e.task_id = d.task_id RETURNING 1
), steps_gone AS (
    DELETE FROM attempt_steps s USING doomed d WHERE s.task_id = d.task_id
), attempts_gone AS (
    DELETE FROM attempts a USING doomed d WHERE a.task_id = d.task_id RETURNING 1
), artifacts_gone AS (
    DELETE FROM artifacts x USING doomed d WHERE x.task_id = d.task_id RETURNING 1
), tasks_gone AS (
    DELETE FROM tasks t USING doomed d WHERE t.task_id = d.task_id RETURNING 1
)
SELECT (SELECT count(*) FROM tasks_gone) AS tasks,
       (SELECT count(*) FROM attempts_gone) AS attempts,
       (SELECT count(*) FROM events) AS task_events,
       (SELECT count(*) FROM artifacts_gone) AS artifacts;

-- name: delete_old_cleaning_events
-- Up to $2 `cleaning` host events recorded before now() - $1, oldest first: a host writes a
-- few for every lease (its clean's steps), so they go with the tasks of their age. The other
-- kinds (an operator's operations, quarantines) are a host's history and stay.
WITH doomed AS (
    SELECT event_id FROM host_events
    WHERE kind = 'cleaning' AND at < now() - $1::interval
      AND (SELECT pg_try_advisory_xact_lock(4279619, 1))
    ORDER BY event_id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM host_events e USING doomed d WHERE e.event_id = d.event_id RETURNING 1
)
SELECT count(*) AS cleaning_events FROM gone;

-- name: forget_hosts
-- Up to $2 hosts last seen (as list_hosts decides it) before now() - $1 that hold no lease
-- and no device, each removed as RemoveHost would (amc_remove_host: with its devices,
-- recorded in host_events as done by "retention" because $3). A host that registers or
-- opens its stream meanwhile is skipped (its row is locked) or no longer matches
-- (PostgreSQL rechecks the locked row).
WITH due AS (
    SELECT h.host_id,
           (SELECT count(*) FROM devices d WHERE d.host_id = h.host_id) AS devices
    FROM hosts h LEFT JOIN replicas r USING (replica_id)
    WHERE GREATEST(h.last_seen_at, r.seen_at) < now() - $1::interval
      AND NOT EXISTS (SELECT 1 FROM attempts a
                      WHERE a.host_id = h.host_id AND a.state = 'active')
      AND NOT EXISTS (SELECT 1 FROM devices d
                      WHERE d.host_id = h.host_id AND d.task_id IS NOT NULL)
      AND (SELECT pg_try_advisory_xact_lock(4279619, 1))
    ORDER BY h.host_id
    LIMIT $2
    FOR UPDATE OF h SKIP LOCKED
), removed AS (
    SELECT due.devices, x.code
    FROM due CROSS JOIN LATERAL amc_remove_host(due.host_id, $1, 'retention',
                                                'control plane', $3) x
)
SELECT count(*) FILTER (WHERE code = 'removed') AS hosts,
       COALESCE(sum(devices) FILTER (WHERE code = 'removed'), 0)::bigint AS devices
FROM removed;
