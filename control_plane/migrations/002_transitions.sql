-- The transitions that must lock several rows in one transaction, as functions so that each
-- is one round trip. The transition table they implement is control_plane.lifecycle.
-- Lock order everywhere: the task row first, then its attempt, then devices.

-- New or requeued work wakes waiting Acquires.
CREATE FUNCTION amc_notify_queued() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('amc_queued', '');
    RETURN NULL;
END $$;
CREATE TRIGGER tasks_queued_insert AFTER INSERT ON tasks
    FOR EACH ROW WHEN (NEW.status = 'queued') EXECUTE FUNCTION amc_notify_queued();
CREATE TRIGGER tasks_queued_update AFTER UPDATE OF status ON tasks
    FOR EACH ROW WHEN (NEW.status = 'queued' AND OLD.status <> 'queued')
    EXECUTE FUNCTION amc_notify_queued();

-- assign: queued -> assigned, for up to one task per idle device of the host.
CREATE FUNCTION amc_acquire(p_host text, p_serials text[], p_ttl interval)
RETURNS TABLE (task_id uuid, attempt integer, lease_id uuid, device_serial text, spec bytea,
               queued_seconds double precision)
LANGUAGE plpgsql AS $$
DECLARE
    d record;
    t record;
BEGIN
    FOR d IN
        SELECT dv.serial, dv.labels FROM devices dv
        WHERE dv.host_id = p_host AND dv.serial = ANY (p_serials)
          AND dv.state = 'device' AND dv.task_id IS NULL
        ORDER BY dv.serial
        FOR UPDATE SKIP LOCKED
    LOOP
        SELECT tk.task_id, tk.attempt + 1 AS next_attempt, tk.spec, tk.updated_at INTO t
        FROM tasks tk
        WHERE tk.status = 'queued'
          AND (tk.selector_serial IS NULL OR tk.selector_serial = d.serial)
          AND d.labels @> tk.selector_labels
        ORDER BY tk.priority DESC, tk.created_at, tk.task_id
        LIMIT 1
        FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        task_id := t.task_id;
        attempt := t.next_attempt;
        lease_id := gen_random_uuid();
        device_serial := d.serial;
        spec := t.spec;
        queued_seconds := extract(epoch FROM clock_timestamp() - t.updated_at);
        UPDATE tasks tk SET status = 'assigned', attempt = t.next_attempt, host_id = p_host,
                            device_serial = d.serial, updated_at = now()
        WHERE tk.task_id = t.task_id;
        INSERT INTO attempts (task_id, attempt, lease_id, host_id, device_serial, state,
                              lease_expires_at)
        VALUES (t.task_id, t.next_attempt, lease_id, p_host, d.serial, 'active', now() + p_ttl);
        UPDATE devices dv SET task_id = t.task_id, updated_at = now()
        WHERE dv.host_id = p_host AND dv.serial = d.serial;
        INSERT INTO task_events (task_id, attempt, kind, from_status, to_status, detail)
        VALUES (t.task_id, t.next_attempt, 'assign', 'queued', 'assigned', p_host || '/' || d.serial);
        RETURN NEXT;
    END LOOP;
END $$;

-- cancel: queued -> cancelled at once; assigned/dispatched -> a durable request on the
-- current attempt (pushed to the host's stream); repeated -> no-op; done/failed -> refused.
-- code: cancelled | requested | unchanged | terminal | not_found
CREATE FUNCTION amc_cancel(p_task uuid, p_reason text)
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
        PERFORM pg_notify('amc_cancel', a.host_id || ' ' || a.lease_id || ' ' || p_task
                                        || ' ' || t.attempt || ' ' || extract(epoch FROM now()));
        v_code := 'requested';
    ELSIF t.status IN ('done', 'failed') THEN
        v_code := 'terminal';
    ELSE
        v_code := 'unchanged';
    END IF;
    RETURN QUERY SELECT v_code, tk FROM tasks tk WHERE tk.task_id = p_task;
END $$;

-- report: assigned/dispatched -> done | failed | cancelled, by the current attempt's live
-- lease only. code: recorded | repeated | different | stale | foreign | no_cancel
CREATE FUNCTION amc_report(p_host text, p_task uuid, p_attempt integer, p_lease uuid,
                           p_outcome text, p_result bytea, p_error text)
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
        v_code := 'recorded';
    END IF;
    RETURN QUERY SELECT v_code, tk, a.cancel_requested_at, a.cancel_delivered_at
                 FROM tasks tk WHERE tk.task_id = p_task;
END $$;

-- expire / release: assigned/dispatched -> cancelled (cancel pending) | queued (attempts
-- left) | failed; the attempt ends, the device is freed. With p_lease set, ends that one
-- lease now (the host gave it back), else sweeps up to p_limit expired leases. Safe to run
-- in every replica at once: rows another sweeper holds are skipped.
CREATE FUNCTION amc_expire(p_limit integer, p_lease uuid DEFAULT NULL, p_reason text DEFAULT '')
RETURNS TABLE (task_id uuid, attempt integer, lease_id uuid, host_id text, to_status text)
LANGUAGE plpgsql AS $$
DECLARE
    a record;
    t tasks;
    v_cancel timestamptz;
    v_state text := CASE WHEN p_lease IS NULL THEN 'expired' ELSE 'released' END;
BEGIN
    FOR a IN
        SELECT att.task_id, att.attempt, att.lease_id, att.host_id FROM attempts att
        WHERE att.state = 'active'
          AND (CASE WHEN p_lease IS NULL THEN att.lease_expires_at <= now()
                    ELSE att.lease_id = p_lease END)
        ORDER BY att.lease_expires_at
        LIMIT p_limit
    LOOP
        IF p_lease IS NULL THEN
            SELECT * INTO t FROM tasks tk WHERE tk.task_id = a.task_id FOR UPDATE SKIP LOCKED;
        ELSE
            SELECT * INTO t FROM tasks tk WHERE tk.task_id = a.task_id FOR UPDATE;
        END IF;
        CONTINUE WHEN NOT FOUND;
        UPDATE attempts att SET state = v_state, ended_at = now()
        WHERE att.lease_id = a.lease_id AND att.state = 'active'
          AND (p_lease IS NOT NULL OR att.lease_expires_at <= now())
        RETURNING att.cancel_requested_at INTO v_cancel;
        CONTINUE WHEN NOT FOUND;
        task_id := a.task_id;
        attempt := a.attempt;
        lease_id := a.lease_id;
        host_id := a.host_id;
        to_status := CASE WHEN v_cancel IS NOT NULL THEN 'cancelled'
                          WHEN t.attempt < t.max_attempts THEN 'queued'
                          ELSE 'failed' END;
        UPDATE tasks tk SET
            status = to_status,
            host_id = CASE WHEN to_status = 'queued' THEN NULL ELSE tk.host_id END,
            device_serial = CASE WHEN to_status = 'queued' THEN NULL ELSE tk.device_serial END,
            finished_at = CASE WHEN to_status = 'queued' THEN NULL ELSE now() END,
            error = CASE WHEN to_status = 'failed'
                         THEN 'lease ' || v_state || ' on attempt ' || a.attempt
                              || ' of ' || t.max_attempts
                         ELSE tk.error END,
            updated_at = now()
        WHERE tk.task_id = a.task_id;
        UPDATE devices dv SET task_id = NULL, updated_at = now() WHERE dv.task_id = a.task_id;
        INSERT INTO task_events (task_id, attempt, kind, from_status, to_status, detail)
        VALUES (a.task_id, a.attempt, v_state, t.status, to_status, p_reason);
        RETURN NEXT;
    END LOOP;
END $$;
