-- The statements store/queue.py sends, by name: the queue's counts, fair shares and the
-- farm's gauges. store/sql.py loads every store/*.sql (a name is used once in all of
-- them). Lock order, in every statement and function: as the top of schema.sql says.
--
-- Its functions come first: they are part of the schema (store/schema.py applies them
-- after schema.sql at start-up; CREATE OR REPLACE, so idempotently), and the
-- statements below call them.

-- -- functions --------------------------------------------------------------------------

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

-- -- statements ------------------------------------------------------------------------

-- name: queue_groups
-- The queue by selector as last counted (amc_count_queue): the $1 largest selectors (their
-- groups of every fairness key summed), each with the devices it matched, by use (a map,
-- amc_device_use's; every group of one selector has the same); the queued total and when
-- it was counted. Reads queue_group_stats (a row per group), never the backlog. Serial ''
-- is none.
WITH s AS (
    SELECT q.selector_serial, q.selector_labels, sum(st.queued)::bigint AS n,
           min(st.oldest) AS oldest, (array_agg(st.devices))[1] AS devices
    FROM queue_group_stats st JOIN queue_groups q ON q.group_id = st.group_id
    WHERE st.queued > 0
    GROUP BY q.selector_serial, q.selector_labels
)
SELECT NULLIF(g.selector_serial, '') AS selector_serial, g.selector_labels, g.n, g.oldest,
       g.devices,
       (SELECT COALESCE(sum(n), 0) FROM s)::bigint AS total,
       (SELECT amc_queue_counted_at()) AS counted_at
FROM (SELECT * FROM s ORDER BY n DESC, oldest LIMIT $1) g
ORDER BY g.n DESC, g.oldest;

-- name: queue_counted_at
-- When the queue was last counted, for a reading that found nothing queued.
SELECT amc_queue_counted_at() AS counted_at;

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
    WHERE tk.status IN ('assigned', 'dispatched') AND tk.group_id IS NOT NULL
      AND ($1::text IS NULL OR q.fairness_key = $1)
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
           WHERE status IN ('assigned', 'dispatched') AND group_id IS NOT NULL
           GROUP BY status) s) AS tasks,
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
                 WHERE tk.status IN ('assigned', 'dispatched') AND tk.group_id IS NOT NULL
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
