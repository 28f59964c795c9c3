-- The queue's count: the part of store/queue.py's SQL that would make queue.sql too long to
-- read (an aggregate's SQL over 400 lines goes on in store/<aggregate>.<part>.sql): how a
-- device is classified for a queued task (amc_device_use, which GetTask's pending reason
-- uses too) and the background count GetQueue reads (amc_count_queue). Lock order, in
-- every statement and function: as the top of schema.sql says.
--
-- Its functions come first: they are part of the schema (store/schema.py applies them
-- after schema.sql at start-up; CREATE OR REPLACE, so idempotently), and the statement
-- below calls them.

-- -- functions --------------------------------------------------------------------------

-- What keeps a device from a queued task whose selector matches it: the first that applies
-- of its host draining ('host_draining'; a draining host is cordoned too), its host
-- cordoned, itself cordoned, offline (not 'device' to adb, or its host not seen within
-- p_window: not connected), held by its condition ('held:' and the condition: charging,
-- too hot, quarantined, ...), busy with a task; else 'idle', what amc_acquire takes. The one
-- classification of why a task waits: GetTask's pending reason (read_tasks, live) and
-- GetQueue's counts (amc_count_queue, in the background) both count devices by it, and
-- control_plane/pending.py words what they count. Inlined where it is called.
CREATE OR REPLACE FUNCTION amc_device_use(
    p_host_draining boolean, p_host_cordoned boolean, p_cordoned boolean, p_state text,
    p_seen_at timestamptz, p_window interval, p_condition text, p_task uuid)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_host_draining THEN 'host_draining'
                WHEN p_host_cordoned THEN 'host_cordoned'
                WHEN p_cordoned THEN 'cordoned'
                WHEN p_state <> 'device' OR NOT COALESCE(p_seen_at > now() - p_window, false)
                THEN 'offline'
                WHEN p_condition <> 'ready' THEN 'held:' || p_condition
                WHEN p_task IS NOT NULL THEN 'busy'
                ELSE 'idle' END
$$;

-- Counts the queue into queue_group_stats, unless another transaction is counting it (a
-- transaction-scoped advisory lock, tried, not waited for) or it was counted less than
-- p_every ago: so replicas that all call it every few seconds count it once per p_every
-- between them. Devices count as connected within p_window (as list_hosts says). One
-- backend, no parallel workers: a count reads every queued task once (about a
-- microsecond each), and the devices once, each classified by amc_device_use (as GetTask's
-- pending reason counts them): they are grouped by that and by the labels the queued
-- selectors ask about (a farm's phones have a few hundred distinct such sets, however many
-- phones there are), and each selector is matched against those groups; selectors naming
-- a serial are matched by a hash join on it. Each group's devices are written as a map,
-- use -> devices.
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
        FROM tasks tk WHERE tk.status = 'queued' AND tk.group_id IS NOT NULL
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
               amc_device_use(h.draining, h.cordoned, d.cordoned, d.state,
                              GREATEST(h.last_seen_at, r.seen_at), p_window, d.condition,
                              d.task_id) AS use
        FROM devices d JOIN hosts h ON h.host_id = d.host_id
        LEFT JOIN replicas r ON r.replica_id = h.replica_id
    ), by_labels AS (
        -- The devices by use and by the labels the selectors ask about (the same texts, in
        -- key order).
        SELECT ARRAY(SELECT k.k || chr(31) || (dev.labels ->> k.k)
                     FROM unnest(asked.keys) WITH ORDINALITY k (k, i)
                     WHERE dev.labels ? k.k ORDER BY k.i) AS pairs,
               dev.use, count(*) AS n
        FROM dev CROSS JOIN asked
        GROUP BY 1, 2
    ), matched AS (
        SELECT sel.selector_serial, sel.selector_labels, b.use, sum(b.n) AS n
        FROM sel JOIN by_labels b ON b.pairs @> sel.pairs
        WHERE sel.selector_serial = ''
        GROUP BY 1, 2, 3
        UNION ALL
        SELECT sel.selector_serial, sel.selector_labels, dev.use, count(*)
        FROM sel JOIN dev ON dev.serial = sel.selector_serial
        WHERE sel.selector_serial <> '' AND dev.labels @> sel.selector_labels
        GROUP BY 1, 2, 3
    ), uses AS (
        SELECT m.selector_serial, m.selector_labels, jsonb_object_agg(m.use, m.n) AS devices
        FROM matched m
        GROUP BY 1, 2
    ), written AS (
        INSERT INTO queue_group_stats AS st (group_id, queued, oldest, devices, counted_at)
        SELECT g.group_id, g.n, g.oldest, COALESCE(u.devices, '{}'), now()
        FROM grp g
        LEFT JOIN uses u ON u.selector_serial = g.selector_serial
                        AND u.selector_labels = g.selector_labels
        ON CONFLICT (group_id) DO UPDATE SET
            queued = EXCLUDED.queued, oldest = EXCLUDED.oldest,
            devices = EXCLUDED.devices, counted_at = EXCLUDED.counted_at
        RETURNING st.queued
    )
    SELECT count(*)::integer, COALESCE(sum(w.queued), 0)::bigint FROM written w;
END $$;

-- -- statements ------------------------------------------------------------------------

-- name: count_queue
-- Recount the queue into queue_group_stats if it is older than $1 and no other
-- transaction is counting it (amc_count_queue); devices connected within $2. One row
-- (groups, queued) when it counted; none otherwise.
SELECT * FROM amc_count_queue($1, $2);
