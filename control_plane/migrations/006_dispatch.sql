-- Targeted dispatch (control_plane/dispatch.py): an Acquire also returns the labels of the
-- host's devices still idle after it, so that the replica can index the parked Acquire by
-- what it can take, and tell an offer lost to another host (a device that fits it is still
-- idle here) from one it had no room for (offer it to another host). Same round trip.
-- Assignment rows have task_id set and labels NULL; idle-device rows the reverse.
CREATE FUNCTION amc_acquire_idle(p_host text, p_serials text[], p_ttl interval)
RETURNS TABLE (task_id uuid, attempt integer, lease_id uuid, device_serial text, spec bytea,
               queued_seconds double precision, labels jsonb)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT a.task_id, a.attempt, a.lease_id, a.device_serial, a.spec,
                        a.queued_seconds, NULL::jsonb
                 FROM amc_acquire(p_host, p_serials, p_ttl) a;
    RETURN QUERY SELECT NULL::uuid, NULL::integer, NULL::uuid, dv.serial, NULL::bytea,
                        NULL::double precision, dv.labels
                 FROM devices dv
                 WHERE dv.host_id = p_host AND dv.serial = ANY (p_serials)
                   AND dv.state = 'device' AND dv.task_id IS NULL;
END $$;

-- amc_expire with the selector of each task it ended, so that a requeued task is offered to
-- the hosts that can take it. The selectors are read after amc_expire has run (which takes
-- attempts, then tasks), not by a join around it: that would take `tasks` first.
CREATE FUNCTION amc_expire_offers(p_limit integer, p_lease uuid DEFAULT NULL,
                                  p_reason text DEFAULT '')
RETURNS TABLE (task_id uuid, attempt integer, lease_id uuid, host_id text, to_status text,
               selector_serial text, selector_labels jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    e record;
BEGIN
    FOR e IN SELECT * FROM amc_expire(p_limit, p_lease, p_reason) LOOP
        task_id := e.task_id;
        attempt := e.attempt;
        lease_id := e.lease_id;
        host_id := e.host_id;
        to_status := e.to_status;
        SELECT tk.selector_serial, tk.selector_labels INTO selector_serial, selector_labels
        FROM tasks tk WHERE tk.task_id = e.task_id;
        RETURN NEXT;
    END LOOP;
END $$;
