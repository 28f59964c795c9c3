-- Acquire's SQL: the part of store/leases.py's that would make leases.sql too long to read
-- (an aggregate's SQL over 400 lines goes on in store/<aggregate>.<part>.sql). Lock order,
-- in every statement and function: as the top of schema.sql says.
--
-- Its function comes first: it is part of the schema (store/schema.py applies it after
-- schema.sql at start-up; CREATE OR REPLACE, so idempotently), and the statements below
-- call it.

-- -- functions --------------------------------------------------------------------------

-- A task taken by a device of the host: queued -> assigned, its attempt with its lease (the
-- id returned), and the event. The caller has locked the task and reserved the device.
CREATE OR REPLACE FUNCTION amc_assign(p_task uuid, p_attempt integer, p_host text,
                                      p_serial text, p_ttl interval)
RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    v_lease uuid := gen_random_uuid();
BEGIN
    UPDATE tasks tk SET status = 'assigned', attempt = p_attempt, host_id = p_host,
                        device_serial = p_serial, updated_at = now()
    WHERE tk.task_id = p_task;
    INSERT INTO attempts (task_id, attempt, lease_id, host_id, device_serial, state,
                          lease_expires_at)
    VALUES (p_task, p_attempt, v_lease, p_host, p_serial, 'active', now() + p_ttl);
    INSERT INTO task_events (task_id, attempt, kind, from_status, to_status, detail)
    VALUES (p_task, p_attempt, 'assign', 'queued', 'assigned', p_host || '/' || p_serial);
    RETURN v_lease;
END $$;

-- A task's deadline as its row has it now, not as the calling statement's snapshot has it:
-- amc_acquire's own queries see (and may assign) a task submitted after the Acquire's
-- statement began, whose snapshot does not have that task's row, so the statement read the
-- deadline as NULL and the host ran the task with none (tests/test_deadlines.py met it under
-- load). VOLATILE: each call reads with a snapshot of its own; STRICT: the rows of devices
-- left idle (no task) cost no query.
CREATE OR REPLACE FUNCTION amc_task_deadline(p_task uuid)
RETURNS interval
LANGUAGE sql VOLATILE STRICT AS $$
    SELECT tk.deadline FROM tasks tk WHERE tk.task_id = p_task
$$;

-- assign: queued -> assigned, for up to one task per idle device of the host; then the
-- host's devices still idle (labels set, task_id NULL), for the replica's index of parked
-- Acquires (control_plane/dispatch.py).
--
-- The idle devices are read without locks and grouped by labels. Per device group: the
-- queue groups it matches are found by anchor (queue_groups), and the first tasks of each
-- (tasks_dispatch) are merged in queue order (priority, fair tag, age), at most one per
-- device and a few more; each is then locked (SKIP LOCKED: a task another Acquire holds is
-- passed over, and only the tasks taken are locked), and reserves a device of the group
-- (its own serial if it names one) with an UPDATE whose conditions PostgreSQL rechecks on
-- the latest row version (another Acquire or a re-registration may have changed it; then
-- the next device left, serials ascending, so no device stays idle while the task for it
-- is held by an Acquire that lost its first device to another). A task passed over stays
-- queued; the devices left get another look (a few at most). An
-- Acquire that finds nothing writes nothing and locks nothing.
--
-- Fair shares' caps: a key with a cap (fair_shares.max_devices) is counted once per
-- Acquire, under a transaction-scoped advisory lock on the key (so two Acquires cannot
-- both take its last phone); a key at its cap has its groups left out. The locks of all
-- the capped keys the idle devices match are taken first, in one statement, in one order
-- for every Acquire (their lock ids ascending): taken device group by device group, two
-- Acquires whose groups meet two keys in opposite orders could each hold one and wait for
-- the other (a deadlock, broken only after deadlock_timeout). Then they are counted. With
-- no capped key at all, the caps cost one look at fair_shares.
--
-- A cordoned host gets nothing and has no idle devices (so its Acquire is indexed under
-- nothing, and no queued task wakes it); a cordoned device is never idle, nor is one whose
-- condition is not 'ready' (charging, too hot, ...: its host's probes say so). Uncordoning,
-- and a device turning ready, publish amc_freed for the host, and its parked Acquires look
-- again. The host row is
-- locked (FOR KEY SHARE) once there is a device to reserve, and cordoned is read again
-- then: a cordon, drain or removal that commits first leaves this Acquire nothing, and one
-- that comes later waits for it and counts its leases (issue 21.4).
--
-- Maintenance sessions come first: an operator's session marked so (tasks.maintenance)
-- takes the phone it names (its serial, on the host its host_id label names) when that
-- phone is offered, online, idle and ready, whatever cordons it or its host (a drained
-- host's agent still offers its idle phones, for these alone). One probe of the
-- tasks_maintenance index, empty but while such a session waits; no cap, no fair tag.
CREATE OR REPLACE FUNCTION amc_acquire(p_host text, p_serials text[], p_ttl interval)
RETURNS TABLE (task_id uuid, attempt integer, lease_id uuid, device_serial text, spec bytea,
               queued_seconds double precision, labels jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    g record;
    t record;
    v_free text[];
    v_serial text;
    v_again boolean;
    v_looks integer;
    v_cands uuid[];
    v_task uuid;
    v_asked integer;
    v_groups bigint[];
    v_keys text[];
    v_capped text[] := '{}';
    v_seen uuid[];
    v_blocked text[] := '{}';
    v_left jsonb := '{}';
    v_count integer;
    v_host_held boolean := false;
    v_cordoned boolean;
BEGIN
    FOR t IN
        SELECT tk.task_id, tk.attempt + 1 AS next_attempt, tk.spec, tk.updated_at,
               tk.selector_serial
        FROM tasks tk
        WHERE tk.status = 'queued' AND tk.maintenance
          AND tk.selector_serial = ANY (p_serials)
          AND tk.selector_labels ->> 'host_id' = p_host
        ORDER BY tk.created_at, tk.task_id
        FOR UPDATE SKIP LOCKED
    LOOP
        IF NOT v_host_held THEN
            PERFORM 1 FROM hosts h WHERE h.host_id = p_host FOR KEY SHARE;
            IF NOT FOUND THEN
                RETURN;
            END IF;
            v_host_held := true;
        END IF;
        UPDATE devices dv SET task_id = t.task_id, updated_at = now()
        WHERE dv.host_id = p_host AND dv.serial = t.selector_serial
          AND dv.state = 'device' AND dv.task_id IS NULL AND dv.condition = 'ready';
        CONTINUE WHEN NOT FOUND;
        task_id := t.task_id;
        attempt := t.next_attempt;
        device_serial := t.selector_serial;
        spec := t.spec;
        queued_seconds := extract(epoch FROM clock_timestamp() - t.updated_at);
        lease_id := amc_assign(t.task_id, t.next_attempt, p_host, t.selector_serial, p_ttl);
        RETURN NEXT;
    END LOOP;
    IF EXISTS (SELECT 1 FROM hosts h WHERE h.host_id = p_host AND h.cordoned) THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM fair_shares f WHERE f.max_devices IS NOT NULL) THEN
        -- The capped keys of the queue groups the idle devices match (as below), locked in
        -- lock-id order (the sort comes before the locks are taken: a volatile function in
        -- a sorted query's output is evaluated in the sorted order).
        SELECT COALESCE(array_agg(c.fairness_key), '{}') INTO v_capped
        FROM (
            SELECT f.fairness_key,
                   pg_advisory_xact_lock(hashtextextended('amc_fair_share:' || f.fairness_key, 0))
            FROM fair_shares f
            WHERE f.max_devices IS NOT NULL
              AND f.fairness_key IN (
                  SELECT q.fairness_key
                  FROM (SELECT dv.labels, array_agg(dv.serial) AS serials
                        FROM devices dv
                        WHERE dv.host_id = p_host AND dv.serial = ANY (p_serials)
                          AND dv.state = 'device' AND dv.task_id IS NULL AND NOT dv.cordoned
                          AND dv.condition = 'ready'
                        GROUP BY dv.labels) d
                  JOIN queue_groups q
                    ON q.anchor = ANY (amc_device_anchors(d.labels, d.serials))
                   AND d.labels @> q.selector_labels
                   AND (q.selector_serial = '' OR q.selector_serial = ANY (d.serials)))
            ORDER BY hashtextextended('amc_fair_share:' || f.fairness_key, 0), f.fairness_key
        ) c;
        -- How many more phones each may take, counted under the locks (a statement of its
        -- own: its snapshot comes after them).
        FOR t IN
            SELECT f.fairness_key, f.max_devices - (
                       SELECT count(*) FROM tasks tk
                       WHERE tk.fairness_key = f.fairness_key
                         AND tk.status IN ('assigned', 'dispatched')) AS left_over
            FROM fair_shares f
            WHERE f.fairness_key = ANY (v_capped) AND f.max_devices IS NOT NULL
        LOOP
            v_left := v_left || jsonb_build_object(t.fairness_key, t.left_over);
            IF t.left_over <= 0 THEN
                v_blocked := v_blocked || t.fairness_key;
            END IF;
        END LOOP;
    END IF;
    FOR g IN
        SELECT dv.labels, array_agg(dv.serial ORDER BY dv.serial) AS serials
        FROM devices dv
        WHERE dv.host_id = p_host AND dv.serial = ANY (p_serials)
          AND dv.state = 'device' AND dv.task_id IS NULL AND NOT dv.cordoned
          AND dv.condition = 'ready'
        GROUP BY dv.labels
    LOOP
        v_free := g.serials;
        SELECT COALESCE(array_agg(q.group_id ORDER BY q.group_id), '{}'),
               COALESCE(array_agg(q.fairness_key ORDER BY q.group_id), '{}')
        INTO v_groups, v_keys
        FROM queue_groups q
        WHERE q.anchor = ANY (amc_device_anchors(g.labels, v_free))
          AND g.labels @> q.selector_labels
          AND (q.selector_serial = '' OR q.selector_serial = ANY (v_free));
        CONTINUE WHEN cardinality(v_groups) = 0;
        v_seen := '{}';
        v_looks := 0;
        LOOP
            v_looks := v_looks + 1;
            -- The first tasks of the matching groups, merged in queue order, without locks.
            v_cands := ARRAY(
                SELECT h.task_id FROM unnest(v_groups, v_keys) AS q (group_id, fairness_key)
                CROSS JOIN LATERAL (
                    SELECT tk.task_id, tk.priority, tk.fair_tag, tk.created_at
                    FROM tasks tk
                    WHERE tk.group_id = q.group_id AND tk.status = 'queued'
                      AND tk.task_id <> ALL (v_seen)
                    ORDER BY tk.priority DESC, tk.fair_tag, tk.created_at, tk.task_id
                    LIMIT cardinality(v_free) + 2) h
                WHERE q.fairness_key <> ALL (v_blocked)
                ORDER BY h.priority DESC, h.fair_tag, h.created_at, h.task_id
                LIMIT cardinality(v_free) + 2);
            EXIT WHEN cardinality(v_cands) = 0;
            -- Then as many of them as there are devices, each locked by its key (SKIP
            -- LOCKED: one another Acquire holds is passed over), in queue order. Whether it
            -- is still queued, and its key still under its cap, is asked of the row once
            -- locked: a status in the statement lets the planner read the partial indexes of
            -- queued tasks whole (every queued task, for each Acquire) when statistics say
            -- nothing is queued, as they do until autoanalyze comes round after a burst.
            v_again := cardinality(v_cands) = cardinality(v_free) + 2;
            v_asked := LEAST(cardinality(v_cands), cardinality(v_free));
            v_count := 0;
            FOREACH v_task IN ARRAY v_cands LOOP
                EXIT WHEN v_count >= v_asked OR cardinality(v_free) = 0;
                SELECT tk.task_id, tk.attempt + 1 AS next_attempt, tk.spec, tk.updated_at,
                       tk.selector_labels, tk.selector_serial, tk.fairness_key, tk.status
                INTO t
                FROM tasks tk WHERE tk.task_id = v_task
                FOR UPDATE SKIP LOCKED;
                CONTINUE WHEN NOT FOUND;
                CONTINUE WHEN t.status <> 'queued' OR t.fairness_key = ANY (v_blocked);
                v_count := v_count + 1;
                v_seen := v_seen || t.task_id;
                v_serial := CASE WHEN t.selector_serial IS NULL THEN v_free[1]
                                 WHEN t.selector_serial = ANY (v_free) THEN t.selector_serial
                            END;
                IF v_serial IS NULL THEN
                    -- Its device got an earlier task of this look: it stays queued.
                    v_again := true;
                    CONTINUE;
                END IF;
                IF NOT v_host_held THEN
                    -- The host row, before the first device this Acquire reserves (see
                    -- the lock order): FOR KEY SHARE, so Acquires of the host (and its
                    -- registration and presence writes) share it, while cordon, drain and
                    -- remove (FOR UPDATE) come wholly before this Acquire or after it
                    -- commits. Cordoned or removed meanwhile: nothing for it.
                    SELECT h.cordoned INTO v_cordoned FROM hosts h
                    WHERE h.host_id = p_host
                    FOR KEY SHARE;
                    IF NOT FOUND OR v_cordoned THEN
                        RETURN;
                    END IF;
                    v_host_held := true;
                END IF;
                LOOP
                    v_free := array_remove(v_free, v_serial);
                    UPDATE devices dv SET task_id = t.task_id, updated_at = now()
                    WHERE dv.host_id = p_host AND dv.serial = v_serial
                      AND dv.state = 'device' AND dv.task_id IS NULL AND NOT dv.cordoned
                      AND dv.condition = 'ready'
                      AND dv.labels @> t.selector_labels;
                    EXIT WHEN FOUND;
                    -- Taken or changed meanwhile (so not this Acquire's any more): the
                    -- task, locked, tries the next device left (serials ascending, as
                    -- every Acquire reserves them), else stays queued. Leaving it queued
                    -- at once would leave a device idle while the tasks for it are held
                    -- by Acquires that lost their first device to one another.
                    v_serial := CASE WHEN t.selector_serial IS NULL THEN v_free[1] END;
                    EXIT WHEN v_serial IS NULL;
                END LOOP;
                IF v_serial IS NULL THEN
                    v_again := true;
                    CONTINUE;
                END IF;
                IF v_left ? t.fairness_key THEN
                    v_left := v_left || jsonb_build_object(
                        t.fairness_key, (v_left ->> t.fairness_key)::integer - 1);
                    IF (v_left ->> t.fairness_key)::integer <= 0 THEN
                        v_blocked := v_blocked || t.fairness_key;
                    END IF;
                END IF;
                task_id := t.task_id;
                attempt := t.next_attempt;
                device_serial := v_serial;
                spec := t.spec;
                queued_seconds := extract(epoch FROM clock_timestamp() - t.updated_at);
                lease_id := amc_assign(t.task_id, t.next_attempt, p_host, v_serial, p_ttl);
                RETURN NEXT;
            END LOOP;
            -- Fewer locked than asked: every candidate was looked at, and some were held by
            -- others or taken since the look; the next look goes past them all.
            IF v_count < v_asked THEN
                v_seen := v_seen || v_cands;
                v_again := true;
            END IF;
            -- Looks again (past the tasks seen) only while a task was passed over and
            -- devices are left; a few looks at most.
            EXIT WHEN NOT v_again OR cardinality(v_free) = 0 OR v_looks >= 4;
        END LOOP;
    END LOOP;
    RETURN QUERY SELECT NULL::uuid, NULL::integer, NULL::uuid, dv.serial, NULL::bytea,
                        NULL::double precision, dv.labels
                 FROM devices dv
                 WHERE dv.host_id = p_host AND dv.serial = ANY (p_serials)
                   AND dv.state = 'device' AND dv.task_id IS NULL AND NOT dv.cordoned
                   AND dv.condition = 'ready';
END $$;

-- -- statements ------------------------------------------------------------------------

-- name: acquire
-- Assignments (task_id set), then the devices left idle (labels set); each assignment with
-- its task's deadline (amc_task_deadline: a task submitted after this statement began may
-- be assigned, and this statement's snapshot does not have it).
SELECT a.*, amc_task_deadline(a.task_id) AS deadline
FROM amc_acquire($1, $2, $3) a;

-- name: acquire_offered
-- `acquire` for an Acquire woken by offers ($4: the offered tasks' ids): its rows (with
-- `queued` NULL), then one row per offered task that was queued when the statement began
-- (only `queued` set). An offered task that is not taken, fits a device left idle and was
-- queued was locked by another transaction when the scan passed it (SKIP LOCKED), not taken
-- by another host: the Acquire looks again soon instead of dropping the offer
-- (lease_service). A task whose fairness key is at its cap was passed over for that, not
-- for a lock: it is not listed (the offer is dropped; the key's queued tasks are offered
-- again when its cap is raised). Still one statement; the extra rows are primary-key
-- lookups (one per offered task, its status asked of the row: amc_acquire says why), and
-- a count of a capped key's running tasks (at most its cap).
SELECT a.*, amc_task_deadline(a.task_id) AS deadline,
       NULL::uuid AS queued
FROM amc_acquire($1, $2, $3) a
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, tk.task_id
FROM unnest($4::uuid[]) o (task_id)
CROSS JOIN LATERAL (SELECT t.task_id, t.status, t.fairness_key FROM tasks t
                    WHERE t.task_id = o.task_id LIMIT 1) tk
WHERE tk.status = 'queued'
  AND NOT EXISTS (
      SELECT 1 FROM fair_shares f
      WHERE f.fairness_key = tk.fairness_key AND f.max_devices IS NOT NULL
        AND f.max_devices <= (SELECT count(*) FROM tasks r
                              WHERE r.fairness_key = f.fairness_key
                                AND r.status IN ('assigned', 'dispatched')));
