-- The statements store/leases.py sends, by name: leases: renewals and reports (Acquire's
-- SQL is in leases.acquire.sql, how leases end in leases.end.sql). store/sql.py loads every store/*.sql (a name is
-- used once in all of them). Lock order, in every statement and function: as the top of
-- schema.sql says.
--
-- Its functions come first: they are part of the schema (store/schema.py applies them
-- after schema.sql at start-up; CREATE OR REPLACE, so idempotently), and the
-- statements below call them.

-- -- functions --------------------------------------------------------------------------

-- Renews each lease of p_leases that is live and its host's, p_hosts[i] (several hosts'
-- renewals in one statement: a replica groups those arriving together); the first renewal
-- acknowledges the assignment (assigned -> dispatched). A row per lease renewed, in the
-- order of domain.Renewal's fields, then the host; a lease asked about and not renewed is a
-- conflict (another host's lease asked by this one too).
--
-- The lock order: the tasks of the leases first, in task_id order, FOR NO KEY UPDATE (what
-- the acknowledgement's UPDATE takes anyway: it excludes every other transition of the
-- task and lets foreign-key checks by), and only then their attempts. (A renewal that
-- changed the attempt rows alone, in whatever order the plan met them, deadlocked with a
-- batched report or the deadline sweep.) A task that moved on while the renewal waited
-- for it (reported, expired, requeued) is seen as it is now and not held, so its attempt is
-- not renewed; an attempt changed meanwhile (a cancel request) is renewed as it is now.
--
-- Every row is reached by its key alone, one index probe per key (a LATERAL ... LIMIT 1 per
-- lease and per task, then = ANY of the held leases), and what a row must be (the host's,
-- active, not expired, running) is asked of the row once read: a state or status in a
-- statement's WHERE lets the planner read a partial index (attempts_by_host,
-- tasks_running, tasks_running_tags) whole when statistics say it is empty, and they say
-- so until autoanalyze comes round after a burst of work (every running task read once
-- per lease renewed: 0.9 s for a host's 1,000 leases, renewals 116,000/s -> 13,000/s).
-- Nor is there a join whose plan rests on row estimates. (One statement joining the
-- attempts to the held tasks in a CTE, estimated at one row, was planned as a rescan of
-- the CTE per attempt: quadratic in the batch.) tests/test_query_plans.py holds each
-- statement to its keys, whatever the statistics say.
-- The steps a renewal carries are not written here: the replica keeps those of the leases
-- renewed and writes them in bulk (keep_steps, control_plane/progress.py).
CREATE OR REPLACE FUNCTION amc_renew(p_hosts text[], p_leases uuid[], p_ttl interval)
RETURNS TABLE (lease_id uuid, cancel_pending boolean, task_id uuid, attempt integer,
               delivery_seconds double precision, acknowledged boolean, host_id text)
LANGUAGE plpgsql
-- One plan per statement, made once per connection and kept: a generic plan takes an array
-- for ten keys, so it probes by key; a plan made for the call (a custom plan) knows a
-- host's 1,000 leases and scans the whole attempts table instead while it is small. (No
-- planning per call either.)
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_tasks uuid[];
    v_attempts integer[];
    v_live uuid[];
    v_leases uuid[];
    v_acked uuid[];
    v_acked_tasks uuid[];
BEGIN
    -- The live attempts among the leases, each its asking host's (no lock), in task_id
    -- order: the hosts' tasks together, so one lock order for the whole group.
    SELECT COALESCE(array_agg(a.task_id ORDER BY a.task_id), '{}'),
           COALESCE(array_agg(a.attempt ORDER BY a.task_id), '{}'),
           COALESCE(array_agg(a.lease_id ORDER BY a.task_id), '{}')
    INTO v_tasks, v_attempts, v_live
    FROM (SELECT DISTINCT x.h, x.l FROM unnest(p_hosts, p_leases) x (h, l)) l (host_id, lease_id)
    CROSS JOIN LATERAL (
        SELECT att.task_id, att.attempt, att.lease_id,
               att.host_id = l.host_id AND att.state = 'active'
               AND att.lease_expires_at > now() AS live
        FROM attempts att WHERE att.lease_id = l.lease_id
        LIMIT 1) a
    WHERE a.live;

    -- Their tasks, locked one by one in that order; held: still on that attempt, running.
    SELECT COALESCE(array_agg(h.lease_id), '{}'),
           COALESCE(array_agg(h.lease_id) FILTER (WHERE tk.status = 'assigned'), '{}'),
           COALESCE(array_agg(h.task_id) FILTER (WHERE tk.status = 'assigned'), '{}')
    INTO v_leases, v_acked, v_acked_tasks
    FROM unnest(v_tasks, v_attempts, v_live) h (task_id, attempt, lease_id)
    CROSS JOIN LATERAL (
        SELECT t.status, t.attempt FROM tasks t WHERE t.task_id = h.task_id
        LIMIT 1
        FOR NO KEY UPDATE) tk
    WHERE tk.attempt = h.attempt AND tk.status IN ('assigned', 'dispatched');

    -- The acknowledgements: tasks held and seen assigned, so assigned still.
    IF cardinality(v_acked_tasks) > 0 THEN
        WITH acked AS (
            UPDATE tasks tk SET status = 'dispatched', updated_at = now()
            WHERE tk.task_id = ANY (v_acked_tasks)
            RETURNING tk.task_id, tk.attempt
        )
        INSERT INTO task_events (task_id, attempt, kind, from_status, to_status)
        SELECT a.task_id, a.attempt, 'acknowledge', 'assigned', 'dispatched' FROM acked a;
    END IF;

    -- The attempts of the tasks held: active and unexpired when read, and held since (every
    -- change of an attempt's state holds its task first).
    RETURN QUERY
    WITH renewed AS (
        UPDATE attempts a SET
            lease_expires_at = now() + p_ttl,
            acknowledged_at = COALESCE(a.acknowledged_at, now()),
            -- The run starts now: its deadline counts from here (one probe, and only for an
            -- acknowledgement).
            deadline_at = CASE WHEN a.acknowledged_at IS NULL
                               THEN (SELECT now() + tk.deadline FROM tasks tk
                                     WHERE tk.task_id = a.task_id)
                               ELSE a.deadline_at END,
            cancel_delivered_at = COALESCE(a.cancel_delivered_at,
                                           CASE WHEN a.cancel_requested_at IS NOT NULL
                                                THEN now() END)
        WHERE a.lease_id = ANY (v_leases)
        RETURNING a.lease_id, a.cancel_requested_at IS NOT NULL AS cancel_pending, a.task_id,
                  a.attempt, CASE WHEN a.cancel_delivered_at = now()
                                  THEN extract(epoch FROM now() - a.cancel_requested_at)::float8
                             END AS delivery_seconds,
                  a.lease_id = ANY (v_acked) AS acknowledged, a.host_id
    )
    SELECT r.* FROM renewed r;
END $$;

-- A replica's bulk write of step progress (keep_steps below says which steps are kept):
-- the tasks with a step kept, once each. A plain INSERT of the steps not kept yet, each
-- probed by its key first: an INSERT ... ON CONFLICT inserts speculatively, a third WAL
-- record per row besides the heap's and the index's. A step may still be kept meanwhile
-- by another transaction (two replicas writing the step a host sent again after moving
-- its stream): the write is then made again with ON CONFLICT DO NOTHING (one
-- subtransaction per bulk write, not per step).
CREATE OR REPLACE FUNCTION amc_keep_steps(p_tasks uuid[], p_attempts integer[],
                                          p_indexes integer[], p_steps bytea[])
RETURNS TABLE (task_id uuid)
LANGUAGE plpgsql AS $$
DECLARE
    v_kept uuid[];
BEGIN
    -- Progress is not the record: its commit does not wait for the WAL flush.
    PERFORM set_config('synchronous_commit', 'off', true);
    BEGIN
        WITH kept AS (
            INSERT INTO attempt_steps (task_id, attempt, step_index, step)
            SELECT st.task_id, st.attempt, st.step_index, st.step
            FROM unnest(p_tasks, p_attempts, p_indexes, p_steps)
                st (task_id, attempt, step_index, step)
            CROSS JOIN LATERAL (
                SELECT t.status, t.attempt FROM tasks t WHERE t.task_id = st.task_id
                LIMIT 1) tk
            LEFT JOIN LATERAL (
                SELECT true AS found FROM attempt_steps s
                WHERE s.task_id = st.task_id AND s.attempt = st.attempt
                  AND s.step_index = st.step_index
                LIMIT 1) k ON true
            WHERE tk.attempt = st.attempt AND tk.status IN ('assigned', 'dispatched')
              AND k.found IS NULL
            RETURNING attempt_steps.task_id
        )
        SELECT COALESCE(array_agg(DISTINCT kept.task_id), '{}') INTO v_kept FROM kept;
    EXCEPTION WHEN unique_violation THEN
        WITH kept AS (
            INSERT INTO attempt_steps (task_id, attempt, step_index, step)
            SELECT st.task_id, st.attempt, st.step_index, st.step
            FROM unnest(p_tasks, p_attempts, p_indexes, p_steps)
                st (task_id, attempt, step_index, step)
            CROSS JOIN LATERAL (
                SELECT t.status, t.attempt FROM tasks t WHERE t.task_id = st.task_id
                LIMIT 1) tk
            WHERE tk.attempt = st.attempt AND tk.status IN ('assigned', 'dispatched')
            ON CONFLICT DO NOTHING
            RETURNING attempt_steps.task_id
        )
        SELECT COALESCE(array_agg(DISTINCT kept.task_id), '{}') INTO v_kept FROM kept;
    END;
    RETURN QUERY SELECT unnest(v_kept);
END $$;

-- A phone freed from a task of key p_key: a key with a cap (fair_shares.max_devices) may be
-- under it again, so its first queued task is offered to the parked Acquires of every
-- replica, by a notification like a submit's (an Acquire that cannot use the offer skips
-- it). Without this only the host that freed the phone would look, and a held task for
-- another rack would wait for a parked host's periodic re-poll. Nothing for a key without
-- a cap: its tasks are never held back by one. Called by amc_report and amc_leave_attempt.
CREATE OR REPLACE FUNCTION amc_offer_capped(p_key text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    h record;
    v_payload text;
BEGIN
    IF p_key IS NULL OR NOT EXISTS (SELECT 1 FROM fair_shares f
                                    WHERE f.fairness_key = p_key
                                      AND f.max_devices IS NOT NULL) THEN
        RETURN;
    END IF;
    SELECT x.task_id, NULLIF(q.selector_serial, '') AS serial, q.selector_labels AS labels
    INTO h
    FROM queue_groups q CROSS JOIN LATERAL (
        SELECT tk.task_id, tk.priority, tk.fair_tag, tk.created_at FROM tasks tk
        WHERE tk.group_id = q.group_id AND tk.status = 'queued'
        ORDER BY tk.priority DESC, tk.fair_tag, tk.created_at, tk.task_id
        LIMIT 1
    ) x
    WHERE q.fairness_key = p_key
    ORDER BY x.priority DESC, x.fair_tag, x.created_at, x.task_id
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- dispatch.Offer's payload; from no replica (''), so every replica offers it; labels
    -- left out (null: any device may match) where they would not fit a notification.
    v_payload := json_build_object('r', '', 't', h.task_id, 's', h.serial,
                                   'l', h.labels)::text;
    IF octet_length(v_payload) > 7000 THEN
        v_payload := json_build_object('r', '', 't', h.task_id, 's', h.serial,
                                       'l', NULL)::text;
    END IF;
    PERFORM pg_notify('amc_queued', v_payload);
END $$;

-- report: assigned/dispatched -> done | failed | cancelled, by the current attempt's live
-- lease only, from its own host (p_host NULL: auth is off, any caller). p_cleans: the host
-- cleans the phone before it takes work again, so the device freed is 'cleaning' (with
-- the result, never idle and ready in between) until its host reports it again.
-- code: recorded | repeated | different | stale | foreign | no_cancel
CREATE OR REPLACE FUNCTION amc_report(p_host text, p_task uuid, p_attempt integer,
                                      p_lease uuid, p_outcome text, p_result bytea,
                                      p_error text, p_cleans boolean DEFAULT false)
RETURNS TABLE (code text, task tasks, att_cancel_requested_at timestamptz,
               att_cancel_delivered_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    t tasks;
    a attempts;
    v_code text;
BEGIN
    SELECT * INTO t FROM tasks tk WHERE tk.task_id = p_task FOR UPDATE;
    SELECT * INTO a FROM attempts att WHERE att.lease_id = p_lease FOR UPDATE;
    IF t.task_id IS NULL OR a.task_id IS NULL OR a.task_id <> p_task
       OR a.attempt <> p_attempt OR (p_host IS NOT NULL AND a.host_id <> p_host) THEN
        v_code := 'foreign';
    ELSIF a.state IN ('done', 'failed', 'cancelled') THEN
        v_code := CASE WHEN a.outcome = p_outcome THEN 'repeated' ELSE 'different' END;
    ELSIF a.state <> 'active' OR a.lease_expires_at <= now() OR t.attempt <> a.attempt
          OR t.status NOT IN ('assigned', 'dispatched') THEN
        v_code := 'stale';
    ELSIF p_outcome = 'cancelled' AND a.cancel_requested_at IS NULL THEN
        v_code := 'no_cancel';
    ELSE
        UPDATE tasks tk SET status = p_outcome, result = p_result, error = p_error,
                            finished_at = now(), updated_at = now()
        WHERE tk.task_id = p_task;
        UPDATE attempts att SET state = p_outcome, outcome = p_outcome, reported_at = now(),
                               ended_at = now()
        WHERE att.lease_id = p_lease;
        -- One row version for the report: freed, and cleaning when its host cleans it.
        UPDATE devices dv SET task_id = NULL, updated_at = now(),
            condition = CASE WHEN p_cleans THEN 'cleaning' ELSE dv.condition END,
            condition_reason = CASE WHEN p_cleans THEN 'after task ' || p_task
                                    ELSE dv.condition_reason END
        WHERE dv.task_id = p_task;
        INSERT INTO task_events (task_id, attempt, kind, from_status, to_status, detail)
        VALUES (p_task, p_attempt, 'report', t.status, p_outcome, p_error);
        PERFORM amc_offer_capped(t.fairness_key);
        v_code := 'recorded';
    END IF;
    RETURN QUERY SELECT v_code, tk, a.cancel_requested_at, a.cancel_delivered_at
                 FROM tasks tk WHERE tk.task_id = p_task;
END $$;

-- A device whose lease ended on a host that cleans it between leases: 'cleaning' after
-- task p_task, until the host reports its condition (ReportDeviceHealth: ready once the
-- clean passed). The condition is still only ever what the host said: it asked for this
-- with the lease's end (ReportResultRequest.cleans, ReleaseLeaseRequest.cleans). A give-back
-- (amc_give_back) calls it; amc_report does the same in the UPDATE that frees the device.
CREATE OR REPLACE FUNCTION amc_cleaning(p_host text, p_serial text, p_task uuid)
RETURNS void
LANGUAGE sql AS $$
    UPDATE devices dv SET condition = 'cleaning', condition_reason = 'after task ' || p_task
    WHERE dv.host_id = p_host AND dv.serial = p_serial
$$;

-- -- statements ------------------------------------------------------------------------

-- name: renew_leases
-- Renews the live leases among $2 each of its host $1[i] (first renewal =
-- acknowledgement): one host's renewal, or several hosts' grouped. A row per lease renewed,
-- columns in the order of domain.Renewal's fields, then the lease's host.
-- An acknowledgement also answers how long the task waited: from entering the queue (its
-- last event to `queued`) to now (pickup_seconds; one index probe, acknowledgements only).
SELECT r.lease_id, r.cancel_pending, r.task_id, r.attempt, r.delivery_seconds, r.acknowledged,
       CASE WHEN r.acknowledged THEN
           (SELECT extract(epoch FROM now() - e.at)::float8 FROM task_events e
            WHERE e.task_id = r.task_id::uuid AND e.to_status = 'queued'
            ORDER BY e.event_id DESC LIMIT 1)
       END AS pickup_seconds,
       r.host_id
FROM amc_renew($1::text[], $2::uuid[], $3) r;

-- name: keep_steps
-- A replica's bulk write of step progress (control_plane/progress.py): the steps of running
-- attempts its renewal streams were sent since its last write ($1 tasks, $2 attempts,
-- $3 indexes, $4 StepResult messages; a step sent twice is kept once). Each is kept only if
-- its attempt is its task's current one and the task runs, as this statement reads them:
-- its lease was renewed when it came, and a step of a task that ended since (its report
-- came first) is not kept. Reached by key (a probe of tasks and of attempt_steps per
-- step: amc_keep_steps). No lock is taken: a report committing meanwhile may leave a step
-- beside its ended task, which nothing shows (a task's steps are read only while it runs)
-- and retention deletes with it. Progress is not the record: the commit does not wait for
-- its WAL flush. The tasks with a step kept, once each (their watchers are told).
SELECT k.task_id FROM amc_keep_steps($1::uuid[], $2::integer[], $3::integer[], $4::bytea[]) k;

-- name: report_results
-- One result or several, in one transaction: each as amc_report() alone would take it, in
-- task_id order (the lock order); `ord` says which result a row answers. A task that does
-- not exist comes back with code NULL.
-- att_started_at: when the attempt was acknowledged (or assigned), for the run-time metric;
-- read from the statement's snapshot, so as it was before the report. $8: per result, its
-- host cleans the phone next (amc_report's p_cleans).
-- $9..$16: the small files the results carry (control_plane/report_files.py), each with
-- the `ord` of its result: kept as artifacts (one chunk each) of the results recorded
-- here, none of a result refused or repeated. Its task's row is held already (FOR UPDATE,
-- by amc_report), so no lock is taken out of order.
-- The results' tasks are held first (task_id order), then the devices they hold (serial
-- order), and only then reported: a report frees each task's device, and one that took
-- task a, a's device, task b, b's device deadlocked with a host's health report taking the
-- same devices in another order (set_device_health), 1 s (deadlock_timeout) for every
-- phone of the host.
WITH held AS MATERIALIZED (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM tasks tk WHERE tk.task_id = ANY ($2::uuid[])
        ORDER BY tk.task_id FOR UPDATE
    ) t
), held_devices AS MATERIALIZED (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM devices dv CROSS JOIN held
        WHERE dv.task_id = ANY ($2::uuid[])
        ORDER BY dv.host_id, dv.serial FOR UPDATE OF dv
    ) d
), r AS MATERIALIZED (
    SELECT r.ord, x.code, (x.task).*, x.att_cancel_requested_at, x.att_cancel_delivered_at,
           (SELECT COALESCE(a.acknowledged_at, a.created_at) FROM attempts a
            WHERE a.task_id = r.task_id AND a.attempt = r.attempt) AS att_started_at
    FROM (SELECT u.* FROM unnest($2::uuid[], $3::integer[], $4::uuid[], $5::text[],
                                 $6::bytea[], $7::text[], $8::boolean[])
              WITH ORDINALITY AS u (task_id, attempt, lease_id, outcome, result, error,
                                    cleans, ord)
          CROSS JOIN held_devices
          ORDER BY u.task_id, u.ord) r
    LEFT JOIN LATERAL amc_report($1, r.task_id, r.attempt, r.lease_id, r.outcome, r.result,
                                 r.error, r.cleans) x ON true
), kept AS (
    SELECT k.*, r.task_id, r.attempt
    FROM unnest($9::bigint[], $10::uuid[], $11::integer[], $12::integer[], $13::text[],
                $14::text[], $15::bytea[], $16::bytea[])
             AS k (ord, artifact_id, step_index, action_index, step_name, kind, sha256, data)
    JOIN r ON r.ord = k.ord AND r.code = 'recorded'
), stored AS (
    INSERT INTO artifacts (artifact_id, task_id, attempt, step_index, action_index,
                           step_name, kind, size_bytes, sha256)
    SELECT artifact_id, task_id, attempt, step_index, action_index, step_name, kind,
           octet_length(data), sha256
    FROM kept
    ON CONFLICT (task_id, attempt, step_index, action_index) DO NOTHING
    RETURNING artifact_id
), chunks AS (
    INSERT INTO artifact_chunks (artifact_id, seq, data)
    SELECT k.artifact_id, 0, k.data FROM kept k JOIN stored s USING (artifact_id)
    WHERE octet_length(k.data) > 0
)
SELECT * FROM r;

-- name: mark_cancel_delivered
UPDATE attempts SET cancel_delivered_at = COALESCE(cancel_delivered_at, now())
WHERE lease_id = $1;
