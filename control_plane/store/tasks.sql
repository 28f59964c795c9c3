-- The statements store/tasks.py sends, by name: tasks and their transitions (submit,
-- cancel, the queue-timeout sweep) and reads. store/sql.py loads every store/*.sql (a name
-- is used once in all of them). Lock order, in every statement and function: as the top of
-- schema.sql says.
--
-- Its functions come first: they are part of the schema (store/schema.py applies them
-- after schema.sql at start-up; CREATE OR REPLACE, so idempotently), and the
-- statements below call them.

-- -- functions --------------------------------------------------------------------------

-- cancel: queued -> cancelled at once; assigned/dispatched -> a durable request on the
-- current attempt (pushed to the host's stream by the notification the control plane sends
-- after the commit; the host's next renewal answers it too); repeated -> no-op;
-- done/failed -> refused.
-- code: cancelled | requested | unchanged | terminal | not_found
CREATE OR REPLACE FUNCTION amc_cancel(p_task uuid, p_reason text)
RETURNS TABLE (code text, task tasks)
LANGUAGE plpgsql AS $$
DECLARE
    t tasks;
    a record;
    v_code text;
BEGIN
    SELECT * INTO t FROM tasks tk WHERE tk.task_id = p_task FOR UPDATE;
    IF NOT FOUND THEN
        code := 'not_found';
        RETURN NEXT;
        RETURN;
    END IF;
    IF t.status = 'queued' THEN
        UPDATE tasks tk SET status = 'cancelled', cancel_requested_at = now(),
                            cancel_reason = p_reason, finished_at = now(), updated_at = now()
        WHERE tk.task_id = p_task;
        INSERT INTO task_events (task_id, attempt, kind, from_status, to_status, detail)
        VALUES (p_task, t.attempt, 'cancel', 'queued', 'cancelled', p_reason);
        v_code := 'cancelled';
    ELSIF t.status IN ('assigned', 'dispatched') AND t.cancel_requested_at IS NULL THEN
        UPDATE tasks tk SET cancel_requested_at = now(), cancel_reason = p_reason,
                            updated_at = now()
        WHERE tk.task_id = p_task;
        UPDATE attempts att SET cancel_requested_at = now()
        WHERE att.task_id = p_task AND att.attempt = t.attempt
        RETURNING att.host_id, att.lease_id INTO a;
        INSERT INTO task_events (task_id, attempt, kind, from_status, to_status, detail)
        VALUES (p_task, t.attempt, 'cancel_requested', t.status, t.status, p_reason);
        v_code := 'requested';
    ELSIF t.status IN ('done', 'failed') THEN
        v_code := 'terminal';
    ELSE
        v_code := 'unchanged';
    END IF;
    RETURN QUERY SELECT v_code, tk FROM tasks tk WHERE tk.task_id = p_task;
END $$;

-- -- statements ------------------------------------------------------------------------

-- name: submit_tasks
-- submit: - -> queued, for one task or a batch; returns the rows created (not those whose
-- (caller, request_id) exists already). Tasks of one batch get created_at a microsecond
-- apart, so equal priorities run in batch order. Each task goes into the queue group of
-- its selector and fairness key ($12; '' for the default) with its fair tag: the key's
-- base at its priority (amc_fair_base) plus 1/weight per task of the batch. A session's
-- ($13 set: the replica holding its client's call) is marked one (tasks.session), and an
-- operator's maintenance session ($14) so. Each row's caller ($1) and caller's token's
-- name ($15) are its own: a group commit writes several callers' tasks in one statement.
WITH req AS (
    SELECT r.*, COALESCE(NULLIF(r.key, ''), 'default') AS fairness_key
    FROM unnest($1::text[], $2::uuid[], $3::text[], $4::bytea[], $5::text[], $6::jsonb[],
                $7::integer[], $8::integer[], $9::jsonb[], $10::interval[],
                $11::interval[], $12::text[], $14::boolean[], $15::text[])
        WITH ORDINALITY AS r (caller, task_id, request_id, spec, selector_serial,
                              selector_labels, priority, max_attempts, metadata,
                              queue_timeout, deadline, key, maintenance, caller_name, ord)
), grp AS (
    SELECT d.*, amc_queue_group(d.serial, d.selector_labels, d.fairness_key) AS group_id
    FROM (SELECT DISTINCT COALESCE(selector_serial, '') AS serial, selector_labels,
                          fairness_key
          FROM req) d
), base AS (
    SELECT k.fairness_key, k.priority, amc_fair_base(k.fairness_key, k.priority) AS base,
           COALESCE((SELECT f.weight FROM fair_shares f
                     WHERE f.fairness_key = k.fairness_key), 1) AS weight
    FROM (SELECT DISTINCT fairness_key, priority FROM req) k
), ins AS (
    INSERT INTO tasks (task_id, caller, caller_name, request_id, status, spec, selector_serial,
                       selector_labels, priority, max_attempts, metadata, created_at, updated_at,
                       queue_timeout, deadline, queue_deadline, group_id, fairness_key,
                       fair_tag, session, maintenance)
    SELECT r.task_id, r.caller, r.caller_name, r.request_id, 'queued', r.spec, r.selector_serial,
           r.selector_labels,
           r.priority, r.max_attempts, r.metadata,
           now() + (r.ord - 1) * interval '1 microsecond', now(),
           r.queue_timeout, r.deadline, now() + r.queue_timeout, g.group_id, r.fairness_key,
           b.base + (row_number() OVER (PARTITION BY r.fairness_key, r.priority ORDER BY r.ord))
                    / b.weight::double precision,
           $13::text IS NOT NULL, r.maintenance
    FROM req r
    JOIN grp g ON g.serial = COALESCE(r.selector_serial, '')
               AND g.selector_labels = r.selector_labels AND g.fairness_key = r.fairness_key
    JOIN base b ON b.fairness_key = r.fairness_key AND b.priority = r.priority
    ORDER BY r.ord
    ON CONFLICT (caller, request_id) DO NOTHING
    RETURNING *
), ev AS (
    INSERT INTO task_events (task_id, attempt, kind, to_status)
    SELECT task_id, 0, 'submit', 'queued' FROM ins
), relay AS (
    -- A session's ($13: the replica holding its client's call; NULL for other tasks).
    INSERT INTO session_relays (task_id, replica_id)
    SELECT task_id, $13::text FROM ins WHERE $13::text IS NOT NULL
)
SELECT * FROM ins;

-- name: tasks_by_request
-- The tasks of (caller $1[i], request id $2[i]) pairs, each by a probe of the key's
-- unique index (a LATERAL ... LIMIT 1 a pair: no join whose plan rests on row estimates).
SELECT tk.* FROM unnest($1::text[], $2::text[]) AS r (caller, request_id)
CROSS JOIN LATERAL (SELECT * FROM tasks t
                    WHERE t.caller = r.caller AND t.request_id = r.request_id LIMIT 1) tk;

-- name: open_sessions
-- The caller's sessions queued or running (tasks_open_sessions).
SELECT count(*) FROM tasks
WHERE caller = $1 AND session AND status IN ('queued', 'assigned', 'dispatched');

-- name: get_task
SELECT * FROM tasks WHERE task_id = $1;

-- name: task_history
-- A task's attempts (all: at most max_attempts) and one page of its events after event $2,
-- in one round trip; `found` is false when there is no such task.
SELECT EXISTS (SELECT 1 FROM tasks WHERE task_id = $1) AS found,
       (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                   'attempt', a.attempt, 'host_id', a.host_id,
                   'device_serial', a.device_serial, 'lease_id', a.lease_id,
                   'state', a.state, 'created_at', a.created_at,
                   'acknowledged_at', a.acknowledged_at,
                   'ended_at', COALESCE(a.ended_at, a.reported_at),
                   'cancel_requested_at', a.cancel_requested_at) ORDER BY a.attempt), '[]')
        FROM attempts a WHERE a.task_id = $1) AS attempts,
       (SELECT COALESCE(jsonb_agg(to_jsonb(e) ORDER BY e.event_id), '[]')
        FROM (SELECT event_id, attempt, kind, from_status, to_status, detail, at
              FROM task_events WHERE task_id = $1 AND event_id > $2
              ORDER BY event_id LIMIT $3) e) AS events;

-- name: list_tasks
-- Newest first, keyset-paged on (created_at, task_id).
-- $6: selector labels the task's must contain; $7: a LIKE pattern (escaped) for the id's
-- start, or anywhere in the request id or metadata.
SELECT * FROM tasks
WHERE (cardinality($1::text[]) = 0 OR status = ANY ($1))
  AND ($2::text IS NULL OR host_id = $2)
  AND ($3::timestamptz IS NULL OR (created_at, task_id) < ($3, $4::uuid))
  AND selector_labels @> $6::jsonb
  AND ($7::text = '' OR task_id::text LIKE $7 || '%' OR request_id ILIKE '%' || $7 || '%'
       OR metadata::text ILIKE '%' || $7 || '%')
ORDER BY created_at DESC, task_id DESC
LIMIT $5;

-- name: cancel_task
-- A cancel; a requested one (the task in flight) with its attempt's lease (by the key of
-- attempts) and when, for the notification the control plane sends after the commit: a
-- NOTIFY in the transaction would hold the notification queue's lock through the WAL flush,
-- one cancel after another.
SELECT c.code, (c.task).*,
       CASE WHEN c.code = 'requested' THEN
           (SELECT a.lease_id FROM attempts a
            WHERE a.task_id = (c.task).task_id AND a.attempt = (c.task).attempt)
       END AS cancel_lease,
       extract(epoch FROM now())::float8 AS cancel_epoch
FROM amc_cancel($1, $2) c;

-- name: read_tasks
-- Tasks $1 as one snapshot sees them (issue 27: read apart, a phone that took a task after
-- the task was read was counted busy with it). Each running one (assigned, dispatched) with
-- its current attempt's progress: when it was acknowledged and the steps its host reported
-- as they ended (p_*; NULL once the task ends: its result is the record). Each queued one
-- with what its pending reason is made of: the devices its selector matches, matching as
-- amc_acquire does, counted by what keeps each from the task (m_devices: a map, use ->
-- devices, of amc_device_use, with hosts connected within $2: what GetQueue's counts are
-- made of too); and its fairness key's cap with the tasks running under it, counted as
-- amc_acquire counts them (cap_*; NULL: no cap). One scan of the devices per distinct
-- selector of the queued tasks; none when $3 is false (the queued ones then unexplained).
WITH tk AS MATERIALIZED (
    SELECT * FROM tasks WHERE task_id = ANY ($1::uuid[])
), sel AS (
    SELECT DISTINCT selector_serial, selector_labels FROM tk WHERE status = 'queued' AND $3
), m AS (
    SELECT sel.selector_serial, sel.selector_labels,
           (SELECT COALESCE(jsonb_object_agg(u.use, u.n), '{}')
            FROM (SELECT amc_device_use(h.draining, h.cordoned, d.cordoned, d.state,
                                        GREATEST(h.last_seen_at, r.seen_at), $2::interval,
                                        d.condition, d.task_id) AS use,
                         count(*) AS n
                  FROM devices d JOIN hosts h USING (host_id)
                  LEFT JOIN replicas r USING (replica_id)
                  WHERE d.labels @> sel.selector_labels
                    AND (sel.selector_serial IS NULL OR d.serial = sel.selector_serial)
                  GROUP BY 1) u) AS devices
    FROM sel
), cap AS (
    SELECT f.fairness_key, f.max_devices,
           (SELECT count(*) FROM tasks t
            WHERE t.fairness_key = f.fairness_key AND t.status IN ('assigned', 'dispatched'))
               AS running
    FROM fair_shares f
    WHERE f.max_devices IS NOT NULL AND $3
      AND f.fairness_key IN (SELECT fairness_key FROM tk WHERE status = 'queued')
)
SELECT tk.*, m.devices AS m_devices,
       cap.max_devices AS cap_max_devices, cap.running AS cap_running,
       CASE WHEN tk.status IN ('assigned', 'dispatched') THEN
           (SELECT a.acknowledged_at FROM attempts a
            WHERE a.task_id = tk.task_id AND a.attempt = tk.attempt) END AS p_acknowledged_at,
       CASE WHEN tk.status IN ('assigned', 'dispatched') THEN
           ARRAY(SELECT s.step FROM attempt_steps s
                 WHERE s.task_id = tk.task_id AND s.attempt = tk.attempt
                 ORDER BY s.step_index) END AS p_steps
FROM tk
LEFT JOIN m ON tk.status = 'queued' AND m.selector_labels = tk.selector_labels
           AND m.selector_serial IS NOT DISTINCT FROM tk.selector_serial
LEFT JOIN cap ON tk.status = 'queued' AND cap.fairness_key = tk.fairness_key;

-- name: time_out_queued
-- queue timeout: queued -> failed, for up to $1 tasks whose stay in the queue ran out (the
-- longest overdue; the tasks_queue_deadline index finds them), in one statement, locked in
-- task_id order (the lock order). Safe in every replica at once: a task another sweeper,
-- an Acquire or a cancel holds is skipped, and the UPDATE rechecks that it is still queued
-- and due. A cancel that came first left it `cancelled`: untouched.
WITH due AS (
    SELECT tk.task_id FROM tasks tk
    WHERE tk.status = 'queued' AND tk.queue_deadline <= now()
    ORDER BY tk.queue_deadline
    LIMIT $1
), held AS (
    SELECT tk.task_id FROM tasks tk JOIN due USING (task_id)
    WHERE tk.status = 'queued' AND tk.queue_deadline <= now()
    ORDER BY tk.task_id
    FOR UPDATE OF tk SKIP LOCKED
), ended AS (
    UPDATE tasks tk SET status = 'failed', error = 'queue timeout', finished_at = now(),
                        updated_at = now()
    FROM held
    WHERE tk.task_id = held.task_id AND tk.status = 'queued' AND tk.queue_deadline <= now()
    RETURNING tk.*
), ev AS (
    INSERT INTO task_events (task_id, attempt, kind, from_status, to_status, detail)
    SELECT e.task_id, e.attempt, 'queue_timeout', 'queued', 'failed',
           'queued longer than ' || e.queue_timeout
    FROM ended e
)
SELECT * FROM ended;
