-- Every statement the control plane sends, by name (control_plane.sql loads this file).
-- Transitions that lock several rows are functions in schema.sql, called from here.
--
-- Lock order, in every statement and function (as the top of schema.sql says): task rows
-- first, several in task_id order; an attempt row only while holding its task's; the host
-- row; then devices.

-- name: submit_tasks
-- submit: - -> queued, for one task or a batch; returns the rows created (not those whose
-- (caller, request_id) exists already). Tasks of one batch get created_at a microsecond
-- apart, so equal priorities run in batch order. Each task goes into the queue group of
-- its selector and fairness key ($12; '' for the default) with its fair tag: the key's
-- base at its priority (amc_fair_base) plus 1/weight per task of the batch.
WITH req AS (
    SELECT r.*, COALESCE(NULLIF(r.key, ''), 'default') AS fairness_key
    FROM unnest($2::uuid[], $3::text[], $4::bytea[], $5::text[], $6::jsonb[],
                $7::integer[], $8::integer[], $9::jsonb[], $10::interval[],
                $11::interval[], $12::text[])
        WITH ORDINALITY AS r (task_id, request_id, spec, selector_serial, selector_labels,
                              priority, max_attempts, metadata, queue_timeout, deadline, key,
                              ord)
), grp AS (
    SELECT d.*, amc_queue_group(d.serial, d.selector_labels, d.fairness_key) AS group_id
    FROM (SELECT DISTINCT COALESCE(selector_serial, '') AS serial, selector_labels,
                          fairness_key
          FROM req) d
), base AS (
    SELECT k.fairness_key, k.priority, amc_fair_base(k.fairness_key, k.priority) AS base,
           COALESCE((SELECT f.weight FROM fair_shares f
                     WHERE f.fairness_key = k.fairness_key), 1) AS weight
    FROM (SELECT DISTINCT fairness_key, priority FROM req) k
), ins AS (
    INSERT INTO tasks (task_id, caller, request_id, status, spec, selector_serial,
                       selector_labels, priority, max_attempts, metadata, created_at, updated_at,
                       queue_timeout, deadline, queue_deadline, group_id, fairness_key,
                       fair_tag)
    SELECT r.task_id, $1, r.request_id, 'queued', r.spec, r.selector_serial, r.selector_labels,
           r.priority, r.max_attempts, r.metadata,
           now() + (r.ord - 1) * interval '1 microsecond', now(),
           r.queue_timeout, r.deadline, now() + r.queue_timeout, g.group_id, r.fairness_key,
           b.base + (row_number() OVER (PARTITION BY r.fairness_key, r.priority ORDER BY r.ord))
                    / b.weight::double precision
    FROM req r
    JOIN grp g ON g.serial = COALESCE(r.selector_serial, '')
               AND g.selector_labels = r.selector_labels AND g.fairness_key = r.fairness_key
    JOIN base b ON b.fairness_key = r.fairness_key AND b.priority = r.priority
    ORDER BY r.ord
    ON CONFLICT (caller, request_id) DO NOTHING
    RETURNING *
), ev AS (
    INSERT INTO task_events (task_id, attempt, kind, to_status)
    SELECT task_id, 0, 'submit', 'queued' FROM ins
), relay AS (
    -- A session's ($13: the replica holding its client's call; NULL for other tasks).
    INSERT INTO session_relays (task_id, replica_id)
    SELECT task_id, $13::text FROM ins WHERE $13::text IS NOT NULL
)
SELECT * FROM ins;

-- name: tasks_by_request
SELECT * FROM tasks WHERE caller = $1 AND request_id = ANY ($2::text[]);

-- name: get_task
SELECT * FROM tasks WHERE task_id = $1;

-- name: task_history
-- A task's attempts (all: at most max_attempts) and one page of its events after event $2,
-- in one round trip; `found` is false when there is no such task.
SELECT EXISTS (SELECT 1 FROM tasks WHERE task_id = $1) AS found,
       (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                   'attempt', a.attempt, 'host_id', a.host_id,
                   'device_serial', a.device_serial, 'lease_id', a.lease_id,
                   'state', a.state, 'created_at', a.created_at,
                   'acknowledged_at', a.acknowledged_at,
                   'ended_at', COALESCE(a.ended_at, a.reported_at),
                   'cancel_requested_at', a.cancel_requested_at) ORDER BY a.attempt), '[]')
        FROM attempts a WHERE a.task_id = $1) AS attempts,
       (SELECT COALESCE(jsonb_agg(to_jsonb(e) ORDER BY e.event_id), '[]')
        FROM (SELECT event_id, attempt, kind, from_status, to_status, detail, at
              FROM task_events WHERE task_id = $1 AND event_id > $2
              ORDER BY event_id LIMIT $3) e) AS events;

-- name: list_tasks
-- Newest first, keyset-paged on (created_at, task_id).
-- $6: selector labels the task's must contain; $7: a LIKE pattern (escaped) for the id's
-- start, or anywhere in the request id or metadata.
SELECT * FROM tasks
WHERE (cardinality($1::text[]) = 0 OR status = ANY ($1))
  AND ($2::text IS NULL OR host_id = $2)
  AND ($3::timestamptz IS NULL OR (created_at, task_id) < ($3, $4::uuid))
  AND selector_labels @> $6::jsonb
  AND ($7::text = '' OR task_id::text LIKE $7 || '%' OR request_id ILIKE '%' || $7 || '%'
       OR metadata::text ILIKE '%' || $7 || '%')
ORDER BY created_at DESC, task_id DESC
LIMIT $5;

-- name: queue_groups
-- The queue by selector as last counted (amc_count_queue): the $1 largest selectors (their
-- groups of every fairness key summed), each with the devices it matched, by use; the
-- queued total and when it was counted. Reads queue_group_stats (a row per group), never
-- the backlog. Serial '' is none.
WITH s AS (
    SELECT q.selector_serial, q.selector_labels, sum(st.queued)::bigint AS n,
           min(st.oldest) AS oldest, max(st.devices_idle) AS idle,
           max(st.devices_busy) AS busy, max(st.devices_unavailable) AS unavailable
    FROM queue_group_stats st JOIN queue_groups q ON q.group_id = st.group_id
    WHERE st.queued > 0
    GROUP BY q.selector_serial, q.selector_labels
)
SELECT NULLIF(g.selector_serial, '') AS selector_serial, g.selector_labels, g.n, g.oldest,
       g.idle, g.busy, g.unavailable,
       (SELECT COALESCE(sum(n), 0) FROM s)::bigint AS total,
       (SELECT amc_queue_counted_at()) AS counted_at
FROM (SELECT * FROM s ORDER BY n DESC, oldest LIMIT $1) g
ORDER BY g.n DESC, g.oldest;

-- name: queue_counted_at
-- When the queue was last counted, for a reading that found nothing queued.
SELECT amc_queue_counted_at() AS counted_at;

-- name: count_queue
-- Recount the queue into queue_group_stats if it is older than $1 and no other
-- transaction is counting it (amc_count_queue); devices connected within $2. One row
-- (groups, queued) when it counted; none otherwise.
SELECT * FROM amc_count_queue($1, $2);

-- name: fair_shares
-- The fairness keys with tasks queued (as last counted) or running (now: the running
-- tasks by group through tasks_running, at most one per phone), or with a share set;
-- $1: one key only (NULL: all), the $2 with most queued first. With each, its weight and
-- cap (1 and NULL without a share), when its share was set, and when the queue was
-- counted.
WITH counted AS (
    SELECT q.fairness_key, sum(st.queued)::bigint AS queued, min(st.oldest) AS oldest
    FROM queue_group_stats st JOIN queue_groups q ON q.group_id = st.group_id
    WHERE $1::text IS NULL OR q.fairness_key = $1
    GROUP BY q.fairness_key
), running AS (
    SELECT q.fairness_key, count(*) AS running
    FROM tasks tk JOIN queue_groups q ON q.group_id = tk.group_id
    WHERE tk.status IN ('assigned', 'dispatched') AND ($1::text IS NULL OR q.fairness_key = $1)
    GROUP BY q.fairness_key
), keys AS (
    SELECT fairness_key FROM fair_shares WHERE $1::text IS NULL OR fairness_key = $1
    UNION SELECT fairness_key FROM counted WHERE queued > 0
    UNION SELECT fairness_key FROM running
)
SELECT k.fairness_key, COALESCE(f.weight, 1) AS weight, f.max_devices, f.updated_at,
       COALESCE(c.queued, 0) AS queued, COALESCE(r.running, 0) AS running, c.oldest,
       (SELECT amc_queue_counted_at()) AS counted_at
FROM keys k
LEFT JOIN fair_shares f ON f.fairness_key = k.fairness_key
LEFT JOIN counted c ON c.fairness_key = k.fairness_key
LEFT JOIN running r ON r.fairness_key = k.fairness_key
ORDER BY COALESCE(c.queued, 0) DESC, COALESCE(r.running, 0) DESC, k.fairness_key
LIMIT $2;

-- name: set_fair_share
-- Set key $1's share: weight $2 (NULL: as it is, 1 for a new key), cap $3 (NULL: as it
-- is) or none ($4 true), recorded in fair_share_events by $5 ($6: the token's name)
-- because $7; one statement. The share as it is now, and the cap it had (`cap_before`;
-- NULL: none, or no share).
WITH before AS (
    SELECT max_devices FROM fair_shares WHERE fairness_key = $1
), up AS (
    INSERT INTO fair_shares AS f (fairness_key, weight, max_devices, updated_at)
    VALUES ($1, COALESCE($2::integer, 1), CASE WHEN $4::boolean THEN NULL ELSE $3::integer END,
            now())
    ON CONFLICT (fairness_key) DO UPDATE SET
        weight = COALESCE($2::integer, f.weight),
        max_devices = CASE WHEN $4::boolean THEN NULL
                           ELSE COALESCE($3::integer, f.max_devices) END,
        updated_at = now()
    RETURNING f.fairness_key, f.weight, f.max_devices
), ev AS (
    INSERT INTO fair_share_events (fairness_key, weight, max_devices, actor, actor_name, reason)
    SELECT fairness_key, weight, max_devices, $5, $6, $7 FROM up
)
SELECT up.weight, up.max_devices, (SELECT max_devices FROM before) AS cap_before
FROM up;

-- name: fair_share_events
-- A key's latest $2 changes of its share, newest first.
SELECT weight, max_devices, actor, actor_name, reason, at
FROM fair_share_events WHERE fairness_key = $1
ORDER BY event_id DESC LIMIT $2;

-- name: fair_share_heads
-- The first $2 queued tasks of key $1, in the order its groups hand them out (the heads
-- of each of its groups through tasks_dispatch, merged): what is offered to the parked
-- Acquires when the key's cap is raised or removed.
SELECT h.task_id, NULLIF(q.selector_serial, '') AS selector_serial, q.selector_labels
FROM queue_groups q CROSS JOIN LATERAL (
    SELECT tk.task_id, tk.priority, tk.fair_tag, tk.created_at
    FROM tasks tk
    WHERE tk.group_id = q.group_id AND tk.status = 'queued'
    ORDER BY tk.priority DESC, tk.fair_tag, tk.created_at, tk.task_id
    LIMIT $2
) h
WHERE q.fairness_key = $1
ORDER BY h.priority DESC, h.fair_tag, h.created_at, h.task_id
LIMIT $2;

-- name: forget_queue_groups
SELECT amc_forget_queue_groups($1, $2);

-- name: cancel_task
SELECT code, (task).* FROM amc_cancel($1, $2);

-- name: acquire
-- Assignments (task_id set), then the devices left idle (labels set); each assignment with
-- its task's deadline (fixed at submit, so the statement's snapshot has it).
SELECT a.*, (SELECT tk.deadline FROM tasks tk WHERE tk.task_id = a.task_id) AS deadline
FROM amc_acquire($1, $2, $3) a;

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

-- name: time_out_queued
-- queue timeout: queued -> failed, for up to $1 tasks whose stay in the queue ran out (the
-- longest overdue; the tasks_queue_deadline index finds them), in one statement, locked in
-- task_id order (the lock order). Safe in every replica at once: a task another sweeper,
-- an Acquire or a cancel holds is skipped, and the UPDATE rechecks that it is still queued
-- and due. A cancel that came first left it `cancelled`: untouched.
WITH due AS (
    SELECT tk.task_id FROM tasks tk
    WHERE tk.status = 'queued' AND tk.queue_deadline <= now()
    ORDER BY tk.queue_deadline
    LIMIT $1
), held AS (
    SELECT tk.task_id FROM tasks tk JOIN due USING (task_id)
    WHERE tk.status = 'queued' AND tk.queue_deadline <= now()
    ORDER BY tk.task_id
    FOR UPDATE OF tk SKIP LOCKED
), ended AS (
    UPDATE tasks tk SET status = 'failed', error = 'queue timeout', finished_at = now(),
                        updated_at = now()
    FROM held
    WHERE tk.task_id = held.task_id AND tk.status = 'queued' AND tk.queue_deadline <= now()
    RETURNING tk.*
), ev AS (
    INSERT INTO task_events (task_id, attempt, kind, from_status, to_status, detail)
    SELECT e.task_id, e.attempt, 'queue_timeout', 'queued', 'failed',
           'queued longer than ' || e.queue_timeout
    FROM ended e
)
SELECT * FROM ended;

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

-- name: register_host
-- The host, its devices ($3..$9 are parallel arrays, one element per device; labels as
-- JSON text), and the devices it no longer lists marked gone: one statement. The host row
-- first (the lock order: both device writes read `host`, so it is written before them):
-- a removal of the host, which locks it and then deletes its devices, comes wholly before
-- or after (the registration then recreates it).
WITH host AS (
    INSERT INTO hosts (host_id, labels) VALUES ($1, $2)
    ON CONFLICT (host_id) DO UPDATE SET labels = EXCLUDED.labels, last_seen_at = now(),
                                        registered_at = now()
    RETURNING host_id
), listed AS (
    INSERT INTO devices (host_id, serial, state, model, manufacturer, sdk, abi, labels)
    SELECT h.host_id, d.serial, d.state, d.model, d.manufacturer, d.sdk, d.abi,
           d.labels::jsonb
    FROM host h,
         unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::int[], $8::text[],
                $9::text[]) AS d (serial, state, model, manufacturer, sdk, abi, labels)
    ON CONFLICT (host_id, serial) DO UPDATE SET
        state = EXCLUDED.state, model = EXCLUDED.model, manufacturer = EXCLUDED.manufacturer,
        sdk = EXCLUDED.sdk, abi = EXCLUDED.abi, labels = EXCLUDED.labels, updated_at = now()
)
UPDATE devices dv SET state = 'gone', updated_at = now()
FROM host h
WHERE dv.host_id = h.host_id AND dv.serial <> ALL ($3::text[]) AND dv.state <> 'gone';

-- name: list_hosts
-- Connected: its renewal stream is open on a live replica, or it registered or closed its
-- stream within the window. last_seen: the later of that and its replica's heartbeat.
-- $2: one host only (NULL: all).
SELECT h.host_id, h.labels,
       GREATEST(h.last_seen_at, r.seen_at) AS last_seen_at,
       GREATEST(h.last_seen_at, r.seen_at) > now() - $1::interval AS connected,
       COALESCE(jsonb_agg(jsonb_build_object(
           'serial', d.serial, 'state', d.state, 'model', d.model,
           'manufacturer', d.manufacturer, 'sdk', d.sdk, 'abi', d.abi, 'labels', d.labels,
           'task_id', d.task_id, 'cordoned', d.cordoned, 'condition', d.condition,
           'condition_reason', d.condition_reason, 'battery_percent', d.battery_percent,
           'temperature_celsius', d.temperature_celsius, 'charging', d.charging,
           'probed_at', d.probed_at) ORDER BY d.serial)
           FILTER (WHERE d.serial IS NOT NULL), '[]') AS devices,
       h.cordoned, h.draining
FROM hosts h LEFT JOIN replicas r USING (replica_id) LEFT JOIN devices d USING (host_id)
WHERE $2::text IS NULL OR h.host_id = $2
GROUP BY h.host_id, r.seen_at
ORDER BY h.host_id;

-- name: set_device_health
-- Host $1's probes saw these devices' conditions change ($2..$7: parallel arrays, one
-- element per device; NULL facts: not read). Only its own devices; one statement for the
-- batch. `freed`: how many turned ready (the host's parked Acquires should look again).
-- A device quarantined, recovering, or leaving those is a `recovery` host event, the host
-- its actor (the rows as they were before this statement: `was`).
WITH h AS (
    SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::int[], $6::real[],
                         $7::bool[])
        AS h (serial, condition, reason, battery, temperature, charging)
), was AS (
    SELECT d.serial, d.condition FROM devices d JOIN h USING (serial) WHERE d.host_id = $1
), ev AS (
    INSERT INTO host_events (host_id, serial, kind, actor, actor_name, reason)
    SELECT $1, h.serial, 'recovery', $1, 'host agent',
           h.condition || CASE WHEN h.reason <> '' THEN ': ' || h.reason ELSE '' END
    FROM h JOIN was USING (serial)
    WHERE h.condition IN ('quarantined', 'recovering')
       OR was.condition IN ('quarantined', 'recovering')
), u AS (
    UPDATE devices d SET condition = h.condition, condition_reason = h.reason,
                         battery_percent = h.battery, temperature_celsius = h.temperature,
                         charging = h.charging, probed_at = now()
    FROM h
    WHERE d.host_id = $1 AND d.serial = h.serial
    RETURNING d.condition
)
SELECT count(*) FILTER (WHERE condition = 'ready') AS freed, count(*) AS updated FROM u;

-- name: set_host_cordon
-- Cordon ($2 true) or uncordon a host; $3: it drains too (uncordoning ends a drain).
-- Recorded in host_events as $4 by $5 ($6: the token's name) because $7. No row: no such
-- host. `leases`: how many it holds now. Ordered with Acquire by the host row: see
-- amc_set_host_cordon() in schema.sql.
SELECT * FROM amc_set_host_cordon($1, $2, $3, $4, $5, $6, $7);

-- name: set_device_cordon
-- Cordon ($3 true) or uncordon the device with serial $2 (on host $1; NULL: whichever host
-- has it, if only one does). Changed only when exactly one device matches; `hosts` lists
-- the hosts that have that serial. Recorded in host_events like set_host_cordon.
WITH m AS (
    SELECT host_id, serial FROM devices
    WHERE serial = $2 AND ($1::text IS NULL OR host_id = $1)
), u AS (
    UPDATE devices d SET cordoned = $3
    FROM m
    WHERE (SELECT count(*) FROM m) = 1 AND d.host_id = m.host_id AND d.serial = m.serial
    RETURNING d.host_id, d.serial
), ev AS (
    INSERT INTO host_events (host_id, serial, kind, actor, actor_name, reason)
    SELECT host_id, serial, $4, $5, $6, $7 FROM u
)
SELECT COALESCE(array_agg(m.host_id ORDER BY m.host_id), '{}') AS hosts,
       (SELECT count(*) FROM u) > 0 AS changed
FROM m;

-- name: release_device
-- An operator releases the device with serial $2 (on host $1; NULL: whichever host has it,
-- if only one does) from quarantine: recorded in host_events as 'release' by $4 ($5: the
-- token's name) because $6, when exactly one device matches, it is quarantined or
-- recovering, and its host is connected within $3 (its agent holds the quarantine and is
-- told over its stream). `hosts` lists the hosts that have that serial; `condition` and
-- `connected` are the one match's. The condition itself is left to the host's report.
WITH m AS (
    SELECT d.host_id, d.serial, d.condition,
           COALESCE(GREATEST(h.last_seen_at, r.seen_at) > now() - $3::interval, false)
               AS connected
    FROM devices d JOIN hosts h USING (host_id) LEFT JOIN replicas r USING (replica_id)
    WHERE d.serial = $2 AND ($1::text IS NULL OR d.host_id = $1)
), ev AS (
    INSERT INTO host_events (host_id, serial, kind, actor, actor_name, reason)
    SELECT host_id, serial, 'release', $4, $5, $6 FROM m
    WHERE (SELECT count(*) FROM m) = 1 AND connected
      AND condition IN ('quarantined', 'recovering')
    RETURNING host_id
)
SELECT COALESCE(array_agg(m.host_id ORDER BY m.host_id), '{}') AS hosts,
       min(m.condition) AS condition, bool_and(m.connected) AS connected,
       (SELECT count(*) FROM ev) > 0 AS released
FROM m;

-- name: remove_host
SELECT * FROM amc_remove_host($1, $2, $3, $4, $5);

-- name: host_draining
-- Read when a host opens its renewal stream: the drain it is told of at once.
SELECT draining FROM hosts WHERE host_id = $1;

-- name: host_events
-- A host's latest $2 events (its devices' too), newest first.
SELECT event_id, host_id, serial, kind, actor, actor_name, reason, at
FROM host_events WHERE host_id = $1
ORDER BY event_id DESC LIMIT $2;

-- name: read_tasks
-- Tasks $1 as one snapshot sees them (issue 27: read apart, a phone that took a task after
-- the task was read was counted busy with it). Each running one (assigned, dispatched) with
-- its current attempt's progress: when it was acknowledged and the steps its host reported
-- as they ended (p_*; NULL once the task ends: its result is the record). Each queued one
-- with what its pending reason is made of: the devices its selector matches, counted by
-- what keeps them from the task (m_*: on a cordoned host, cordoned, offline (not 'device',
-- or the host is not connected within $2), held by its condition (not 'ready'; m_held_by
-- lists their conditions, one per device), busy, or none of these: idle), matching as
-- amc_acquire does; and its fairness key's cap with the tasks running under it, counted
-- as amc_acquire counts them (cap_*; NULL: no cap). One scan of the devices per distinct
-- selector of the queued tasks.
WITH tk AS MATERIALIZED (
    SELECT * FROM tasks WHERE task_id = ANY ($1::uuid[])
), sel AS (
    SELECT DISTINCT selector_serial, selector_labels FROM tk WHERE status = 'queued'
), m AS (
    SELECT sel.selector_serial, sel.selector_labels, c.*
    FROM sel CROSS JOIN LATERAL (
        SELECT count(*) AS total,
               count(*) FILTER (WHERE h.cordoned) AS host_cordoned,
               count(*) FILTER (WHERE NOT h.cordoned AND d.cordoned) AS cordoned,
               count(*) FILTER (WHERE NOT h.cordoned AND NOT d.cordoned
                                  AND NOT (d.state = 'device' AND cn.connected)) AS offline,
               array_agg(d.condition) FILTER (
                   WHERE NOT h.cordoned AND NOT d.cordoned AND d.state = 'device'
                     AND cn.connected AND d.condition <> 'ready') AS held_by,
               count(*) FILTER (WHERE NOT h.cordoned AND NOT d.cordoned AND d.state = 'device'
                                  AND cn.connected AND d.condition = 'ready'
                                  AND d.task_id IS NOT NULL) AS busy
        FROM devices d JOIN hosts h USING (host_id) LEFT JOIN replicas r USING (replica_id)
        CROSS JOIN LATERAL (SELECT GREATEST(h.last_seen_at, r.seen_at) > now() - $2::interval
                                   AS connected) cn
        WHERE d.labels @> sel.selector_labels
          AND (sel.selector_serial IS NULL OR d.serial = sel.selector_serial)
    ) c
), cap AS (
    SELECT f.fairness_key, f.max_devices,
           (SELECT count(*) FROM queue_groups q JOIN tasks t ON t.group_id = q.group_id
            WHERE q.fairness_key = f.fairness_key AND t.status IN ('assigned', 'dispatched'))
               AS running
    FROM fair_shares f
    WHERE f.max_devices IS NOT NULL
      AND f.fairness_key IN (SELECT fairness_key FROM tk WHERE status = 'queued')
)
SELECT tk.*, m.total AS m_total, m.host_cordoned AS m_host_cordoned,
       m.cordoned AS m_cordoned, m.offline AS m_offline, m.busy AS m_busy,
       m.held_by AS m_held_by, cap.max_devices AS cap_max_devices, cap.running AS cap_running,
       CASE WHEN tk.status IN ('assigned', 'dispatched') THEN
           (SELECT a.acknowledged_at FROM attempts a
            WHERE a.task_id = tk.task_id AND a.attempt = tk.attempt) END AS p_acknowledged_at,
       CASE WHEN tk.status IN ('assigned', 'dispatched') THEN
           ARRAY(SELECT s.step FROM attempt_steps s
                 WHERE s.task_id = tk.task_id AND s.attempt = tk.attempt
                 ORDER BY s.step_index) END AS p_steps
FROM tk
LEFT JOIN m ON tk.status = 'queued' AND m.selector_labels = tk.selector_labels
           AND m.selector_serial IS NOT DISTINCT FROM tk.selector_serial
LEFT JOIN cap ON tk.status = 'queued' AND cap.fairness_key = tk.fairness_key;

-- name: create_token
INSERT INTO tokens (token_id, name, role, host_id, secret_hash, team)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING *;

-- name: get_token
SELECT * FROM tokens WHERE token_id = $1;

-- name: revoke_token
UPDATE tokens SET revoked_at = COALESCE(revoked_at, now()) WHERE token_id = $1 RETURNING *;

-- name: list_tokens
SELECT * FROM tokens ORDER BY created_at, token_id;

-- name: farm_gauges
-- The metrics' farm-wide gauges, in one round trip: tasks not finished by status (queued as
-- last counted, the rest through tasks_running: never the history), hosts connected (as
-- list_hosts decides it, within $1), devices by state and busy, the queue by selector as
-- last counted (queue_group_stats, not the backlog): the $2 deepest selectors, the rest
-- summed into one group (`other`: serial and labels NULL), and per fairness key its tasks
-- queued (as last counted) and running (now), with the age of the count.
SELECT
    (SELECT jsonb_build_object('queued', (SELECT COALESCE(sum(st.queued), 0)
                                          FROM queue_group_stats st))
            || COALESCE(jsonb_object_agg(status, n), '{}')
     FROM (SELECT status, count(*) AS n FROM tasks
           WHERE status IN ('assigned', 'dispatched') GROUP BY status) s) AS tasks,
    (SELECT count(*) FROM hosts h LEFT JOIN replicas r USING (replica_id)
     WHERE GREATEST(h.last_seen_at, r.seen_at) > now() - $1::interval) AS hosts_connected,
    (SELECT COALESCE(jsonb_agg(jsonb_build_object('state', state, 'busy', busy, 'n', n)), '[]')
     FROM (SELECT state, task_id IS NOT NULL AS busy, count(*) AS n
           FROM devices GROUP BY 1, 2) d) AS devices,
    (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                'serial', serial, 'labels', labels, 'n', n, 'oldest', oldest)), '[]')
     FROM (SELECT CASE WHEN rank <= $2 THEN min(selector_serial) END AS serial,
                  CASE WHEN rank <= $2 THEN min(selector_labels::text)::jsonb END AS labels,
                  sum(n) AS n, max(oldest) AS oldest
           FROM (SELECT NULLIF(q.selector_serial, '') AS selector_serial, q.selector_labels,
                        sum(st.queued) AS n,
                        extract(epoch FROM now() - min(st.oldest))::float8 AS oldest,
                        row_number() OVER (ORDER BY sum(st.queued) DESC, min(st.oldest))
                            AS rank
                 FROM queue_group_stats st JOIN queue_groups q ON q.group_id = st.group_id
                 WHERE st.queued > 0
                 GROUP BY q.selector_serial, q.selector_labels) g
           GROUP BY CASE WHEN rank <= $2 THEN rank ELSE 0 END, rank <= $2) q) AS queue,
    (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                'key', fairness_key, 'queued', queued, 'running', running, 'oldest', oldest)),
                '[]')
     FROM (SELECT k.fairness_key, sum(k.queued) AS queued, sum(k.running) AS running,
                  extract(epoch FROM now() - min(k.oldest))::float8 AS oldest
           FROM (SELECT q.fairness_key, st.queued, 0 AS running, st.oldest
                 FROM queue_group_stats st JOIN queue_groups q ON q.group_id = st.group_id
                 UNION ALL
                 SELECT q.fairness_key, 0, count(*), NULL
                 FROM tasks tk JOIN queue_groups q ON q.group_id = tk.group_id
                 WHERE tk.status IN ('assigned', 'dispatched')
                 GROUP BY q.fairness_key) k
           GROUP BY k.fairness_key) g) AS keys,
    (SELECT extract(epoch FROM now() - max(counted_at))::float8 FROM queue_group_stats)
        AS counted_ago,
    -- The online devices by condition, with their battery and temperature (min, sum and
    -- count of those probed, max), in one scan; the store sums the conditions up:
    -- aggregates, never a series per device.
    (SELECT COALESCE(jsonb_agg(jsonb_build_array(
                c.condition, c.n, c.b_min, c.b_sum, c.b_n, c.b_max,
                c.t_min, c.t_sum, c.t_n, c.t_max)), '[]')
     FROM (SELECT condition, count(*) AS n,
                  min(battery_percent) AS b_min, sum(battery_percent) AS b_sum,
                  count(battery_percent) AS b_n, max(battery_percent) AS b_max,
                  min(temperature_celsius) AS t_min, sum(temperature_celsius) AS t_sum,
                  count(temperature_celsius) AS t_n, max(temperature_celsius) AS t_max
           FROM devices WHERE state = 'device' GROUP BY condition) c) AS health;

-- name: replica_alive
-- This replica's heartbeat: what keeps the hosts whose streams it holds connected; with
-- the address the other replicas reach it at ($2).
INSERT INTO replicas (replica_id, address) VALUES ($1, $2)
ON CONFLICT (replica_id) DO UPDATE SET seen_at = now(), address = EXCLUDED.address;

-- name: session_relay
-- Where a session's client call is held: its replica, that replica's address, and whether
-- it heartbeat within $2 (NULL address: no such replica row any more). No row: not a
-- session, or one opened before relays were recorded.
SELECT s.replica_id, r.address, COALESCE(r.seen_at > now() - $2::interval, false) AS alive
FROM session_relays s LEFT JOIN replicas r USING (replica_id)
WHERE s.task_id = $1;

-- name: screen_source
-- Where a phone to watch is: a task's ($1, or NULL) phone as its live attempt holds it,
-- else the device $2/$3; whether it is known; its host's replica, that replica's address
-- and whether it heartbeat within $4.
WITH t AS (
    SELECT t.status, a.host_id, a.device_serial AS serial
    FROM tasks t
    LEFT JOIN attempts a ON a.task_id = t.task_id AND a.attempt = t.attempt
                        AND a.state = 'active'
    WHERE t.task_id = $1
), want AS (
    SELECT CASE WHEN $1::uuid IS NULL THEN $2 ELSE (SELECT host_id FROM t) END AS host_id,
           CASE WHEN $1::uuid IS NULL THEN $3 ELSE (SELECT serial FROM t) END AS serial
)
SELECT EXISTS (SELECT 1 FROM t) AS task_found, (SELECT status FROM t) AS task_status,
       w.host_id, w.serial, d.serial IS NOT NULL AS device_found, h.replica_id, r.address,
       COALESCE(r.seen_at > now() - $4::interval, false) AS alive
FROM want w
LEFT JOIN devices d ON d.host_id = w.host_id AND d.serial = w.serial
LEFT JOIN hosts h ON h.host_id = w.host_id
LEFT JOIN replicas r ON r.replica_id = h.replica_id;

-- name: set_presence
-- Streams this replica opened ($3 true) or closed ($3 false) since the last call, one
-- element per host, sorted by host_id (the lock order). A close does not clear a stream
-- that has since opened on another replica.
UPDATE hosts h SET replica_id = CASE WHEN s.opened THEN $1 END, last_seen_at = now()
FROM unnest($2::text[], $3::boolean[]) AS s (host_id, opened)
WHERE h.host_id = s.host_id AND (s.opened OR h.replica_id = $1);

-- name: replica_gone
-- A replica stopping cleanly: its streams are closed, its row goes, and so do the rows of
-- replicas not seen for a day; the hosts those held keep their last heartbeat as their
-- last seen (what --forget-hosts-after counts from), not the older time their stream opened.
WITH closed AS (
    UPDATE hosts SET replica_id = NULL, last_seen_at = now() WHERE replica_id = $1
), dead AS (
    DELETE FROM replicas WHERE replica_id = $1 OR seen_at < now() - interval '1 day'
    RETURNING replica_id, seen_at
)
UPDATE hosts h SET replica_id = NULL, last_seen_at = GREATEST(h.last_seen_at, d.seen_at)
FROM dead d
WHERE h.replica_id = d.replica_id AND d.replica_id <> $1;

-- name: ping
-- A standby (or a primary demoted by a failover) answers, but read-only.
SELECT current_setting('transaction_read_only') = 'on' AS read_only;

-- name: listener_check
-- The LISTEN connection's heartbeat: still listening on every channel, on a writable server.
SELECT array(SELECT pg_listening_channels()) AS channels,
       current_setting('transaction_read_only') = 'on' AS read_only;

-- name: notify
-- Notifications are not durable anyway: no need to wait for this commit's WAL flush.
SELECT set_config('synchronous_commit', 'off', true), count(pg_notify(n.c, n.p))
FROM unnest($1::text[], $2::text[]) AS n (c, p);

-- -- retention (control_plane/retention.py) ----------------------------------------------
-- One batch per statement, so one short transaction. Only one replica at a time runs a
-- batch: each takes the retention advisory lock ("AMC", 1) for its transaction, and a
-- replica that does not get it removes nothing (it looks again at its next round). Rows
-- another transaction holds are skipped (SKIP LOCKED), so a batch never waits on them.

-- name: delete_old_tasks
-- Up to $2 terminal tasks that finished before now() - $1, oldest first, with their
-- attempts (and their steps), events and artifacts (their chunks follow by ON DELETE
-- CASCADE). Locks the tasks first, then what hangs off them (the lock order); no task in
-- flight is looked at.
WITH doomed AS (
    SELECT task_id FROM tasks
    WHERE status IN ('done', 'failed', 'cancelled') AND finished_at < now() - $1::interval
      AND (SELECT pg_try_advisory_xact_lock(4279619, 1))
    ORDER BY finished_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), events AS (
    DELETE FROM task_events e USING doomed d WHERE e.task_id = d.task_id RETURNING 1
), steps_gone AS (
    DELETE FROM attempt_steps s USING doomed d WHERE s.task_id = d.task_id
), attempts_gone AS (
    DELETE FROM attempts a USING doomed d WHERE a.task_id = d.task_id RETURNING 1
), artifacts_gone AS (
    DELETE FROM artifacts x USING doomed d WHERE x.task_id = d.task_id RETURNING 1
), tasks_gone AS (
    DELETE FROM tasks t USING doomed d WHERE t.task_id = d.task_id RETURNING 1
)
SELECT (SELECT count(*) FROM tasks_gone) AS tasks,
       (SELECT count(*) FROM attempts_gone) AS attempts,
       (SELECT count(*) FROM events) AS task_events,
       (SELECT count(*) FROM artifacts_gone) AS artifacts;

-- name: host_registered
-- Asked when an Acquire found none of the devices it offered: is the host there at all?
SELECT EXISTS (SELECT 1 FROM hosts WHERE host_id = $1) AS registered;

-- name: forget_hosts
-- Up to $2 hosts last seen (as list_hosts decides it) before now() - $1 that hold no lease
-- and no device, each removed as RemoveHost would (amc_remove_host: with its devices,
-- recorded in host_events as done by "retention" because $3). A host that registers or
-- opens its stream meanwhile is skipped (its row is locked) or no longer matches
-- (PostgreSQL rechecks the locked row).
WITH due AS (
    SELECT h.host_id,
           (SELECT count(*) FROM devices d WHERE d.host_id = h.host_id) AS devices
    FROM hosts h LEFT JOIN replicas r USING (replica_id)
    WHERE GREATEST(h.last_seen_at, r.seen_at) < now() - $1::interval
      AND NOT EXISTS (SELECT 1 FROM attempts a
                      WHERE a.host_id = h.host_id AND a.state = 'active')
      AND NOT EXISTS (SELECT 1 FROM devices d
                      WHERE d.host_id = h.host_id AND d.task_id IS NOT NULL)
      AND (SELECT pg_try_advisory_xact_lock(4279619, 1))
    ORDER BY h.host_id
    LIMIT $2
    FOR UPDATE OF h SKIP LOCKED
), removed AS (
    SELECT due.devices, x.code
    FROM due CROSS JOIN LATERAL amc_remove_host(due.host_id, $1, 'retention',
                                                'control plane', $3) x
)
SELECT count(*) FILTER (WHERE code = 'removed') AS hosts,
       COALESCE(sum(devices) FILTER (WHERE code = 'removed'), 0)::bigint AS devices
FROM removed;

-- name: put_artifact
-- An artifact and its bytes ($12: the chunks, in order), fenced by the lease: see
-- amc_put_artifact() in schema.sql.
SELECT code, (artifact).* FROM amc_put_artifact($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12);

-- name: list_artifacts
-- A task's artifacts in step order, with whether the task exists (one round trip; a task
-- without artifacts answers one row with artifact_id NULL).
SELECT ar.*
FROM tasks t LEFT JOIN LATERAL (
    SELECT * FROM artifacts a WHERE a.task_id = t.task_id
    ORDER BY a.attempt, a.step_index, a.action_index LIMIT $2
) ar ON true
WHERE t.task_id = $1;

-- name: get_artifact
SELECT * FROM artifacts WHERE task_id = $1 AND artifact_id = $2;

-- name: artifact_chunks
-- Up to $3 chunks of an artifact from chunk $2 on, in order.
SELECT seq, data FROM artifact_chunks WHERE artifact_id = $1 AND seq >= $2
ORDER BY seq LIMIT $3;

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
