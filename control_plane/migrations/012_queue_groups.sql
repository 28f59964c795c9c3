-- Dispatch by queue group and fair shares (issue 20): queued tasks wait in groups of one
-- selector and fairness key (queue_groups), Acquire reads only the heads of the groups its
-- devices match (tasks_dispatch), and keys take turns by fair tag (fair_shares). The
-- tables churn all day, so they are vacuumed and analysed after far fewer changes than
-- PostgreSQL's defaults (a tenth of the table), which left the hot paths reading dead rows
-- on stale plans.
ALTER TABLE tasks
    ADD COLUMN group_id bigint,
    ADD COLUMN fairness_key text NOT NULL DEFAULT 'default',
    ADD COLUMN fair_tag double precision NOT NULL DEFAULT 0;

-- Replaced by tasks_dispatch (schema.sql, with the other new indexes).
DROP INDEX IF EXISTS tasks_queue;

ALTER TABLE tasks SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
                       autovacuum_vacuum_insert_scale_factor = 0.02,
                       autovacuum_analyze_scale_factor = 0.02,
                       autovacuum_vacuum_cost_limit = 2000);
ALTER TABLE attempts SET (autovacuum_vacuum_scale_factor = 0.01,
                          autovacuum_vacuum_threshold = 1000,
                          autovacuum_vacuum_insert_scale_factor = 0.02,
                          autovacuum_analyze_scale_factor = 0.02,
                          autovacuum_vacuum_cost_limit = 2000);
ALTER TABLE devices SET (autovacuum_vacuum_scale_factor = 0.05, autovacuum_vacuum_threshold = 500,
                         autovacuum_analyze_scale_factor = 0.05);

-- Tokens get a team: the fairness key of the tasks submitted with them.
ALTER TABLE tokens ADD COLUMN team text NOT NULL DEFAULT '';

-- after schema.sql (it creates the new tables: queue_groups, queue_group_stats, fair_shares)

-- The tasks in flight go into the groups of their selectors (key 'default', tag 0: among
-- equal priorities they keep their order, by age).
INSERT INTO queue_groups (selector_serial, selector_labels, fairness_key, anchor)
SELECT DISTINCT COALESCE(tk.selector_serial, ''), tk.selector_labels, 'default',
       CASE WHEN COALESCE(tk.selector_serial, '') <> '' THEN '#' || tk.selector_serial
            ELSE COALESCE((SELECT e.k || '=' || e.v FROM jsonb_each_text(tk.selector_labels) e (k, v)
                           ORDER BY length(e.k) + length(e.v) DESC, e.k LIMIT 1), '')
       END
FROM tasks tk
WHERE tk.status IN ('queued', 'assigned', 'dispatched');

UPDATE tasks tk SET group_id = q.group_id
FROM queue_groups q
WHERE tk.status IN ('queued', 'assigned', 'dispatched')
  AND q.selector_serial = COALESCE(tk.selector_serial, '')
  AND q.selector_labels = tk.selector_labels
  AND q.fairness_key = 'default';
