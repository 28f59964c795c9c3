-- The partial indexes of the tasks in flight name their first column in their predicate
-- (schema.sql says why: a plan must not read one whole because statistics say it is
-- empty); schema.sql makes them again so. attempts_unacknowledged was read by nothing since
-- renewals lock the tasks of every lease they renew: gone.
DROP INDEX IF EXISTS tasks_dispatch;
DROP INDEX IF EXISTS tasks_running;
DROP INDEX IF EXISTS tasks_running_tags;
DROP INDEX IF EXISTS attempts_unacknowledged;
