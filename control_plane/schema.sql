-- The control plane's schema: every table, index and function, as they are now.
--
-- control_plane.migrate applies this file to an empty database, and again after the
-- numbered migrations (migrations/) have changed the tables of an older one: so each
-- statement is idempotent (IF NOT EXISTS, OR REPLACE). Tables change only through a
-- migration; functions and indexes are written here only (a migration drops the ones whose
-- signature changed or that went away). tests/test_schema.py checks that both paths end in
-- this schema.
--
-- Statuses are control_plane.lifecycle.TaskStatus; task_events.kind is lifecycle.Event;
-- the codes the functions return are lifecycle's CancelCode, ReportCode and ReleaseCode.
--
-- Lock order, in every function and statement, so that transitions cannot deadlock with
-- each other (tests/test_lock_order.py forces the interleavings):
--   1. task rows; several in one transaction: in task_id order;
--   2. an attempt row only while holding its task's row (FOR UPDATE, FOR NO KEY UPDATE or
--      an UPDATE of it), so no transition waits for an attempt row another one holds
--      (a statement may go task a, its attempt, task b, its attempt: the tasks still come
--      in task_id order);
--   3. the host row: cordon, uncordon, drain and remove take it FOR UPDATE, first thing
--      (and no task after it); Acquire takes it FOR KEY SHARE, after the queued tasks it
--      picked and before the first device it reserves. So a host operation comes wholly
--      before or after an Acquire that assigns (no assignment commits after a cordon
--      returned), while Acquires wait neither for each other nor for the host's
--      registration and presence writes (FOR NO KEY UPDATE);
--   4. devices.
-- A lock taken with SKIP LOCKED never waits, so it cannot close a cycle (Acquire takes
-- queued tasks in queue order that way); all the same the sweeps take theirs in task_id
-- order too. The one statement that writes an attempt row without its task
-- (mark_cancel_delivered) holds nothing else, so it cannot close a cycle either.

-- -- tables ------------------------------------------------------------------------------

CREATE TABLE IF NOT EXISTS tokens (
    token_id    uuid PRIMARY KEY,
    name        text NOT NULL DEFAULT '',
    role        text NOT NULL CHECK (role IN ('client', 'operator', 'host')),
    host_id     text,
    secret_hash bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz,
    -- The fairness key of the tasks submitted with the token (unless a task names its
    -- own); '': 'default'. Client and operator tokens only.
    team        text NOT NULL DEFAULT '',
    CHECK ((role = 'host') = (host_id IS NOT NULL))
);

-- A host is connected while its renewal stream is open on a live replica: that replica
-- sets replica_id when the stream opens and clears it when it closes (batched), and
-- heartbeats its own row in `replicas`; a host's last seen is the later of last_seen_at
-- and that heartbeat. So an idle host costs no write per interval.
CREATE TABLE IF NOT EXISTS hosts (
    host_id       text PRIMARY KEY,
    labels        jsonb NOT NULL DEFAULT '{}',
    registered_at timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    replica_id    text,
    -- Cordoned: given no new work (running tasks go on). Draining: cordoned, and its agent
    -- told over its renewal stream to finish its tasks and take no more. Who did it and
    -- why are in host_events.
    cordoned      boolean NOT NULL DEFAULT false,
    draining      boolean NOT NULL DEFAULT false
);

CREATE TABLE IF NOT EXISTS replicas (
    replica_id text PRIMARY KEY,
    started_at timestamptz NOT NULL DEFAULT now(),
    seen_at    timestamptz NOT NULL DEFAULT now(),
    -- host:port where the other replicas reach it (a session's relay); NULL: not said.
    address    text
);

CREATE TABLE IF NOT EXISTS devices (
    host_id      text NOT NULL REFERENCES hosts,
    serial       text NOT NULL,
    state        text NOT NULL,
    model        text NOT NULL DEFAULT '',
    manufacturer text NOT NULL DEFAULT '',
    sdk          integer NOT NULL DEFAULT 0,
    abi          text NOT NULL DEFAULT '',
    -- Host labels, then the device's own facts and labels over them: what selectors match.
    labels       jsonb NOT NULL DEFAULT '{}',
    -- The task holding this device; set with the attempt, cleared when it ends.
    task_id      uuid,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    -- Given no new work (its running task goes on); who and why: host_events.
    cordoned     boolean NOT NULL DEFAULT false,
    -- Its health as its host's probes last saw it (reported only when it changes): only a
    -- 'ready' device takes work; the facts behind it are NULL until a probe reads them.
    condition    text NOT NULL DEFAULT 'ready' CHECK (condition IN
                   ('ready', 'charging_hold', 'too_hot', 'unresponsive', 'booting',
                    'recovering', 'quarantined', 'offline', 'low_storage')),
    condition_reason    text NOT NULL DEFAULT '',
    battery_percent     integer,
    temperature_celsius real,
    charging            boolean,
    probed_at           timestamptz,
    PRIMARY KEY (host_id, serial)
) WITH (autovacuum_vacuum_scale_factor = 0.05, autovacuum_vacuum_threshold = 500,
        autovacuum_analyze_scale_factor = 0.05);
CREATE UNIQUE INDEX IF NOT EXISTS devices_one_task ON devices (task_id)
    WHERE task_id IS NOT NULL;

CREATE TABLE IF NOT EXISTS tasks (
    task_id             uuid PRIMARY KEY,
    caller              text NOT NULL,
    request_id          text,
    status              text NOT NULL CHECK (status IN
                          ('queued', 'assigned', 'dispatched', 'done', 'failed', 'cancelled')),
    spec                bytea NOT NULL,
    selector_serial     text,
    selector_labels     jsonb NOT NULL DEFAULT '{}',
    priority            integer NOT NULL DEFAULT 0,
    max_attempts        integer NOT NULL CHECK (max_attempts >= 1),
    metadata            jsonb NOT NULL DEFAULT '{}',
    attempt             integer NOT NULL DEFAULT 0,
    host_id             text,
    device_serial       text,
    cancel_requested_at timestamptz,
    cancel_reason       text,
    result              bytea,
    error               text NOT NULL DEFAULT '',
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    finished_at         timestamptz,
    -- The submitter's limits (NULL: none): how long each stay in the queue may last, and
    -- how long each attempt may run. queue_deadline is when the current stay ends (set on
    -- entering the queue: submitted or requeued); the sweep fails the task then.
    queue_timeout       interval,
    deadline            interval,
    queue_deadline      timestamptz,
    -- The queue group (queue_groups: its selector and fairness key) the task waits in
    -- while queued; kept while it runs, so a requeued task goes back to it.
    group_id            bigint,
    -- Whose share of the phones the task is counted in (fair_shares): the request's, the
    -- submitting token's team, or 'default'.
    fairness_key        text NOT NULL DEFAULT 'default',
    -- Its place among the tasks of equal priority that compete for the same phones:
    -- start-time fair queuing over fairness keys (amc_fair_base); lower goes first.
    fair_tag            double precision NOT NULL DEFAULT 0,
    -- Attempts that ended because their phone was lost (device_lost events): requeued
    -- apart from max_attempts, up to the control plane's infrastructure-retry budget.
    infra_retries       integer NOT NULL DEFAULT 0,
    UNIQUE (caller, request_id)
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
        autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02,
        autovacuum_vacuum_cost_limit = 2000);
-- The queue, one stretch per group in the order the group hands work out: Acquire reads
-- the heads of the groups its devices match, never the tasks of groups they do not.
CREATE INDEX IF NOT EXISTS tasks_dispatch
    ON tasks (group_id, priority DESC, fair_tag, created_at, task_id)
    WHERE status = 'queued';
-- A key's queued tasks by tag: where its next task's tag starts (amc_fair_base).
-- (Its predicate names fairness_key so that the planner, with statistics that do not know
-- of a burst of submits yet, cannot take it for the cheapest way to a group's head.)
CREATE INDEX IF NOT EXISTS tasks_fair_queue ON tasks (fairness_key, priority, fair_tag)
    WHERE status = 'queued' AND fairness_key IS NOT NULL;
-- The tasks running, by group: a group with none queued or running may be forgotten
-- (amc_forget_queue_groups); a key's running count for its cap.
CREATE INDEX IF NOT EXISTS tasks_running ON tasks (group_id)
    WHERE status IN ('assigned', 'dispatched');
-- The tasks running, by tag: the frontier of service (amc_fair_frontier).
CREATE INDEX IF NOT EXISTS tasks_running_tags ON tasks (priority, fair_tag)
    WHERE status IN ('assigned', 'dispatched');
CREATE INDEX IF NOT EXISTS tasks_listing ON tasks (created_at DESC, task_id DESC);
CREATE INDEX IF NOT EXISTS tasks_by_host ON tasks (host_id, created_at DESC)
    WHERE host_id IS NOT NULL;
-- Retention: terminal tasks by when they finished, oldest first (control_plane/retention.py
-- deletes them in batches from this end). Tasks in flight are not in it.
CREATE INDEX IF NOT EXISTS tasks_finished ON tasks (finished_at)
    WHERE status IN ('done', 'failed', 'cancelled');
-- Queued tasks with a queue timeout, by when it runs out: what the sweep reads (usually
-- few rows: most tasks have none, and the index holds queued tasks only).
CREATE INDEX IF NOT EXISTS tasks_queue_deadline ON tasks (queue_deadline)
    WHERE status = 'queued' AND queue_deadline IS NOT NULL;

-- The replica holding a session's client call (OpenSession), written with its task: a
-- host whose SessionActions call reached another replica is relayed to this one.
CREATE TABLE IF NOT EXISTS session_relays (
    task_id    uuid PRIMARY KEY REFERENCES tasks ON DELETE CASCADE,
    replica_id text NOT NULL
);

-- One row per assignment of a task to a device; the lease lives on it. Every renewal
-- rewrites lease_expires_at, so no index covers it (renewals stay HOT updates), and
-- half-empty pages leave room for the new row versions.
CREATE TABLE IF NOT EXISTS attempts (
    task_id             uuid NOT NULL REFERENCES tasks,
    attempt             integer NOT NULL,
    lease_id            uuid NOT NULL UNIQUE,
    host_id             text NOT NULL,
    device_serial       text NOT NULL,
    -- active while the lease runs; then done / failed / cancelled (reported),
    -- expired (lease ran out) or released (given back by the host).
    state               text NOT NULL CHECK (state IN
                          ('active', 'done', 'failed', 'cancelled', 'expired', 'released')),
    lease_expires_at    timestamptz NOT NULL,
    acknowledged_at     timestamptz,
    cancel_requested_at timestamptz,
    -- When the host was first told (push or renewal answer): for the cancel-latency split.
    cancel_delivered_at timestamptz,
    outcome             text,
    reported_at         timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    ended_at            timestamptz,
    -- When the run must have ended (the task's deadline after the acknowledgement; NULL:
    -- no deadline). Set once, at the acknowledgement, so later renewals stay HOT updates.
    deadline_at         timestamptz,
    PRIMARY KEY (task_id, attempt)
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.01,
        autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_insert_scale_factor = 0.02,
        autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_limit = 2000);
-- The live attempts: the expiry sweep scans them (same predicate), renewals check them.
CREATE INDEX IF NOT EXISTS attempts_by_host ON attempts (host_id) WHERE state = 'active';
-- The leases a host has not acknowledged yet. No longer read: amc_renew locks the tasks of
-- every lease it renews (issue 21.2); kept until a migration drops it.
CREATE INDEX IF NOT EXISTS attempts_unacknowledged ON attempts (host_id)
    WHERE state = 'active' AND acknowledged_at IS NULL;
-- Live attempts with a deadline, by when it passes: what the overrun sweep reads.
CREATE INDEX IF NOT EXISTS attempts_deadline ON attempts (deadline_at)
    WHERE state = 'active' AND deadline_at IS NOT NULL;

-- A running attempt's steps as they ended (issue 27.8): each StepResult message its host
-- sent with a renewal of the attempt's live lease (amc_renew), kept with the attempt. What
-- GetTask and WatchTask show while the task runs; the terminal report's result stays the
-- record (and the only thing shown once the task ends). Deleted with the task (retention).
CREATE TABLE IF NOT EXISTS attempt_steps (
    task_id    uuid NOT NULL,
    attempt    integer NOT NULL,
    step_index integer NOT NULL,
    step       bytea NOT NULL,
    at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, attempt, step_index)
);

-- Every change of a task, in order: the audit trail and what the checks of the invariants
-- read. `kind` is a lifecycle.Event; which kind may take a task from which status to which
-- is lifecycle.TRANSITIONS (tests/test_model.py checks every row of its runs against it).
CREATE TABLE IF NOT EXISTS task_events (
    event_id    bigserial PRIMARY KEY,
    task_id     uuid NOT NULL REFERENCES tasks,
    attempt     integer NOT NULL,
    kind        text NOT NULL CHECK (kind IN
                  ('submit', 'assign', 'acknowledge', 'cancel', 'cancel_requested', 'report',
                   'expired', 'released', 'queue_timeout', 'deadline_exceeded',
                   'device_lost')),
    from_status text,
    to_status   text,
    detail      text NOT NULL DEFAULT '',
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS task_events_by_task ON task_events (task_id, event_id);

-- What operators did to hosts and devices from the centre (cordon, uncordon, drain,
-- remove): who (the token's id and name), why, when. Kept when the host is removed (no
-- foreign key): the removal is one of its events. `serial` is set for a device's events.
CREATE TABLE IF NOT EXISTS host_events (
    event_id   bigserial PRIMARY KEY,
    host_id    text NOT NULL,
    serial     text,
    -- recovery: the host's own, as its phone is quarantined, recovered or not (the host
    -- is the actor; set_device_health). release: an operator took a device out of
    -- quarantine (Admin.ReleaseDevice).
    kind       text NOT NULL CHECK (kind IN ('cordon', 'uncordon', 'drain', 'remove',
                                             'recovery', 'release')),
    actor      text NOT NULL,
    actor_name text NOT NULL DEFAULT '',
    reason     text NOT NULL DEFAULT '',
    at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS host_events_by_host ON host_events (host_id, event_id);

-- -- the queue's groups and fair shares --------------------------------------------------
--
-- Queued tasks wait in groups: one per (selector, fairness key). A farm's queue has few
-- distinct selectors (hundreds) however many tasks it holds, so Acquire matches its idle
-- devices against the groups (by anchor: one label pair of the selector, or its serial,
-- through an index; then in full) and reads only the heads of the groups that match
-- (tasks_dispatch). Tasks no phone of the host can take are never read: an Acquire costs
-- the same with 0 or 1,000,000 of them queued. Groups are never updated; a submit that
-- finds none makes it (amc_queue_group), and one with no task queued or running for a
-- while is forgotten (amc_forget_queue_groups).
CREATE TABLE IF NOT EXISTS queue_groups (
    group_id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- '' for any serial.
    selector_serial text NOT NULL,
    selector_labels jsonb NOT NULL,
    fairness_key    text NOT NULL,
    -- What an Acquire finds the group by: '#' and the serial, one 'key=value' of the
    -- labels (the longest), or '' for a selector that any device matches.
    anchor          text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (selector_serial, selector_labels, fairness_key)
);
CREATE INDEX IF NOT EXISTS queue_groups_anchor ON queue_groups (anchor);

-- Operators' settings per fairness key (`amc queue set`): its weight (keys of equal
-- priority take turns in proportion) and an optional cap of phones it may hold at once.
-- A key without a row has weight 1 and no cap. Each change is a fair_share_events row.
CREATE TABLE IF NOT EXISTS fair_shares (
    fairness_key text PRIMARY KEY,
    weight       integer NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000),
    max_devices  integer CHECK (max_devices >= 0),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS fair_share_events (
    event_id     bigserial PRIMARY KEY,
    fairness_key text NOT NULL,
    weight       integer NOT NULL,
    max_devices  integer,
    actor        text NOT NULL,
    actor_name   text NOT NULL DEFAULT '',
    reason       text NOT NULL DEFAULT '',
    at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS fair_share_events_by_key ON fair_share_events (fairness_key, event_id);

-- The queue as last counted, per group: its queued tasks (how many, and since when the
-- longest-waiting one waits) and the devices its selector matches by use, as GetQueue
-- shows them. GetQueue, ListFairShares and the queue's metrics read this small table
-- (a row per group) and never the backlog; amc_count_queue recounts it in the background,
-- one replica at a time, every few seconds. No foreign key: a forgotten group's row goes
-- at the next count, and readers join queue_groups. Every count rewrites every row
-- (fillfactor 50: in place, as HOT updates).
CREATE TABLE IF NOT EXISTS queue_group_stats (
    group_id            bigint PRIMARY KEY,
    queued              integer NOT NULL,
    -- When the longest-waiting of them entered the queue; NULL: none queued.
    oldest              timestamptz,
    -- Online, ready, idle and not cordoned on a connected, uncordoned host; online and
    -- busy; the rest (offline, unauthorized, gone, cordoned, held by its condition, on a
    -- disconnected or cordoned host).
    -- Counted for groups with tasks queued only (0 for the others).
    devices_idle        integer NOT NULL,
    devices_busy        integer NOT NULL,
    devices_unavailable integer NOT NULL,
    -- The count's time: the same for every row of one count.
    counted_at          timestamptz NOT NULL
) WITH (fillfactor = 50);

-- The anchor a group is found by (see queue_groups.anchor).
CREATE OR REPLACE FUNCTION amc_group_anchor(p_serial text, p_labels jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_serial <> '' THEN '#' || p_serial
                ELSE COALESCE((SELECT e.k || '=' || e.v FROM jsonb_each_text(p_labels) e (k, v)
                               ORDER BY length(e.k) + length(e.v) DESC, e.k LIMIT 1), '')
           END
$$;

-- Every anchor under which a group that devices with these labels and serials can match
-- is filed: each of their label pairs, each serial, and ''.
CREATE OR REPLACE FUNCTION amc_device_anchors(p_labels jsonb, p_serials text[])
RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY(SELECT e.k || '=' || e.v FROM jsonb_each_text(p_labels) e (k, v))
           || ARRAY['']::text[]
           || ARRAY(SELECT '#' || s FROM unnest(p_serials) s)
$$;

-- The group of a selector (p_serial '' for any) and fairness key, made if there is none.
-- Locked FOR KEY SHARE until the caller commits, so amc_forget_queue_groups cannot forget
-- it under a task being queued in it.
CREATE OR REPLACE FUNCTION amc_queue_group(p_serial text, p_labels jsonb, p_key text)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_group bigint;
BEGIN
    LOOP
        SELECT q.group_id INTO v_group FROM queue_groups q
        WHERE q.selector_serial = p_serial AND q.selector_labels = p_labels
          AND q.fairness_key = p_key
        FOR KEY SHARE;
        IF FOUND THEN
            RETURN v_group;
        END IF;
        INSERT INTO queue_groups (selector_serial, selector_labels, fairness_key, anchor)
        VALUES (p_serial, p_labels, p_key, amc_group_anchor(p_serial, p_labels))
        ON CONFLICT DO NOTHING
        RETURNING group_id INTO v_group;
        IF v_group IS NOT NULL THEN
            RETURN v_group;
        END IF;
        -- Made (or forgotten) by another transaction meanwhile: look again.
    END LOOP;
END $$;

-- Fair shares: start-time fair queuing. Among queued tasks of one priority, the lowest
-- fair_tag goes first. A key's next task is tagged the key's last queued tag, or if that
-- is lower (or it has none queued) the highest tag running (the service's frontier: a
-- key that was idle starts beside the tasks being served, not behind another key's
-- flood), plus 1/weight. So keys with tasks queued take turns in proportion to their
-- weights; a key's flood delays another key's task by about one task on the phones they
-- share; and a key's own tasks keep the order they were submitted in (with one key, the
-- queue is first come, first served, as before fair shares).
CREATE OR REPLACE FUNCTION amc_fair_frontier(p_priority integer)
RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT COALESCE((SELECT tk.fair_tag FROM tasks tk
                     WHERE tk.status IN ('assigned', 'dispatched') AND tk.priority = p_priority
                     ORDER BY tk.priority, tk.fair_tag DESC LIMIT 1), 0)
$$;

CREATE OR REPLACE FUNCTION amc_fair_base(p_key text, p_priority integer)
RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT GREATEST(
        (SELECT tk.fair_tag FROM tasks tk
         WHERE tk.fairness_key = p_key AND tk.status = 'queued' AND tk.priority = p_priority
         ORDER BY tk.fairness_key, tk.priority, tk.fair_tag DESC LIMIT 1),
        amc_fair_frontier(p_priority))
$$;

-- Forgets up to p_limit groups with no task queued or running that were made more than
-- p_idle ago (a group is made again by the next submit that needs it). Each is locked
-- first and checked for tasks after: a submit that took the group FOR KEY SHARE has
-- committed its task by then, or waits and makes the group anew.
CREATE OR REPLACE FUNCTION amc_forget_queue_groups(p_idle interval, p_limit integer)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_group bigint;
    v_forgotten integer := 0;
BEGIN
    FOR v_group IN
        SELECT q.group_id FROM queue_groups q
        WHERE q.created_at < now() - p_idle
          AND NOT EXISTS (SELECT 1 FROM tasks tk
                          WHERE tk.group_id = q.group_id AND tk.status = 'queued')
          AND NOT EXISTS (SELECT 1 FROM tasks tk WHERE tk.group_id = q.group_id
                            AND tk.status IN ('assigned', 'dispatched'))
        ORDER BY q.group_id
        LIMIT p_limit
    LOOP
        PERFORM 1 FROM queue_groups q WHERE q.group_id = v_group FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        -- One NOT EXISTS per partial index (tasks_dispatch, tasks_running): one over the
        -- three statuses has no index and scans the whole table.
        DELETE FROM queue_groups q
        WHERE q.group_id = v_group
          AND NOT EXISTS (SELECT 1 FROM tasks tk
                          WHERE tk.group_id = v_group AND tk.status = 'queued')
          AND NOT EXISTS (SELECT 1 FROM tasks tk WHERE tk.group_id = v_group
                            AND tk.status IN ('assigned', 'dispatched'));
        IF FOUND THEN
            v_forgotten := v_forgotten + 1;
        END IF;
    END LOOP;
    RETURN v_forgotten;
END $$;

-- When the queue was last counted: NULL if it has groups and none was counted yet (a
-- replica just started on a database with work queued); now() if it has no groups (then
-- nothing is queued).
CREATE OR REPLACE FUNCTION amc_queue_counted_at()
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT COALESCE((SELECT max(st.counted_at) FROM queue_group_stats st),
                    CASE WHEN NOT EXISTS (SELECT 1 FROM queue_groups) THEN now() END)
$$;

-- Counts the queue into queue_group_stats, unless another transaction is counting it (a
-- transaction-scoped advisory lock, tried, not waited for) or it was counted less than
-- p_every ago: so replicas that all call it every few seconds count it once per p_every
-- between them. Devices count as connected within p_window (as list_hosts says). One
-- backend, no parallel workers: a count reads every queued task once (about a
-- microsecond each), and the devices once: they are grouped by the labels the queued
-- selectors ask about (a farm's phones have a few hundred distinct such sets, however many
-- phones there are), and each selector is matched against those groups; selectors naming
-- a serial are matched by a hash join on it.
-- Returns one row (groups counted, tasks queued) when it counted, none otherwise.
CREATE OR REPLACE FUNCTION amc_count_queue(p_every interval, p_window interval)
RETURNS TABLE (groups integer, queued bigint)
LANGUAGE plpgsql SET max_parallel_workers_per_gather = 0 AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(4279619, 2)
       OR (SELECT max(st.counted_at) FROM queue_group_stats st) > now() - p_every THEN
        RETURN;
    END IF;
    DELETE FROM queue_group_stats st
    WHERE NOT EXISTS (SELECT 1 FROM queue_groups q WHERE q.group_id = st.group_id);
    RETURN QUERY
    WITH counted AS (
        SELECT tk.group_id, count(*)::integer AS n, min(tk.updated_at) AS oldest
        FROM tasks tk WHERE tk.status = 'queued'
        GROUP BY tk.group_id
    ), grp AS (
        SELECT q.group_id, q.selector_serial, q.selector_labels, COALESCE(c.n, 0) AS n,
               c.oldest
        FROM queue_groups q LEFT JOIN counted c ON c.group_id = q.group_id
    ), sel AS (
        -- Each selector with its labels as 'key<US>value' texts (US, U+001F, is in no
        -- label: validate.string_map refuses control characters).
        SELECT s.selector_serial, s.selector_labels,
               ARRAY(SELECT e.k || chr(31) || e.v
                     FROM jsonb_each_text(s.selector_labels) e (k, v)) AS pairs
        FROM (SELECT DISTINCT g.selector_serial, g.selector_labels FROM grp g WHERE g.n > 0) s
    ), asked AS (
        SELECT COALESCE(array_agg(DISTINCT k.k), '{}') AS keys
        FROM sel CROSS JOIN LATERAL jsonb_object_keys(sel.selector_labels) k (k)
    ), dev AS (
        SELECT d.serial, d.labels,
               CASE WHEN d.state = 'device' AND d.task_id IS NOT NULL THEN 'busy'
                    WHEN d.state = 'device' AND d.task_id IS NULL AND NOT d.cordoned
                         AND NOT h.cordoned AND d.condition = 'ready'
                         AND GREATEST(h.last_seen_at, r.seen_at) > now() - p_window
                    THEN 'idle'
                    ELSE 'unavailable' END AS use
        FROM devices d JOIN hosts h ON h.host_id = d.host_id
        LEFT JOIN replicas r ON r.replica_id = h.replica_id
    ), by_labels AS (
        -- The devices by the labels the selectors ask about (the same texts, in key order).
        SELECT ARRAY(SELECT k.k || chr(31) || (dev.labels ->> k.k)
                     FROM unnest(asked.keys) WITH ORDINALITY k (k, i)
                     WHERE dev.labels ? k.k ORDER BY k.i) AS pairs,
               count(*) FILTER (WHERE dev.use = 'idle') AS idle,
               count(*) FILTER (WHERE dev.use = 'busy') AS busy,
               count(*) FILTER (WHERE dev.use = 'unavailable') AS unavailable
        FROM dev CROSS JOIN asked
        GROUP BY 1
    ), matched AS (
        SELECT sel.selector_serial, sel.selector_labels, sum(b.idle) AS idle,
               sum(b.busy) AS busy, sum(b.unavailable) AS unavailable
        FROM sel JOIN by_labels b ON b.pairs @> sel.pairs
        WHERE sel.selector_serial = ''
        GROUP BY 1, 2
        UNION ALL
        SELECT sel.selector_serial, sel.selector_labels,
               count(*) FILTER (WHERE dev.use = 'idle'),
               count(*) FILTER (WHERE dev.use = 'busy'),
               count(*) FILTER (WHERE dev.use = 'unavailable')
        FROM sel JOIN dev ON dev.serial = sel.selector_serial
        WHERE sel.selector_serial <> '' AND dev.labels @> sel.selector_labels
        GROUP BY 1, 2
    ), written AS (
        INSERT INTO queue_group_stats AS st (group_id, queued, oldest, devices_idle,
                                             devices_busy, devices_unavailable, counted_at)
        SELECT g.group_id, g.n, g.oldest, COALESCE(m.idle, 0), COALESCE(m.busy, 0),
               COALESCE(m.unavailable, 0), now()
        FROM grp g
        LEFT JOIN matched m ON m.selector_serial = g.selector_serial
                           AND m.selector_labels = g.selector_labels
        ON CONFLICT (group_id) DO UPDATE SET
            queued = EXCLUDED.queued, oldest = EXCLUDED.oldest,
            devices_idle = EXCLUDED.devices_idle, devices_busy = EXCLUDED.devices_busy,
            devices_unavailable = EXCLUDED.devices_unavailable,
            counted_at = EXCLUDED.counted_at
        RETURNING st.queued
    )
    SELECT count(*)::integer, COALESCE(sum(w.queued), 0)::bigint FROM written w;
END $$;

-- -- transitions that lock several rows: one function each, so one round trip ------------
--
-- The single-row ones (submit, the presence writes) are statements in store/*.sql.
-- NOTIFY happens after the commit (Hub.publish), except in amc_cancel: a transaction that
-- notifies holds a database-wide lock through its WAL flush, and cancellations are rare.

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

-- cancel: queued -> cancelled at once; assigned/dispatched -> a durable request on the
-- current attempt (pushed to the host's stream); repeated -> no-op; done/failed -> refused.
-- code: cancelled | requested | unchanged | terminal | not_found
CREATE OR REPLACE FUNCTION amc_cancel(p_task uuid, p_reason text)
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

-- -- artifacts: files the steps kept (screenshots, UI dumps) -----------------------------
--
-- One row per artifact, its bytes in artifact_chunks (bytea rows of at most 256 KiB, so
-- a read streams them a few at a time). Both go with their task: deleting a task deletes
-- them. The bytes are PNG or XML: PNG is compressed already, so the chunks are stored
-- without TOAST compression (EXTERNAL), which also keeps a write from compressing 10 MiB
-- in the database for nothing. See docs/architecture.md for why bytea, not large objects.
CREATE TABLE IF NOT EXISTS artifacts (
    artifact_id  uuid PRIMARY KEY,
    task_id      uuid NOT NULL REFERENCES tasks ON DELETE CASCADE,
    attempt      integer NOT NULL,
    step_index   integer NOT NULL,
    action_index integer NOT NULL,
    step_name    text NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('screenshot', 'ui_dump', 'screen_recording')),
    size_bytes   bigint NOT NULL CHECK (size_bytes >= 0),
    sha256       bytea NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- One per action of an attempt: a repeated upload finds the one stored.
    UNIQUE (task_id, attempt, step_index, action_index)
);
CREATE TABLE IF NOT EXISTS artifact_chunks (
    artifact_id uuid NOT NULL REFERENCES artifacts ON DELETE CASCADE,
    seq         integer NOT NULL,
    data        bytea NOT NULL,
    PRIMARY KEY (artifact_id, seq)
);
ALTER TABLE artifact_chunks ALTER COLUMN data SET STORAGE EXTERNAL;

-- keep an artifact: fenced like a report, in one round trip. Stored only under the live
-- lease of the task's current attempt, as its host (p_host NULL: any host); the task row
-- is held (FOR SHARE) so a report cannot end the attempt half-way. Codes: stored,
-- repeated (this action's artifact with the same sha256 is there already: that one is
-- answered), different (a different one is there), foreign (no such lease for this task
-- and attempt), other_host (the lease is another host's), stale (the lease ended, ran out
-- or was replaced).
CREATE OR REPLACE FUNCTION amc_put_artifact(p_host text, p_task uuid, p_attempt integer,
                                            p_lease uuid, p_id uuid, p_step integer,
                                            p_action integer, p_step_name text, p_kind text,
                                            p_size bigint, p_sha256 bytea, p_chunks bytea[])
RETURNS TABLE (code text, artifact artifacts)
LANGUAGE plpgsql AS $$
DECLARE
    t tasks;
    a attempts;
    v artifacts;
BEGIN
    SELECT * INTO t FROM tasks tk WHERE tk.task_id = p_task FOR SHARE;
    SELECT * INTO a FROM attempts att WHERE att.lease_id = p_lease;
    IF t.task_id IS NULL OR a.task_id IS NULL OR a.task_id <> p_task
       OR a.attempt <> p_attempt THEN
        code := 'foreign';
    ELSIF p_host IS NOT NULL AND a.host_id <> p_host THEN
        code := 'other_host';
    ELSIF a.state <> 'active' OR a.lease_expires_at <= now() OR t.attempt <> a.attempt
          OR t.status NOT IN ('assigned', 'dispatched') THEN
        code := 'stale';
    ELSE
        INSERT INTO artifacts (artifact_id, task_id, attempt, step_index, action_index,
                               step_name, kind, size_bytes, sha256)
        VALUES (p_id, p_task, p_attempt, p_step, p_action, p_step_name, p_kind, p_size,
                p_sha256)
        ON CONFLICT (task_id, attempt, step_index, action_index) DO NOTHING
        RETURNING * INTO v;
        IF v.artifact_id IS NOT NULL THEN
            INSERT INTO artifact_chunks (artifact_id, seq, data)
            SELECT p_id, c.seq - 1, c.data
            FROM unnest(p_chunks) WITH ORDINALITY AS c(data, seq);
            code := 'stored';
        ELSE
            SELECT * INTO v FROM artifacts ar
            WHERE ar.task_id = p_task AND ar.attempt = p_attempt AND ar.step_index = p_step
              AND ar.action_index = p_action;
            code := CASE WHEN v.sha256 = p_sha256 AND v.kind = p_kind THEN 'repeated'
                         ELSE 'different' END;
        END IF;
        artifact := v;
    END IF;
    RETURN NEXT;
END $$;

-- cordon (p_cordon) or uncordon a host; p_drain: it drains too (uncordoning ends a drain).
-- Recorded in host_events as p_kind by p_actor (p_actor_name: the token's name) because
-- p_reason. No row: no such host; else `leases`: how many the host holds now. The host row
-- is locked FOR UPDATE first: an Acquire reserving devices of the host holds it FOR KEY
-- SHARE, so this waits for it to commit and counts its leases (a statement of its own, so
-- a snapshot taken after the lock), and a later Acquire sees the cordon: no assignment
-- commits after a cordon returned (issue 21.4).
CREATE OR REPLACE FUNCTION amc_set_host_cordon(p_host text, p_cordon boolean,
                                               p_drain boolean, p_kind text, p_actor text,
                                               p_actor_name text, p_reason text)
RETURNS TABLE (host_id text, leases integer)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM hosts h WHERE h.host_id = p_host FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    UPDATE hosts h SET cordoned = p_cordon, draining = (p_cordon AND (p_drain OR h.draining))
    WHERE h.host_id = p_host;
    INSERT INTO host_events (host_id, kind, actor, actor_name, reason)
    VALUES (p_host, p_kind, p_actor, p_actor_name, p_reason);
    RETURN QUERY
    SELECT p_host, (SELECT count(*) FROM attempts a
                    WHERE a.host_id = p_host AND a.state = 'active')::integer;
END $$;

-- remove: forget a host and its devices, if it is disconnected (no stream open on a live
-- replica and not seen within p_window) and holds no lease; recorded in host_events.
-- code: removed | not_found | connected | leases (then `leases` says how many).
-- The host row is locked first, FOR UPDATE (a registration of the same host waits, then
-- recreates it); an Acquire reserving its devices holds it FOR KEY SHARE, so the leases are
-- counted (a statement of its own: a snapshot taken after the lock) once it committed, and
-- an Acquire that comes later finds the host gone (issue 21.4).
-- Used by RemoveHost, and meant for anything else that forgets hosts.
CREATE OR REPLACE FUNCTION amc_remove_host(p_host text, p_window interval, p_actor text,
                                           p_actor_name text, p_reason text)
RETURNS TABLE (code text, leases integer)
LANGUAGE plpgsql AS $$
DECLARE
    h record;
BEGIN
    leases := 0;
    SELECT hs.host_id, GREATEST(hs.last_seen_at, r.seen_at) > now() - p_window AS connected
    INTO h
    FROM hosts hs LEFT JOIN replicas r USING (replica_id)
    WHERE hs.host_id = p_host
    FOR UPDATE OF hs;
    IF NOT FOUND THEN
        code := 'not_found';
    ELSIF h.connected THEN
        code := 'connected';
    ELSE
        SELECT count(*) INTO leases FROM attempts att
        WHERE att.host_id = p_host AND att.state = 'active';
        IF leases > 0 THEN
            code := 'leases';
        ELSE
            DELETE FROM devices dv WHERE dv.host_id = p_host;
            DELETE FROM hosts hs WHERE hs.host_id = p_host;
            INSERT INTO host_events (host_id, kind, actor, actor_name, reason)
            VALUES (p_host, 'remove', p_actor, p_actor_name, p_reason);
            code := 'removed';
        END IF;
    END IF;
    RETURN NEXT;
END $$;
