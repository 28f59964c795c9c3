-- The hot path, from what `make bench` profiled (docs/performance.md).

-- 1. NOTIFY out of the durable transactions. A transaction that NOTIFYs takes a
-- database-wide lock at commit and holds it through its WAL flush, so notifying commits
-- cannot share an fsync: these per-row triggers capped every transition at one flush per
-- commit. The control plane now publishes after its commits (Hub.publish: acts locally at
-- once, then tells the other replicas in one batched, non-durable statement). amc_cancel()
-- keeps its in-transaction NOTIFY: cancellations are rare and must reach every replica.
DROP TRIGGER tasks_notify ON tasks;
DROP TRIGGER tasks_queued_insert ON tasks;
DROP TRIGGER tasks_queued_update ON tasks;
DROP FUNCTION amc_notify_task();
DROP FUNCTION amc_notify_queued();

-- 2. Renewals as HOT updates. attempts_live indexed lease_expires_at, which every renewal
-- rewrites, so no renewal could be HOT (a new entry in every index of attempts per
-- renewal). The sweep finds live attempts through attempts_by_host (same predicate), and
-- half-empty pages leave room for the new row versions.
DROP INDEX attempts_live;
ALTER TABLE attempts SET (fillfactor = 50);

-- 3. Acquire locks only what it assigns. It used to lock every idle device of the host
-- first (FOR UPDATE SKIP LOCKED) and then probe the queue once per device: an Acquire that
-- found nothing still wrote (row locks are WAL records) and waited for a flush, and one that
-- found one task among seven idle devices locked seven rows and probed seven times. Now:
-- devices are read without locks, and only where matching work is queued; the task is taken
-- first (SKIP LOCKED), then its device is reserved with an UPDATE whose conditions are
-- rechecked against the latest row version (another Acquire or a re-registration may have
-- changed it); a label set that found nothing is not probed again in the same call. Lock
-- order is task -> device, as in every other transition.
CREATE OR REPLACE FUNCTION amc_acquire(p_host text, p_serials text[], p_ttl interval)
RETURNS TABLE (task_id uuid, attempt integer, lease_id uuid, device_serial text, spec bytea,
               queued_seconds double precision)
LANGUAGE plpgsql AS $$
DECLARE
    d record;
    t record;
    v_nothing_for jsonb[] := '{}';
BEGIN
    FOR d IN
        SELECT dv.serial, dv.labels FROM devices dv
        WHERE dv.host_id = p_host AND dv.serial = ANY (p_serials)
          AND dv.state = 'device' AND dv.task_id IS NULL
          AND EXISTS (SELECT 1 FROM tasks tk
                      WHERE tk.status = 'queued'
                        AND (tk.selector_serial IS NULL OR tk.selector_serial = dv.serial)
                        AND dv.labels @> tk.selector_labels)
        ORDER BY dv.serial
    LOOP
        CONTINUE WHEN d.labels = ANY (v_nothing_for)
                  AND NOT EXISTS (SELECT 1 FROM tasks tk
                                  WHERE tk.status = 'queued' AND tk.selector_serial = d.serial);
        SELECT tk.task_id, tk.attempt + 1 AS next_attempt, tk.spec, tk.updated_at,
               tk.selector_labels INTO t
        FROM tasks tk
        WHERE tk.status = 'queued'
          AND (tk.selector_serial IS NULL OR tk.selector_serial = d.serial)
          AND d.labels @> tk.selector_labels
        ORDER BY tk.priority DESC, tk.created_at, tk.task_id
        LIMIT 1
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            v_nothing_for := v_nothing_for || d.labels;
            CONTINUE;
        END IF;
        UPDATE devices dv SET task_id = t.task_id, updated_at = now()
        WHERE dv.host_id = p_host AND dv.serial = d.serial
          AND dv.state = 'device' AND dv.task_id IS NULL AND dv.labels @> t.selector_labels;
        -- Taken or changed meanwhile: the task stays queued (and may suit the next device).
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
        INSERT INTO task_events (task_id, attempt, kind, from_status, to_status, detail)
        VALUES (t.task_id, t.next_attempt, 'assign', 'queued', 'assigned', p_host || '/' || d.serial);
        RETURN NEXT;
    END LOOP;
END $$;
