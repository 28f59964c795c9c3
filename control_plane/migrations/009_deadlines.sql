-- Deadlines and queue timeouts: the submitter's limits on a task, when the current stay in
-- the queue ends, when an attempt's run must have ended, and the two task_events kinds
-- that end a task for them (lifecycle.Event.QUEUE_TIMEOUT, DEADLINE_EXCEEDED).
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS queue_timeout interval;
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS deadline interval;
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS queue_deadline timestamptz;
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS deadline_at timestamptz;

ALTER TABLE task_events DROP CONSTRAINT IF EXISTS task_events_kind_check;
ALTER TABLE task_events ADD CONSTRAINT task_events_kind_check CHECK (kind IN
    ('submit', 'assign', 'acknowledge', 'cancel', 'cancel_requested', 'report', 'expired',
     'released', 'queue_timeout', 'deadline_exceeded'));
