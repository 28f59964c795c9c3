-- Retention (control_plane/retention.py): the index of terminal tasks by finished_at that
-- its batches read, oldest first. Built in the migration's transaction, so writes to tasks
-- wait while it builds: on a large tasks table, create it beforehand, without blocking,
-- with
--   CREATE INDEX CONCURRENTLY tasks_finished ON tasks (finished_at)
--       WHERE status IN ('done', 'failed', 'cancelled');
-- and this statement finds it there.
CREATE INDEX IF NOT EXISTS tasks_finished ON tasks (finished_at)
    WHERE status IN ('done', 'failed', 'cancelled');
