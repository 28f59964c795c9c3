-- The statements store/hosts.py sends, by name: hosts and their devices: registration,
-- health, cordons, removal, events. store/sql.py loads every store/*.sql (a name is used
-- once in all of them). Lock order, in every statement and function: as the top of
-- schema.sql says.
--
-- Its functions come first: they are part of the schema (store/schema.py applies them
-- after schema.sql at start-up; CREATE OR REPLACE, so idempotently), and the
-- statements below call them.

-- -- functions --------------------------------------------------------------------------

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

-- -- statements ------------------------------------------------------------------------

-- name: register_host
-- The host (with $10, the snapshots its devices can load), its devices ($3..$9 are
-- parallel arrays, one element per device; labels as JSON text), and the devices it no
-- longer lists marked gone: one statement. The host row
-- first (the lock order: both device writes read `host`, so it is written before them):
-- a removal of the host, which locks it and then deletes its devices, comes wholly before
-- or after (the registration then recreates it). Returns the listed devices held
-- quarantined or recovering (as the statement found them; a device new here is ready): an
-- agent that has just started holds them until an operator releases them.
WITH host AS (
    INSERT INTO hosts (host_id, labels, snapshots) VALUES ($1, $2, $10)
    ON CONFLICT (host_id) DO UPDATE SET labels = EXCLUDED.labels, last_seen_at = now(),
                                        registered_at = now(), snapshots = EXCLUDED.snapshots
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
), gone AS (
    UPDATE devices dv SET state = 'gone', updated_at = now()
    FROM host h
    WHERE dv.host_id = h.host_id AND dv.serial <> ALL ($3::text[]) AND dv.state <> 'gone'
)
SELECT d.serial, d.condition, d.condition_reason
FROM devices d
WHERE d.host_id = $1 AND d.serial = ANY ($3::text[])
  AND d.condition IN ('quarantined', 'recovering')
ORDER BY d.serial;

-- name: known_snapshots
-- Which of the snapshot names $1 some host's devices can load (hosts_snapshots: an index
-- lookup, whatever the farm's size).
SELECT DISTINCT s.name
FROM hosts h, unnest(h.snapshots) AS s (name)
WHERE h.snapshots && $1::text[] AND s.name = ANY ($1::text[]);

-- name: host_registered
-- Asked when an Acquire found none of the devices it offered: is the host there at all?
SELECT EXISTS (SELECT 1 FROM hosts WHERE host_id = $1) AS registered;

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
-- batch. `freed`: how many turned ready from another condition (the host's parked
-- Acquires should look again); a ready phone whose facts moved frees nothing.
-- A device quarantined, recovering, or leaving those is a `recovery` host event, the host
-- its actor (the rows as they were before this statement: `was`). The steps of the cleans
-- that ended ($8, $9: each step's device and its event's reason, in order) are `cleaning`
-- events, before the device's `recovery` event (a failed clean quarantines it).
WITH h AS (
    SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::int[], $6::real[],
                         $7::bool[])
        AS h (serial, condition, reason, battery, temperature, charging)
), was AS (
    -- Held in serial order before any is changed (u reads them from here), as a batched
    -- report holds its devices (report_results): two orders deadlocked.
    SELECT d.serial, d.condition FROM devices d JOIN h USING (serial) WHERE d.host_id = $1
    ORDER BY d.serial FOR UPDATE OF d
), ev AS (
    INSERT INTO host_events (host_id, serial, kind, actor, actor_name, reason)
    SELECT $1, e.serial, e.kind, $1, 'host agent', e.reason
    FROM (SELECT c.serial, 'cleaning' AS kind, c.reason, c.ord
          FROM unnest($8::text[], $9::text[]) WITH ORDINALITY AS c (serial, reason, ord)
          JOIN was USING (serial)
          UNION ALL
          SELECT h.serial, 'recovery',
                 h.condition || CASE WHEN h.reason <> '' THEN ': ' || h.reason ELSE '' END,
                 1000000
          FROM h JOIN was USING (serial)
          WHERE h.condition IN ('quarantined', 'recovering')
             OR was.condition IN ('quarantined', 'recovering')) e
    ORDER BY e.ord
), u AS (
    UPDATE devices d SET condition = h.condition, condition_reason = h.reason,
                         battery_percent = h.battery, temperature_celsius = h.temperature,
                         charging = h.charging, probed_at = now()
    FROM h JOIN was USING (serial)
    WHERE d.host_id = $1 AND d.serial = h.serial
    RETURNING d.serial, d.condition
)
SELECT count(*) FILTER (WHERE u.condition = 'ready' AND was.condition <> 'ready') AS freed,
       count(*) AS updated
FROM u JOIN was USING (serial);

-- name: set_host_cordon
-- Cordon ($2 true) or uncordon a host; $3: it drains too (uncordoning ends a drain).
-- Recorded in host_events as $4 by $5 ($6: the token's name) because $7. No row: no such
-- host. `leases`: how many it holds now. Ordered with Acquire by the host row: see
-- amc_set_host_cordon() above.
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
-- Read by a host's renewal stream when a drain notice for the host comes.
SELECT draining FROM hosts WHERE host_id = $1;

-- name: stream_states
-- What the renewal streams of hosts $1 should have been pushed (domain.StreamState): read
-- when a stream opens (one host) and, for every stream a replica holds, after its LISTEN
-- connection reconnected. One row per registered host: its drain; its devices an operator
-- released from quarantine that its agent has not taken out of quarantine since (still
-- quarantined or recovering, and no `recovery` event of the device out of those
-- conditions after its latest `release` event: set_device_health's events name the
-- condition first; a host telling its phone quarantined again, as it re-registers, has
-- not heard of the release); and the cancels requested on its live leases and not
-- delivered yet (those delivered, the host's renewals answer). Set-based: the devices
-- and live attempts of the hosts; host_events only for a phone still held.
WITH released AS (
    SELECT d.host_id, array_agg(d.serial ORDER BY d.serial) AS serials
    FROM devices d
    WHERE d.host_id = ANY ($1::text[]) AND d.condition IN ('quarantined', 'recovering')
      AND (SELECT e.kind FROM host_events e
           WHERE e.host_id = d.host_id AND e.serial = d.serial
             AND (e.kind = 'release'
                  OR e.kind = 'recovery' AND split_part(e.reason, ':', 1)
                                             NOT IN ('quarantined', 'recovering'))
           ORDER BY e.event_id DESC LIMIT 1) = 'release'
    GROUP BY d.host_id
), cancels AS (
    SELECT a.host_id,
           array_agg(a.lease_id ORDER BY a.lease_id) AS leases,
           array_agg(a.task_id ORDER BY a.lease_id) AS tasks,
           array_agg(a.attempt ORDER BY a.lease_id) AS attempts,
           array_agg(extract(epoch FROM a.cancel_requested_at)::float8 ORDER BY a.lease_id)
               AS epochs
    FROM attempts a
    WHERE a.host_id = ANY ($1::text[]) AND a.state = 'active'
      AND a.cancel_requested_at IS NOT NULL AND a.cancel_delivered_at IS NULL
    GROUP BY a.host_id
)
SELECT h.host_id, h.draining, COALESCE(r.serials, '{}') AS released,
       COALESCE(c.leases, '{}') AS cancel_leases, COALESCE(c.tasks, '{}') AS cancel_tasks,
       COALESCE(c.attempts, '{}') AS cancel_attempts, COALESCE(c.epochs, '{}') AS cancel_epochs
FROM hosts h
LEFT JOIN released r USING (host_id)
LEFT JOIN cancels c USING (host_id)
WHERE h.host_id = ANY ($1::text[]);

-- name: host_events
-- A host's latest $2 events (its devices' too), newest first.
SELECT event_id, host_id, serial, kind, actor, actor_name, reason, at
FROM host_events WHERE host_id = $1
ORDER BY event_id DESC LIMIT $2;
