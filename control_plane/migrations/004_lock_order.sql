-- One lock order in every transition that touches a task and its attempt:
--
--     the task row first, then its attempt row, then devices;
--     several tasks in one statement: in task_id order.
--
-- amc_cancel, amc_report and amc_expire always followed it; the renewal did not: it updated
-- the attempt first and then, for a lease still `assigned`, the task (the acknowledgement),
-- so a first renewal racing a cancel, report or release of the same task deadlocked. The
-- renewal is now a function that takes the rows of the tasks it acknowledges first.

-- The leases a host has not acknowledged yet: what a renewal looks at before locking tasks.
-- Usually empty, so the common renewal (nothing to acknowledge) pays one probe of it.
CREATE INDEX attempts_unacknowledged ON attempts (host_id)
    WHERE state = 'active' AND acknowledged_at IS NULL;

-- Renews the host's live leases among p_leases; the first renewal acknowledges the
-- assignment (assigned -> dispatched). Leases not renewed come back with task_id NULL: a
-- conflict. Columns in the order of domain.Renewal's fields. The lock-first step runs only
-- when the host has unacknowledged leases (one look at attempts_unacknowledged): most
-- renewals acknowledge nothing and pay nothing for it.
CREATE FUNCTION amc_renew(p_host text, p_leases uuid[], p_ttl interval)
RETURNS TABLE (lease_id text, cancel_pending boolean, task_id text, attempt integer,
               delivery_seconds double precision, acknowledged boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_acked uuid[] := '{}';
BEGIN
    -- 1. Tasks first: lock and acknowledge those whose lease this renewal is the first for.
    IF EXISTS (SELECT 1 FROM attempts att
               WHERE att.host_id = p_host AND att.state = 'active'
                 AND att.acknowledged_at IS NULL) THEN
        WITH pending AS (
            SELECT tk.task_id FROM attempts att
            JOIN tasks tk ON tk.task_id = att.task_id AND tk.attempt = att.attempt
            WHERE att.host_id = p_host AND att.state = 'active'
              AND att.acknowledged_at IS NULL
              AND att.lease_id = ANY (p_leases) AND att.lease_expires_at > now()
              AND tk.status = 'assigned'
            ORDER BY tk.task_id
            FOR UPDATE OF tk
        ), acked AS (
            UPDATE tasks tk SET status = 'dispatched', updated_at = now()
            FROM pending p
            WHERE tk.task_id = p.task_id AND tk.status = 'assigned'
            RETURNING tk.task_id, tk.attempt
        ), ev AS (
            INSERT INTO task_events (task_id, attempt, kind, from_status, to_status)
            SELECT a.task_id, a.attempt, 'acknowledge', 'assigned', 'dispatched' FROM acked a
        )
        SELECT COALESCE(array_agg(a.task_id), '{}') INTO v_acked FROM acked a;
    END IF;

    -- 2. Then the attempts: extend the leases.
    RETURN QUERY
    WITH req AS (
        SELECT DISTINCT unnest(p_leases) AS lease_id
    ), renewed AS (
        UPDATE attempts a SET
            lease_expires_at = now() + p_ttl,
            acknowledged_at = COALESCE(a.acknowledged_at, now()),
            cancel_delivered_at = COALESCE(a.cancel_delivered_at,
                                           CASE WHEN a.cancel_requested_at IS NOT NULL
                                                THEN now() END)
        FROM req
        WHERE a.lease_id = req.lease_id AND a.host_id = p_host AND a.state = 'active'
          AND a.lease_expires_at > now()
        RETURNING a.lease_id, a.task_id, a.attempt,
                  a.cancel_requested_at IS NOT NULL AS cancel_pending,
                  CASE WHEN a.cancel_delivered_at = now()
                       THEN extract(epoch FROM now() - a.cancel_requested_at)::float8 END
                       AS delivery_seconds
    )
    SELECT req.lease_id::text, COALESCE(r.cancel_pending, false),
           r.task_id::text, r.attempt, r.delivery_seconds,
           r.task_id = ANY (v_acked) AND r.task_id IS NOT NULL
    FROM req LEFT JOIN renewed r USING (lease_id);
END $$;
