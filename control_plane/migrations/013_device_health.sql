-- Device conditions (issue 22): each phone's health as its host's probes last saw it. Only
-- a 'ready' phone takes work (amc_acquire); the rest are held, and pending_reasons counts
-- them by condition. The facts behind the condition (battery, temperature, when probed)
-- are shown to operators. A host that never probes leaves its phones 'ready'.
ALTER TABLE devices
    ADD COLUMN condition text NOT NULL DEFAULT 'ready' CHECK (condition IN
        ('ready', 'charging_hold', 'too_hot', 'unresponsive', 'booting', 'recovering',
         'quarantined', 'offline')),
    ADD COLUMN condition_reason text NOT NULL DEFAULT '',
    ADD COLUMN battery_percent integer,
    ADD COLUMN temperature_celsius real,
    ADD COLUMN charging boolean,
    ADD COLUMN probed_at timestamptz;

-- An infrastructure failure is not the task's (issue 22.3): a run whose phone was lost is
-- requeued apart from max_attempts (tasks.infra_retries counts them), recorded as a
-- device_lost event. amc_leave_attempt takes the budget (a new signature: schema.sql makes
-- it again).
ALTER TABLE tasks ADD COLUMN infra_retries integer NOT NULL DEFAULT 0;
ALTER TABLE task_events DROP CONSTRAINT IF EXISTS task_events_kind_check;
ALTER TABLE task_events ADD CONSTRAINT task_events_kind_check CHECK (kind IN
    ('submit', 'assign', 'acknowledge', 'cancel', 'cancel_requested', 'report', 'expired',
     'released', 'queue_timeout', 'deadline_exceeded', 'device_lost'));
DROP FUNCTION IF EXISTS amc_leave_attempt(tasks, boolean, text, text);

-- Quarantine and recovery (issue 22.4): each step of a host's recovery ladder is a host
-- event of its device, the host its actor. (A database older than host_events gets the
-- table from schema.sql, with this check.)
DO $$
BEGIN
    IF to_regclass('host_events') IS NOT NULL THEN
        ALTER TABLE host_events DROP CONSTRAINT IF EXISTS host_events_kind_check;
        ALTER TABLE host_events ADD CONSTRAINT host_events_kind_check CHECK (kind IN
            ('cordon', 'uncordon', 'drain', 'remove', 'recovery'));
    END IF;
END $$;
