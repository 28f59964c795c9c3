-- The control plane's schema: every table and index, as they are now. The functions are
-- each in its aggregate's store/<aggregate>.sql, above the statements that call them; the
-- schema is this file followed by those functions (control_plane.store.schema.FUNCTIONS
-- says in which order).
--
-- control_plane.store.schema applies it to an empty database, and again after the
-- numbered migrations (migrations/) have changed the tables of an older one: so each
-- statement is idempotent (IF NOT EXISTS, OR REPLACE). Tables change only through a
-- migration; functions and indexes are written here and in store/*.sql only (a migration
-- drops the ones whose signature changed or that went away). tests/test_schema.py checks
-- that both paths end in this schema.
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
--   4. devices; several in one transaction: in (host_id, serial) order, held before any
--      is changed (a batched report's, a host's health report's).
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
    draining      boolean NOT NULL DEFAULT false,
    -- The emulator snapshots its devices can load (their `snapshot/<name>` labels, as its
    -- last registration listed them): a task that starts from a snapshot no host has is
    -- refused at submit (one lookup in the GIN index below).
    snapshots     text[] NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS hosts_snapshots ON hosts USING gin (snapshots);

CREATE TABLE IF NOT EXISTS replicas (
    replica_id text PRIMARY KEY,
    started_at timestamptz NOT NULL DEFAULT now(),
    seen_at    timestamptz NOT NULL DEFAULT now(),
    -- host:port where the other replicas reach it (a session's relay); NULL: not said.
    address    text
);

-- The secret the replicas of a farm prove themselves to one another with when one relays
-- a call to another (a live screen's frames: control_plane.auth, REPLICA_SCHEME), never a
-- token's: made by the first replica to start (store/replicas.sql replica_secret), read
-- by each at start-up. One row. Rotated by deleting it and restarting every replica.
CREATE TABLE IF NOT EXISTS replica_secret (
    one    boolean PRIMARY KEY DEFAULT true CHECK (one),
    secret bytea NOT NULL
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
    -- 'cleaning': its host cleans it between leases (set with the lease's end when the
    -- host asks, amc_cleaning).
    condition    text NOT NULL DEFAULT 'ready' CHECK (condition IN
                   ('ready', 'charging_hold', 'too_hot', 'unresponsive', 'booting',
                    'recovering', 'quarantined', 'offline', 'low_storage', 'cleaning')),
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
    -- An interactive session's task (Scheduler.OpenSession): never requeued, whatever
    -- ended its attempt; counted against its caller's open sessions.
    session             boolean NOT NULL DEFAULT false,
    -- The caller's token's name when it submitted the task ('': none): who people read.
    caller_name         text NOT NULL DEFAULT '',
    -- An operator's maintenance session: it may take its phone (selector_serial on the host
    -- its host_id label names) while the phone or its host is cordoned or drained.
    maintenance         boolean NOT NULL DEFAULT false,
    UNIQUE (caller, request_id)
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
        autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02,
        autovacuum_vacuum_cost_limit = 2000);
-- The partial indexes of the tasks in flight each name their first column in their
-- predicate (`group_id IS NOT NULL`, ...), a column that is never NULL in those rows: only a
-- statement that asks for that column's value can use the index, or one that says
-- `group_id IS NOT NULL` itself to read it whole (group_id may be NULL in a table's rows;
-- for a NOT NULL column such as priority PostgreSQL drops that clause as always true, and
-- only a statement asking for a value can use the index). Several partial indexes share a
-- status predicate; with statistics that say none of their rows exist (a burst of work
-- since the last ANALYZE, or none yet) the planner takes a whole one for the cheapest way
-- to anything with that status: every running task read for each lease renewed, every
-- queued task for each Acquire. tests/test_query_plans.py holds the hot statements to
-- their keys.
--
-- The queue, one stretch per group in the order the group hands work out: Acquire reads
-- the heads of the groups its devices match, never the tasks of groups they do not.
CREATE INDEX IF NOT EXISTS tasks_dispatch
    ON tasks (group_id, priority DESC, fair_tag, created_at, task_id)
    WHERE status = 'queued' AND group_id IS NOT NULL;
-- A key's queued tasks by tag: where its next task's tag starts (amc_fair_base).
CREATE INDEX IF NOT EXISTS tasks_fair_queue ON tasks (fairness_key, priority, fair_tag)
    WHERE status = 'queued' AND fairness_key IS NOT NULL;
-- The tasks running, by group: a group with none queued or running may be forgotten
-- (amc_forget_queue_groups); the running tasks counted (the gauges, ListFairShares).
CREATE INDEX IF NOT EXISTS tasks_running ON tasks (group_id)
    WHERE status IN ('assigned', 'dispatched') AND group_id IS NOT NULL;
-- The tasks running, by fairness key: how many phones a key with a cap holds (amc_acquire,
-- acquire_offered, read_tasks).
CREATE INDEX IF NOT EXISTS tasks_running_keys ON tasks (fairness_key)
    WHERE status IN ('assigned', 'dispatched') AND fairness_key IS NOT NULL;
-- The tasks running, by tag: the frontier of service (amc_fair_frontier).
CREATE INDEX IF NOT EXISTS tasks_running_tags ON tasks (priority, fair_tag)
    WHERE status IN ('assigned', 'dispatched') AND priority IS NOT NULL;
CREATE INDEX IF NOT EXISTS tasks_listing ON tasks (created_at DESC, task_id DESC);
CREATE INDEX IF NOT EXISTS tasks_by_host ON tasks (host_id, created_at DESC)
    WHERE host_id IS NOT NULL;
-- A caller's sessions queued or running: what its limit of open sessions counts (one
-- indexed count when a session opens; other tasks are never in it).
CREATE INDEX IF NOT EXISTS tasks_open_sessions ON tasks (caller)
    WHERE session AND status IN ('queued', 'assigned', 'dispatched');
-- Maintenance sessions queued, by their phone: what every Acquire looks up first (empty but
-- for the few seconds such a session waits for its host to ask for work).
CREATE INDEX IF NOT EXISTS tasks_maintenance ON tasks (selector_serial)
    WHERE status = 'queued' AND maintenance AND selector_serial IS NOT NULL;
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
-- The live attempts, by host (its leases counted for a cordon or a removal); the expiry
-- sweep reads them whole. No hot statement names an attempt's state in its WHERE (they
-- reach attempts by lease and ask the row), so none can read it whole instead.
CREATE INDEX IF NOT EXISTS attempts_by_host ON attempts (host_id) WHERE state = 'active';
-- Live attempts with a deadline, by when it passes: what the overrun sweep reads.
CREATE INDEX IF NOT EXISTS attempts_deadline ON attempts (deadline_at)
    WHERE state = 'active' AND deadline_at IS NOT NULL;

-- A running attempt's steps as they ended: each StepResult message its host sent with a
-- renewal of the attempt's live lease, written in bulk by the replica holding the host's
-- stream (amc_keep_steps, control_plane/progress.py), kept with the attempt. What
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
    -- quarantine (Admin.ReleaseDevice). cleaning: the host's own, a step of its clean of a
    -- phone between leases (set_device_health).
    kind       text NOT NULL CHECK (kind IN ('cordon', 'uncordon', 'drain', 'remove',
                                             'recovery', 'release', 'cleaning')),
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
    -- The devices its selector matches by what keeps each from the task (amc_device_use:
    -- 'idle', 'busy', 'offline', 'cordoned', 'host_cordoned', 'host_draining',
    -- 'held:<condition>') -> how many; GetTask's pending reason counts them the same way.
    -- Counted for groups with tasks queued only ({} for the others).
    devices             jsonb NOT NULL,
    -- The count's time: the same for every row of one count.
    counted_at          timestamptz NOT NULL
) WITH (fillfactor = 50);

-- -- transitions that lock several rows: one function each, so one round trip ------------
--
-- Each is in its aggregate's store/<aggregate>.sql (amc_cancel in tasks.sql; amc_acquire
-- in leases.acquire.sql, amc_renew and amc_report in leases.sql, amc_expire and
-- amc_release in leases.end.sql; amc_set_host_cordon and amc_remove_host in hosts.sql;
-- amc_put_artifact in artifacts.sql; the queue's in queue.sql and queue.count.sql). The
-- single-row ones (submit, the presence writes) are statements there.
-- NOTIFY happens after the commit (Hub.publish; a cancel's by Hub.cancel_requested), except
-- in revoke_token (in tokens.sql): a transaction that notifies holds a database-wide lock
-- through its WAL flush, and revocations are rare.

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
    kind         text NOT NULL CHECK (kind IN
        ('screenshot', 'ui_dump', 'screen_recording', 'screen_video', 'pulled_file', 'logcat')),
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

-- -- the app library: APKs and files for tasks to install and push ---------------------
--
-- Content-addressed: the bytes of every app and file are kept once, by their sha256
-- (library_blobs), in bytea chunks of at most 256 KiB as an artifact's are (an APK is a
-- ZIP, compressed already: EXTERNAL, no TOAST compression). An app (library_apps: what
-- its manifest says) and a file (library_files) each name one blob; an APK kept both as
-- an app and as a file is one blob. A blob goes with the last app or file that names it
-- (amc_delete_library_app / _file in store/library.sql). Who uploaded each: the token's
-- name, id (NULL without authentication) and team, for who may remove it.
CREATE TABLE IF NOT EXISTS library_blobs (
    sha256     bytea PRIMARY KEY CHECK (length(sha256) = 32),
    size_bytes bigint NOT NULL CHECK (size_bytes >= 0),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS library_chunks (
    sha256 bytea NOT NULL REFERENCES library_blobs ON DELETE CASCADE,
    seq    integer NOT NULL,
    data   bytea NOT NULL,
    PRIMARY KEY (sha256, seq)
);
ALTER TABLE library_chunks ALTER COLUMN data SET STORAGE EXTERNAL;
CREATE TABLE IF NOT EXISTS library_apps (
    sha256       bytea PRIMARY KEY REFERENCES library_blobs,
    package      text NOT NULL,
    version_name text NOT NULL,
    version_code bigint NOT NULL,
    min_sdk      integer NOT NULL,
    target_sdk   integer NOT NULL,
    file_name    text NOT NULL,
    uploaded_by  text NOT NULL,
    token_id     uuid,
    team         text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
-- An install by package takes its newest upload: the highest version code, then the latest.
CREATE INDEX IF NOT EXISTS library_apps_package
    ON library_apps (package, version_code DESC, created_at DESC);
CREATE TABLE IF NOT EXISTS library_files (
    sha256      bytea PRIMARY KEY REFERENCES library_blobs,
    file_name   text NOT NULL,
    uploaded_by text NOT NULL,
    token_id    uuid,
    team        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

