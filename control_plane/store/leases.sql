-- The statements store/leases.py sends, by name: leases: Acquire, renewals, reports,
-- releases and the sweeps that end leases. store/sql.py loads every store/*.sql (a name is
-- used once in all of them). Lock order, in every statement and function: as the top of
-- schema.sql says.
--
-- Its functions come first: they are part of the schema (store/schema.py applies them
-- after schema.sql at start-up; CREATE OR REPLACE, so idempotently), and the
-- statements below call them.

-- -- functions --------------------------------------------------------------------------

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
-- the latest row version (another Acquire or a re-registration may have changed it). A
-- task passed over stays queued; the devices left get another look (a few at most). An
-- Acquire that finds nothing writes nothing and locks nothing.
--
-- Fair shares' caps: a key with a cap (fair_shares.max_devices) is counted once per
-- Acquire, under a transaction-scoped advisory lock on the key (so two Acquires cannot
-- both take its last phone); a key at its cap has its groups left out. Keys without a cap
-- cost nothing.
--
-- A cordoned host gets nothing and has no idle devices (so its Acquire is indexed under
-- nothing, and no queued task wakes it); a cordoned device is never idle, nor is one whose
-- condition is not 'ready' (charging, too hot, ...: its host's probes say so). Uncordoning,
-- and a device turning ready, publish amc_freed for the host, and its parked Acquires look
-- again. The host row is
-- locked (FOR KEY SHARE) once there is a device to reserve, and cordoned is read again
-- then: a cordon, drain or removal that commits first leaves this Acquire nothing, and one
-- that comes later waits for it and counts its leases (issue 21.4).
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
    v_asked integer;
    v_groups bigint[];
    v_keys text[];
    v_seen uuid[];
    v_blocked text[] := '{}';
    v_left jsonb := '{}';
    v_count integer;
    v_host_held boolean := false;
    v_cordoned boolean;
BEGIN
    IF EXISTS (SELECT 1 FROM hosts h WHERE h.host_id = p_host AND h.cordoned) THEN
        RETURN;
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
        -- Capped keys among them, in key order (the advisory locks' order): how many more
        -- phones each may take.
        FOR t IN
            SELECT f.fairness_key, f.max_devices FROM fair_shares f
            WHERE f.fairness_key = ANY (v_keys) AND f.max_devices IS NOT NULL
              AND NOT v_left ? f.fairness_key
            ORDER BY f.fairness_key
        LOOP
            PERFORM pg_advisory_xact_lock(hashtextextended('amc_fair_share:' || t.fairness_key, 0));
            SELECT count(*) INTO v_count
            FROM queue_groups q JOIN tasks tk ON tk.group_id = q.group_id
            WHERE q.fairness_key = t.fairness_key AND tk.status IN ('assigned', 'dispatched');
            v_left := v_left || jsonb_build_object(t.fairness_key, t.max_devices - v_count);
            IF t.max_devices - v_count <= 0 THEN
                v_blocked := v_blocked || t.fairness_key;
            END IF;
        END LOOP;
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
            -- Then as many of them as there are devices, locked in one statement (SKIP
            -- LOCKED: one another Acquire holds is passed over), in queue order.
            v_again := cardinality(v_cands) = cardinality(v_free) + 2;
            v_asked := LEAST(cardinality(v_cands), cardinality(v_free));
            v_count := 0;
            FOR t IN
                SELECT tk.task_id, tk.attempt + 1 AS next_attempt, tk.spec, tk.updated_at,
                       tk.selector_labels, tk.selector_serial, tk.fairness_key
                FROM tasks tk
                WHERE tk.task_id = ANY (v_cands) AND tk.status = 'queued'
                  AND tk.fairness_key <> ALL (v_blocked)
                ORDER BY tk.priority DESC, tk.fair_tag, tk.created_at, tk.task_id
                LIMIT cardinality(v_free)
                FOR UPDATE SKIP LOCKED
            LOOP
                v_count := v_count + 1;
                v_seen := v_seen || t.task_id;
                IF cardinality(v_free) = 0 OR t.fairness_key = ANY (v_blocked) THEN
                    -- No device left, or its key reached its cap in this Acquire.
                    v_again := true;
                    CONTINUE;
                END IF;
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
                v_free := array_remove(v_free, v_serial);
                UPDATE devices dv SET task_id = t.task_id, updated_at = now()
                WHERE dv.host_id = p_host AND dv.serial = v_serial
                  AND dv.state = 'device' AND dv.task_id IS NULL AND NOT dv.cordoned
                  AND dv.condition = 'ready'
                  AND dv.labels @> t.selector_labels;
                IF NOT FOUND THEN
                    -- Taken or changed meanwhile (so not this Acquire's any more): the
                    -- task stays queued.
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
                lease_id := gen_random_uuid();
                device_serial := v_serial;
                spec := t.spec;
                queued_seconds := extract(epoch FROM clock_timestamp() - t.updated_at);
                UPDATE tasks tk SET status = 'assigned', attempt = t.next_attempt,
                                    host_id = p_host, device_serial = v_serial,
                                    updated_at = now()
                WHERE tk.task_id = t.task_id;
                INSERT INTO attempts (task_id, attempt, lease_id, host_id, device_serial, state,
                                      lease_expires_at)
                VALUES (t.task_id, t.next_attempt, lease_id, p_host, v_serial, 'active',
                        now() + p_ttl);
                INSERT INTO task_events (task_id, attempt, kind, from_status, to_status, detail)
                VALUES (t.task_id, t.next_attempt, 'assign', 'queued', 'assigned',
                        p_host || '/' || v_serial);
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

-- Renews the host's live leases among p_leases; the first renewal acknowledges the
-- assignment (assigned -> dispatched). Leases not renewed come back with task_id NULL: a
-- conflict. Columns in the order of domain.Renewal's fields.
--
-- The lock order: the tasks of the leases first, in task_id order, FOR NO KEY UPDATE (what
-- the acknowledgement's UPDATE takes anyway: it excludes every other transition of the
-- task and lets foreign-key checks by), and only then their attempts. (A renewal that
-- changed the attempt rows alone, in whatever order the plan met them, deadlocked with a
-- batched report or the deadline sweep: issue 21.2.) A task that moved on while the
-- renewal waited for it is rechecked by PostgreSQL and not held, so its attempt is not
-- renewed; an attempt changed meanwhile (a cancel request) is renewed as it is now.
--
-- What is held goes from one statement to the next in arrays, each statement reaching its
-- rows through a key (= ANY of an array): no join whose plan rests on row estimates. (One
-- statement joining the attempts to the held tasks in a CTE, estimated at one row, was
-- planned as a rescan of the CTE per attempt when statistics were stale: quadratic in the
-- batch, 1 s for a host's 1,000 leases, renewals 122,200/s -> 11,000/s.)
-- With the renewal, the steps that ended ($4 leases, $5 indexes, $6 StepResult messages;
-- issue 27.8): kept for the leases it renews only, under their tasks' locks, so a step of a
-- stale attempt, or one that comes after the terminal report, is never kept; a step sent
-- twice is kept once.
CREATE OR REPLACE FUNCTION amc_renew(p_host text, p_leases uuid[], p_ttl interval,
                                     p_step_leases uuid[], p_step_indexes integer[],
                                     p_steps bytea[])
RETURNS TABLE (lease_id uuid, cancel_pending boolean, task_id uuid, attempt integer,
               delivery_seconds double precision, acknowledged boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_leases uuid[];
    v_acked uuid[];
    v_acked_tasks uuid[];
BEGIN
    SELECT COALESCE(array_agg(h.lease_id), '{}'),
           COALESCE(array_agg(h.lease_id) FILTER (WHERE h.status = 'assigned'), '{}'),
           COALESCE(array_agg(h.task_id) FILTER (WHERE h.status = 'assigned'), '{}')
    INTO v_leases, v_acked, v_acked_tasks
    FROM (
        SELECT tk.task_id, tk.status, att.lease_id FROM attempts att
        JOIN tasks tk ON tk.task_id = att.task_id AND tk.attempt = att.attempt
        WHERE att.lease_id = ANY (p_leases) AND att.host_id = p_host
          AND att.state = 'active' AND att.lease_expires_at > now()
          AND tk.status IN ('assigned', 'dispatched')
        ORDER BY tk.task_id
        FOR NO KEY UPDATE OF tk
    ) h;

    IF cardinality(p_steps) > 0 THEN
        INSERT INTO attempt_steps (task_id, attempt, step_index, step)
        SELECT att.task_id, att.attempt, st.step_index, st.step
        FROM unnest(p_step_leases, p_step_indexes, p_steps) st (lease_id, step_index, step)
        JOIN attempts att ON att.lease_id = st.lease_id
        WHERE st.lease_id = ANY (v_leases)
        ON CONFLICT DO NOTHING;
    END IF;

    IF cardinality(v_acked_tasks) > 0 THEN
        WITH acked AS (
            UPDATE tasks tk SET status = 'dispatched', updated_at = now()
            WHERE tk.task_id = ANY (v_acked_tasks) AND tk.status = 'assigned'
            RETURNING tk.task_id, tk.attempt
        )
        INSERT INTO task_events (task_id, attempt, kind, from_status, to_status)
        SELECT a.task_id, a.attempt, 'acknowledge', 'assigned', 'dispatched' FROM acked a;
    END IF;

    RETURN QUERY
    WITH renewed AS (
        -- Only the attempts of tasks held (their leases, found by lease_id: the host was
        -- checked above and an attempt's host never changes).
        UPDATE attempts a SET
            lease_expires_at = now() + p_ttl,
            acknowledged_at = COALESCE(a.acknowledged_at, now()),
            -- The run starts now: its deadline counts from here (one probe, and only for
            -- an acknowledgement).
            deadline_at = CASE WHEN a.acknowledged_at IS NULL
                               THEN (SELECT now() + tk.deadline FROM tasks tk
                                     WHERE tk.task_id = a.task_id)
                               ELSE a.deadline_at END,
            cancel_delivered_at = COALESCE(a.cancel_delivered_at,
                                           CASE WHEN a.cancel_requested_at IS NOT NULL
                                                THEN now() END)
        WHERE a.lease_id = ANY (v_leases) AND a.state = 'active'
          AND a.lease_expires_at > now()
        RETURNING a.lease_id, a.task_id, a.attempt,
                  a.cancel_requested_at IS NOT NULL AS cancel_pending,
                  CASE WHEN a.cancel_delivered_at = now()
                       THEN extract(epoch FROM now() - a.cancel_requested_at)::float8 END
                       AS delivery_seconds
    )
    SELECT req.lease_id, COALESCE(r.cancel_pending, false), r.task_id, r.attempt,
           r.delivery_seconds, r.lease_id IS NOT NULL AND ack.lease_id IS NOT NULL
    FROM (SELECT DISTINCT unnest(p_leases) AS lease_id) req
    LEFT JOIN renewed r USING (lease_id)
    LEFT JOIN unnest(v_acked) ack (lease_id) USING (lease_id);
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
-- lease only, from its own host (p_host NULL: auth is off, any caller).
-- code: recorded | repeated | different | stale | foreign | no_cancel
CREATE OR REPLACE FUNCTION amc_report(p_host text, p_task uuid, p_attempt integer,
                                      p_lease uuid, p_outcome text, p_result bytea,
                                      p_error text)
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
        UPDATE devices dv SET task_id = NULL, updated_at = now() WHERE dv.task_id = p_task;
        INSERT INTO task_events (task_id, attempt, kind, from_status, to_status, detail)
        VALUES (p_task, p_attempt, 'report', t.status, p_outcome, p_error);
        PERFORM amc_offer_capped(t.fairness_key);
        v_code := 'recorded';
    END IF;
    RETURN QUERY SELECT v_code, tk, a.cancel_requested_at, a.cancel_delivered_at
                 FROM tasks tk WHERE tk.task_id = p_task;
END $$;

-- expired / released / device_lost, the task's side: it leaves the attempt whose lease
-- ended without a report, to cancelled (a cancel was pending: never requeued), queued
-- (attempts left) or failed, and its device is freed. The caller holds the task row (t, as
-- locked) and has ended the attempt; p_how is the event. Attempts that ended device_lost
-- are not the task's: they count against p_infra_budget instead of max_attempts, and once
-- that is spent the task fails. Returns the status.
CREATE OR REPLACE FUNCTION amc_leave_attempt(t tasks, p_cancel_pending boolean, p_how text,
                                             p_reason text, p_infra_budget integer DEFAULT 0)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_lost boolean := p_how = 'device_lost';
    v_to text := CASE WHEN p_cancel_pending THEN 'cancelled'
                      WHEN v_lost AND t.infra_retries < p_infra_budget THEN 'queued'
                      WHEN v_lost THEN 'failed'
                      WHEN t.attempt - t.infra_retries < t.max_attempts THEN 'queued'
                      ELSE 'failed' END;
BEGIN
    UPDATE tasks tk SET
        status = v_to,
        host_id = CASE WHEN v_to = 'queued' THEN NULL ELSE tk.host_id END,
        device_serial = CASE WHEN v_to = 'queued' THEN NULL ELSE tk.device_serial END,
        finished_at = CASE WHEN v_to = 'queued' THEN NULL ELSE now() END,
        -- Back in the queue: a new stay, with the whole queue timeout again, and at the
        -- head of its key's turn (it had started once already).
        queue_deadline = CASE WHEN v_to = 'queued' THEN now() + tk.queue_timeout
                              ELSE tk.queue_deadline END,
        fair_tag = CASE WHEN v_to = 'queued'
                        THEN LEAST(tk.fair_tag, amc_fair_frontier(tk.priority))
                        ELSE tk.fair_tag END,
        error = CASE WHEN v_to = 'failed' AND v_lost
                     THEN 'device lost on attempt ' || t.attempt || ' (' || p_reason
                          || '); infrastructure retries spent (' || t.infra_retries
                          || ' of ' || p_infra_budget || ')'
                     WHEN v_to = 'failed'
                     THEN 'lease ' || p_how || ' on attempt ' || (t.attempt - t.infra_retries)
                          || ' of ' || t.max_attempts
                     ELSE tk.error END,
        infra_retries = tk.infra_retries + CASE WHEN v_lost AND v_to = 'queued' THEN 1
                                                ELSE 0 END,
        updated_at = now()
    WHERE tk.task_id = t.task_id;
    UPDATE devices dv SET task_id = NULL, updated_at = now() WHERE dv.task_id = t.task_id;
    INSERT INTO task_events (task_id, attempt, kind, from_status, to_status, detail)
    VALUES (t.task_id, t.attempt, p_how, t.status, v_to, p_reason);
    PERFORM amc_offer_capped(t.fairness_key);
    RETURN v_to;
END $$;

-- expire: up to p_limit leases that ran out (the oldest) end (amc_leave_attempt), with
-- each task's selector so that a requeued task is offered to the hosts that can take it.
-- Their tasks are locked first, in task_id order, then each one's attempt (the lock
-- order). Safe to run in every replica at once: tasks another sweeper (or a transition)
-- holds are skipped, and a lease renewed meanwhile is left alone.
CREATE OR REPLACE FUNCTION amc_expire(p_limit integer)
RETURNS TABLE (task_id uuid, attempt integer, lease_id uuid, host_id text, to_status text,
               selector_serial text, selector_labels jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    a record;
    t tasks;
    v_cancel timestamptz;
BEGIN
    FOR a IN
        SELECT due.task_id, due.attempt, due.lease_id, due.host_id
        FROM (SELECT att.task_id, att.attempt, att.lease_id, att.host_id FROM attempts att
              WHERE att.state = 'active' AND att.lease_expires_at <= now()
              ORDER BY att.lease_expires_at
              LIMIT p_limit) due
        JOIN tasks tk ON tk.task_id = due.task_id AND tk.attempt = due.attempt
        ORDER BY tk.task_id
        FOR UPDATE OF tk SKIP LOCKED
    LOOP
        SELECT * INTO t FROM tasks tk WHERE tk.task_id = a.task_id;  -- held
        UPDATE attempts att SET state = 'expired', ended_at = now()
        WHERE att.lease_id = a.lease_id AND att.state = 'active'
          AND att.lease_expires_at <= now()
        RETURNING att.cancel_requested_at INTO v_cancel;
        CONTINUE WHEN NOT FOUND;
        task_id := a.task_id;
        attempt := a.attempt;
        lease_id := a.lease_id;
        host_id := a.host_id;
        to_status := amc_leave_attempt(t, v_cancel IS NOT NULL, 'expired', '');
        selector_serial := t.selector_serial;
        selector_labels := t.selector_labels;
        RETURN NEXT;
    END LOOP;
END $$;

-- release: the host gives a lease back (it drains, or cannot run the task): it ends at
-- once, as an expiry would (amc_leave_attempt). Only by the lease's own host (p_host NULL:
-- auth is off, any caller).
-- code: released | ended (its attempt had ended already: nothing to do) | foreign (no
-- such lease for this host)
CREATE OR REPLACE FUNCTION amc_release(p_host text, p_lease uuid, p_reason text)
RETURNS TABLE (code text, task_id uuid, attempt integer, lease_id uuid, host_id text,
               to_status text, selector_serial text, selector_labels jsonb)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM amc_give_back(p_host, p_lease, 'released', p_reason, 0);
END $$;

-- A lease given back (amc_release, or p_how 'device_lost': its phone was lost mid-run,
-- the attempt ends released and the task is requeued within p_budget infrastructure
-- retries, see amc_leave_attempt). The attempt is read, then its task locked, then the
-- attempt ended (the lock order). Codes as amc_release's.
CREATE OR REPLACE FUNCTION amc_give_back(p_host text, p_lease uuid, p_how text,
                                         p_reason text, p_budget integer)
RETURNS TABLE (code text, task_id uuid, attempt integer, lease_id uuid, host_id text,
               to_status text, selector_serial text, selector_labels jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    a attempts;
    t tasks;
    v_cancel timestamptz;
BEGIN
    SELECT * INTO a FROM attempts att WHERE att.lease_id = p_lease;
    IF NOT FOUND OR (p_host IS NOT NULL AND a.host_id <> p_host) THEN
        code := 'foreign';
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT * INTO t FROM tasks tk WHERE tk.task_id = a.task_id FOR UPDATE;
    UPDATE attempts att SET state = 'released', ended_at = now()
    WHERE att.lease_id = p_lease AND att.state = 'active'
    RETURNING att.cancel_requested_at INTO v_cancel;
    IF NOT FOUND THEN
        code := 'ended';
        RETURN NEXT;
        RETURN;
    END IF;
    code := 'released';
    task_id := a.task_id;
    attempt := a.attempt;
    lease_id := a.lease_id;
    host_id := a.host_id;
    to_status := amc_leave_attempt(t, v_cancel IS NOT NULL, p_how, p_reason, p_budget);
    selector_serial := t.selector_serial;
    selector_labels := t.selector_labels;
    RETURN NEXT;
END $$;

-- -- statements ------------------------------------------------------------------------

-- name: acquire
-- Assignments (task_id set), then the devices left idle (labels set); each assignment with
-- its task's deadline (fixed at submit, so the statement's snapshot has it).
SELECT a.*, (SELECT tk.deadline FROM tasks tk WHERE tk.task_id = a.task_id) AS deadline
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
-- lookups, and a count of a capped key's running tasks (at most its cap).
SELECT a.*, (SELECT tk.deadline FROM tasks tk WHERE tk.task_id = a.task_id) AS deadline,
       NULL::uuid AS queued
FROM amc_acquire($1, $2, $3) a
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, tk.task_id
FROM tasks tk
WHERE tk.task_id = ANY ($4::uuid[]) AND tk.status = 'queued'
  AND NOT EXISTS (
      SELECT 1 FROM fair_shares f
      WHERE f.fairness_key = tk.fairness_key AND f.max_devices IS NOT NULL
        AND f.max_devices <= (SELECT count(*) FROM queue_groups q
                              JOIN tasks r ON r.group_id = q.group_id
                              WHERE q.fairness_key = f.fairness_key
                                AND r.status IN ('assigned', 'dispatched')));

-- name: renew_leases
-- Renews the host's live leases among $2 (first renewal = acknowledgement); conflicts come
-- back with task_id NULL. Columns in the order of domain.Renewal's fields.
-- With it, the steps that ended ($4-$6: lease, index, StepResult; kept for the leases
-- renewed only, see amc_renew).
-- An acknowledgement also answers how long the task waited: from entering the queue (its
-- last event to `queued`) to now (pickup_seconds; one index probe, acknowledgements only).
SELECT r.*,
       CASE WHEN r.acknowledged THEN
           (SELECT extract(epoch FROM now() - e.at)::float8 FROM task_events e
            WHERE e.task_id = r.task_id::uuid AND e.to_status = 'queued'
            ORDER BY e.event_id DESC LIMIT 1)
       END AS pickup_seconds
FROM amc_renew($1, $2::uuid[], $3, $4::uuid[], $5::integer[], $6::bytea[]) r;

-- name: report_results
-- One result or several, in one transaction: each as amc_report() alone would take it, in
-- task_id order (the lock order); `ord` says which result a row answers. A task that does
-- not exist comes back with code NULL.
-- att_started_at: when the attempt was acknowledged (or assigned), for the run-time metric;
-- read from the statement's snapshot, so as it was before the report.
SELECT r.ord, x.code, (x.task).*, x.att_cancel_requested_at, x.att_cancel_delivered_at,
       (SELECT COALESCE(a.acknowledged_at, a.created_at) FROM attempts a
        WHERE a.task_id = r.task_id AND a.attempt = r.attempt) AS att_started_at
FROM (SELECT * FROM unnest($2::uuid[], $3::integer[], $4::uuid[], $5::text[], $6::bytea[],
                           $7::text[])
          WITH ORDINALITY AS u (task_id, attempt, lease_id, outcome, result, error, ord)
      ORDER BY u.task_id, u.ord) r
LEFT JOIN LATERAL amc_report($1, r.task_id, r.attempt, r.lease_id, r.outcome, r.result,
                             r.error) x ON true;

-- name: mark_cancel_delivered
UPDATE attempts SET cancel_delivered_at = COALESCE(cancel_delivered_at, now())
WHERE lease_id = $1;

-- name: release_lease
-- The host ($1; NULL: any) gives the lease back. With the task's selector: a requeued task
-- is offered to the hosts that can take it.
SELECT * FROM amc_release($1, $2, $3);

-- name: device_lost
-- The host ($1; NULL: any) gives the lease back because its phone was lost mid-run ($3:
-- what it saw): requeued within $4 infrastructure retries (amc_leave_attempt). As
-- release_lease otherwise.
SELECT * FROM amc_give_back($1, $2, 'device_lost', $3, $4);

-- name: expire_leases
SELECT * FROM amc_expire($1);

-- name: end_overrun
-- deadline exceeded, from the control plane's side: up to $1 live attempts whose run
-- overran the task's deadline by more than $2 (the lease TTL: the host had that long to
-- stop and report) end in one statement, found by the attempts_deadline index. The attempt
-- is ended as `expired` (its lease ends now: the host's renewals are conflicts and its late
-- report is refused as stale), the task fails "deadline exceeded" (cancelled if a cancel
-- was pending: a cancel that came first wins), never requeued, and its device is freed.
-- Tasks another transition or sweeper holds are skipped (lock order: task, then attempt).
WITH due AS (
    SELECT att.task_id, att.attempt FROM attempts att
    WHERE att.state = 'active' AND att.deadline_at <= now() - $2::interval
    ORDER BY att.deadline_at
    LIMIT $1
), locked AS (
    SELECT tk.task_id, tk.attempt, tk.status FROM tasks tk JOIN due USING (task_id)
    WHERE tk.attempt = due.attempt AND tk.status IN ('assigned', 'dispatched')
    ORDER BY tk.task_id
    FOR UPDATE OF tk SKIP LOCKED
), att AS (
    UPDATE attempts a SET state = 'expired', ended_at = now(),
                          lease_expires_at = LEAST(a.lease_expires_at, now())
    FROM locked l
    WHERE a.task_id = l.task_id AND a.attempt = l.attempt AND a.state = 'active'
      AND a.deadline_at <= now() - $2::interval
    RETURNING a.task_id, a.attempt, a.lease_id, a.host_id, a.cancel_requested_at, l.status
), ended AS (
    UPDATE tasks tk SET
        status = CASE WHEN att.cancel_requested_at IS NULL THEN 'failed' ELSE 'cancelled' END,
        error = CASE WHEN att.cancel_requested_at IS NULL THEN 'deadline exceeded'
                     ELSE tk.error END,
        finished_at = now(), updated_at = now()
    FROM att
    WHERE tk.task_id = att.task_id AND tk.attempt = att.attempt
    RETURNING tk.task_id, tk.attempt, att.lease_id, att.host_id, tk.status AS to_status,
              att.status AS from_status, tk.deadline, tk.selector_serial, tk.selector_labels
), freed AS (
    UPDATE devices dv SET task_id = NULL, updated_at = now()
    FROM ended e WHERE dv.task_id = e.task_id
), ev AS (
    INSERT INTO task_events (task_id, attempt, kind, from_status, to_status, detail)
    SELECT e.task_id, e.attempt, 'deadline_exceeded', e.from_status, e.to_status,
           'ran past its deadline of ' || e.deadline || ' and did not report; lease ended'
    FROM ended e
)
SELECT task_id, attempt, lease_id, host_id, to_status, selector_serial, selector_labels
FROM ended;
