-- The statements store/replicas.py sends, by name: replicas and presence: which replica
-- holds a host's stream or a session's call. store/sql.py loads every store/*.sql (a name
-- is used once in all of them). Lock order, in every statement and function: as the top of
-- schema.sql says.

-- name: replica_alive
-- This replica's heartbeat: what keeps the hosts whose streams it holds connected; with
-- the address the other replicas reach it at ($2).
INSERT INTO replicas (replica_id, address) VALUES ($1, $2)
ON CONFLICT (replica_id) DO UPDATE SET seen_at = now(), address = EXCLUDED.address;

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

-- name: session_join
-- A host's join of session $1 under lease $2, in one round trip: the task (whether it is a
-- session, its status and attempt); the lease's attempt (NULL: no such lease of the task),
-- its host, its state and whether it is live by this database's clock (an expired lease
-- the sweep has not ended yet is not); and where the session's client call is held: its
-- replica, that replica's address and whether it heartbeat within $3. No row: no such task.
SELECT t.session, t.status, t.attempt AS task_attempt, a.attempt, a.host_id,
       a.state = 'active' AND a.lease_expires_at > now() AS live,
       s.replica_id, r.address, COALESCE(r.seen_at > now() - $3::interval, false) AS alive
FROM tasks t
LEFT JOIN attempts a ON a.task_id = t.task_id AND a.lease_id = $2
LEFT JOIN session_relays s ON s.task_id = t.task_id
LEFT JOIN replicas r ON r.replica_id = s.replica_id
WHERE t.task_id = $1;

-- name: session_relay
-- Where session $1's client call is held, for a call of its client that reached another
-- replica (an adb door's streams): whether the task is a session, who opened it, the
-- replica holding its call, that replica's address and whether it heartbeat within $2.
-- No row: no such task.
SELECT t.session, t.caller, s.replica_id, r.address,
       COALESCE(r.seen_at > now() - $2::interval, false) AS alive
FROM tasks t
LEFT JOIN session_relays s ON s.task_id = t.task_id
LEFT JOIN replicas r ON r.replica_id = s.replica_id
WHERE t.task_id = $1;

-- name: screen_source
-- Where a phone to watch is: a task's ($1, or NULL) phone as its live attempt holds it,
-- else the device $2/$3; whether it is known; its host's replica, that replica's address
-- and whether it heartbeat within $4. For a task, also what its watch is bound to (its
-- current attempt's number) and who may watch it: its submitter (the caller), that
-- token's team, and whether it is a console Control session (metadata control).
WITH t AS (
    SELECT t.status, t.attempt, a.host_id, a.device_serial AS serial, t.caller,
           COALESCE(k.team, '') AS team, t.metadata->>'control' AS control
    FROM tasks t
    LEFT JOIN attempts a ON a.task_id = t.task_id AND a.attempt = t.attempt
                        AND a.state = 'active'
    LEFT JOIN tokens k ON k.token_id = (CASE WHEN t.caller ~ '^[0-9a-f-]{36}$'
                                             THEN t.caller::uuid END)
    WHERE t.task_id = $1
), want AS (
    SELECT CASE WHEN $1::uuid IS NULL THEN $2 ELSE (SELECT host_id FROM t) END AS host_id,
           CASE WHEN $1::uuid IS NULL THEN $3 ELSE (SELECT serial FROM t) END AS serial
)
SELECT EXISTS (SELECT 1 FROM t) AS task_found, (SELECT status FROM t) AS task_status,
       (SELECT attempt FROM t) AS attempt, (SELECT caller FROM t) AS caller,
       (SELECT team FROM t) AS team, (SELECT control FROM t) AS control,
       w.host_id, w.serial, d.serial IS NOT NULL AS device_found, h.replica_id, r.address,
       COALESCE(r.seen_at > now() - $4::interval, false) AS alive
FROM want w
LEFT JOIN devices d ON d.host_id = w.host_id AND d.serial = w.serial
LEFT JOIN hosts h ON h.host_id = w.host_id
LEFT JOIN replicas r ON r.replica_id = h.replica_id;

-- name: screen_attempt
-- A watched task's current attempt, read again when the task changes and on a timer (no
-- row: the task is gone): its status, the attempt's number and its live attempt's phone.
SELECT t.status AS task_status, t.attempt, a.host_id, a.device_serial AS serial
FROM tasks t
LEFT JOIN attempts a ON a.task_id = t.task_id AND a.attempt = t.attempt AND a.state = 'active'
WHERE t.task_id = $1;

-- name: replica_secret
-- The secret the replicas of the farm prove themselves to one another with: $1 if there
-- was none (the first replica to start makes it), else the one there. A conflict's DO
-- UPDATE returns the row it met, even one a start running at the same time committed.
INSERT INTO replica_secret (secret) VALUES ($1)
ON CONFLICT (one) DO UPDATE SET secret = replica_secret.secret
RETURNING secret;
