-- A session's task says so (tasks.session): nothing requeues one, whatever ended its
-- attempt (a device_lost give-back counted apart from max_attempts did), and a caller's
-- open sessions are counted against its limit (the index tasks_open_sessions, schema.sql).
-- The sessions opened before are the tasks with a relay row.
ALTER TABLE tasks ADD COLUMN session boolean NOT NULL DEFAULT false;
UPDATE tasks SET session = true WHERE task_id IN (SELECT task_id FROM session_relays);
