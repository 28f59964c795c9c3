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

-- 3. Acquire: one queue scan per group of alike devices, and locks only what it assigns.
-- It used to lock every idle device of the host first (FOR UPDATE SKIP LOCKED), then probe
-- the queue once per device: an Acquire that found nothing still wrote (row locks are WAL
-- records) and waited for a flush, and each probe walked again past the tasks the earlier
-- probes of the same call had taken (their index entries stay until vacuum and cannot be
-- skipped while this transaction runs): O(devices^2) per call. Now the idle devices are read
-- without locks and grouped by labels; per group, one scan takes up to one task per device
-- (SKIP LOCKED), in queue order; each task then reserves a device of the group (its own
-- serial if it names one) with an UPDATE whose conditions PostgreSQL rechecks on the latest
-- row version (another Acquire or a re-registration may have changed it). A task whose
-- device is taken stays queued, and the devices left get a scan of their own. Lock order is
-- task -> device, as in every other transition.
CREATE OR REPLACE FUNCTION amc_acquire(p_host text, p_serials text[], p_ttl interval)
RETURNS TABLE (task_id uuid, attempt integer, lease_id uuid, device_serial text, spec bytea,
               queued_seconds double precision)
LANGUAGE plpgsql AS $$
DECLARE
    g record;
    t record;
    v_free text[];
    v_serial text;
    v_again boolean;
BEGIN
    FOR g IN
        SELECT dv.labels, array_agg(dv.serial ORDER BY dv.serial) AS serials
        FROM devices dv
        WHERE dv.host_id = p_host AND dv.serial = ANY (p_serials)
          AND dv.state = 'device' AND dv.task_id IS NULL
        GROUP BY dv.labels
    LOOP
        v_free := g.serials;
        LOOP
            v_again := false;
            FOR t IN
                SELECT tk.task_id, tk.attempt + 1 AS next_attempt, tk.spec, tk.updated_at,
                       tk.selector_labels, tk.selector_serial
                FROM tasks tk
                WHERE tk.status = 'queued'
                  AND (tk.selector_serial IS NULL OR tk.selector_serial = ANY (v_free))
                  AND g.labels @> tk.selector_labels
                ORDER BY tk.priority DESC, tk.created_at, tk.task_id
                LIMIT cardinality(v_free)
                FOR UPDATE SKIP LOCKED
            LOOP
                EXIT WHEN cardinality(v_free) = 0;
                v_serial := CASE WHEN t.selector_serial IS NULL THEN v_free[1]
                                 WHEN t.selector_serial = ANY (v_free) THEN t.selector_serial
                            END;
                IF v_serial IS NULL THEN
                    -- Its device got an earlier task of this scan: it stays queued, and
                    -- the devices left are offered the next tasks in a scan of their own.
                    v_again := true;
                    CONTINUE;
                END IF;
                v_free := array_remove(v_free, v_serial);
                UPDATE devices dv SET task_id = t.task_id, updated_at = now()
                WHERE dv.host_id = p_host AND dv.serial = v_serial
                  AND dv.state = 'device' AND dv.task_id IS NULL
                  AND dv.labels @> t.selector_labels;
                IF NOT FOUND THEN
                    -- Taken or changed meanwhile: the task stays queued.
                    v_again := true;
                    CONTINUE;
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
            -- Every rescan has fewer free devices (its first task always finds one).
            EXIT WHEN NOT v_again OR cardinality(v_free) = 0;
        END LOOP;
    END LOOP;
END $$;
