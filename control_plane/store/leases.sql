-- The statements store/leases.py sends, by name: leases: Acquire, renewals, reports,
-- releases and the sweeps that end leases. store/sql.py loads every store/*.sql (a name is
-- used once in all of them). Lock order, in every statement and function: as the top of
-- schema.sql says.

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
