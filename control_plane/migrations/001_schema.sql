-- The control plane's state. Statuses are the names of control_plane.lifecycle.TaskStatus.

CREATE TABLE tokens (
    token_id    uuid PRIMARY KEY,
    name        text NOT NULL DEFAULT '',
    role        text NOT NULL CHECK (role IN ('client', 'operator', 'host')),
    host_id     text,
    secret_hash bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz,
    CHECK ((role = 'host') = (host_id IS NOT NULL))
);

CREATE TABLE hosts (
    host_id       text PRIMARY KEY,
    labels        jsonb NOT NULL DEFAULT '{}',
    registered_at timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    -- Renewal streams open to this host right now (any replica); kept by those replicas.
    streams       integer NOT NULL DEFAULT 0 CHECK (streams >= 0)
);

CREATE TABLE devices (
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
    PRIMARY KEY (host_id, serial)
);
CREATE UNIQUE INDEX devices_one_task ON devices (task_id) WHERE task_id IS NOT NULL;

CREATE TABLE tasks (
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
    UNIQUE (caller, request_id)
);
-- The queue: what Acquire scans, in the order it hands work out.
CREATE INDEX tasks_queue ON tasks (priority DESC, created_at, task_id) WHERE status = 'queued';
CREATE INDEX tasks_listing ON tasks (created_at DESC, task_id DESC);
CREATE INDEX tasks_by_host ON tasks (host_id, created_at DESC) WHERE host_id IS NOT NULL;

-- One row per assignment of a task to a device; the lease lives on it.
CREATE TABLE attempts (
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
    PRIMARY KEY (task_id, attempt)
);
CREATE INDEX attempts_live ON attempts (lease_expires_at) WHERE state = 'active';
CREATE INDEX attempts_by_host ON attempts (host_id) WHERE state = 'active';

-- Every status change, in order: the audit trail and what checks of the invariants read.
CREATE TABLE task_events (
    event_id    bigserial PRIMARY KEY,
    task_id     uuid NOT NULL REFERENCES tasks,
    attempt     integer NOT NULL,
    kind        text NOT NULL,
    from_status text,
    to_status   text,
    detail      text NOT NULL DEFAULT '',
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX task_events_by_task ON task_events (task_id, event_id);

-- Watchers (WatchTask) learn of every change to a task row.
CREATE FUNCTION amc_notify_task() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('amc_task', NEW.task_id::text);
    RETURN NULL;
END $$;
CREATE TRIGGER tasks_notify AFTER INSERT OR UPDATE ON tasks
    FOR EACH ROW EXECUTE FUNCTION amc_notify_task();
