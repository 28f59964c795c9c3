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

-- 3. An Acquire that finds no work writes nothing.
CREATE OR REPLACE FUNCTION amc_acquire(p_host text, p_serials text[], p_ttl interval)
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
          -- Lock only devices that have work waiting: an Acquire that finds nothing locks
          -- no row, so it is a read-only transaction (no xid, no WAL, no commit flush).
          AND EXISTS (SELECT 1 FROM tasks tk
                      WHERE tk.status = 'queued'
                        AND (tk.selector_serial IS NULL OR tk.selector_serial = dv.serial)
                        AND dv.labels @> tk.selector_labels)
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
