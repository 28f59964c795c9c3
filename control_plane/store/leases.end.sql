-- How leases end, the part of store/leases.py's SQL that would make leases.sql too long to
-- read (an aggregate's SQL over 400 lines goes on in store/<aggregate>.<part>.sql): a
-- release by the host, a lost phone, expiry, a deadline overrun. Lock order, in every
-- statement and function: as the top of schema.sql says.
--
-- Its functions come first: they are part of the schema (store/schema.py applies them
-- after schema.sql at start-up; CREATE OR REPLACE, so idempotently), and the statements
-- below call them.

-- -- functions --------------------------------------------------------------------------

-- expired / released / device_lost, the task's side: it leaves the attempt whose lease
-- ended without a report, to cancelled (a cancel was pending: never requeued), queued
-- (attempts left) or failed, and its device is freed. The caller holds the task row (t, as
-- locked) and has ended the attempt; p_how is the event. Attempts that ended device_lost
-- are not the task's: they count against p_infra_budget instead of max_attempts, and once
-- that is spent the task fails. A session's task is never requeued (its client holds the
-- app's state on that phone): it fails, "lease lost: …" or "device lost: …". Returns the
-- status.
CREATE OR REPLACE FUNCTION amc_leave_attempt(t tasks, p_cancel_pending boolean, p_how text,
                                             p_reason text, p_infra_budget integer DEFAULT 0)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_lost boolean := p_how = 'device_lost';
    v_to text := CASE WHEN p_cancel_pending THEN 'cancelled'
                      WHEN t.session THEN 'failed'
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
        error = CASE WHEN v_to = 'failed' AND t.session AND v_lost
                     THEN 'device lost: ' || p_reason
                     WHEN v_to = 'failed' AND t.session AND p_how = 'expired'
                     THEN 'lease lost: it expired'
                     WHEN v_to = 'failed' AND t.session
                     THEN 'lease lost: ' || p_how || ' by its host (' || p_reason || ')'
                     WHEN v_to = 'failed' AND v_lost
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
-- such lease for this host). p_cleans: as amc_report's.
CREATE OR REPLACE FUNCTION amc_release(p_host text, p_lease uuid, p_reason text,
                                       p_cleans boolean DEFAULT false)
RETURNS TABLE (code text, task_id uuid, attempt integer, lease_id uuid, host_id text,
               to_status text, selector_serial text, selector_labels jsonb)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM amc_give_back(p_host, p_lease, 'released', p_reason, 0,
                                             p_cleans);
END $$;

-- A lease given back (amc_release, or p_how 'device_lost': its phone was lost mid-run,
-- the attempt ends released and the task is requeued within p_budget infrastructure
-- retries, see amc_leave_attempt). The attempt is read, then its task locked, then the
-- attempt read again and ended (the lock order). Codes as amc_release's; p_cleans as
-- amc_report's (only for a lease that ends here). The attempt is reached by its lease alone
-- and its state asked of the row: a state in the WHERE lets the planner read
-- attempts_by_host whole when statistics say no attempt is active.
CREATE OR REPLACE FUNCTION amc_give_back(p_host text, p_lease uuid, p_how text,
                                         p_reason text, p_budget integer,
                                         p_cleans boolean DEFAULT false)
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
    -- As it is now that its task is held (every change of an attempt's state holds its task
    -- first): it stays so until this commits.
    SELECT * INTO a FROM attempts att WHERE att.lease_id = p_lease;
    IF a.state <> 'active' THEN
        code := 'ended';
        RETURN NEXT;
        RETURN;
    END IF;
    UPDATE attempts att SET state = 'released', ended_at = now()
    WHERE att.lease_id = p_lease
    RETURNING att.cancel_requested_at INTO v_cancel;
    code := 'released';
    task_id := a.task_id;
    attempt := a.attempt;
    lease_id := a.lease_id;
    host_id := a.host_id;
    to_status := amc_leave_attempt(t, v_cancel IS NOT NULL, p_how, p_reason, p_budget);
    IF p_cleans THEN
        PERFORM amc_cleaning(a.host_id, a.device_serial, a.task_id);
    END IF;
    selector_serial := t.selector_serial;
    selector_labels := t.selector_labels;
    RETURN NEXT;
END $$;

-- -- statements ------------------------------------------------------------------------

-- name: release_lease
-- The host ($1; NULL: any) gives the lease back ($4: it cleans the phone next). With the
-- task's selector: a requeued task is offered to the hosts that can take it.
SELECT * FROM amc_release($1, $2, $3, $4);

-- name: device_lost
-- The host ($1; NULL: any) gives the lease back because its phone was lost mid-run ($3:
-- what it saw): requeued within $4 infrastructure retries (amc_leave_attempt). As
-- release_lease otherwise ($5: it cleans the phone next).
SELECT * FROM amc_give_back($1, $2, 'device_lost', $3, $4, $5);

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
