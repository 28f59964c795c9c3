-- A low-storage hold (issue 22): a phone whose free storage is below its host's low mark is
-- held as 'low_storage' until it is above the resume mark.
ALTER TABLE devices DROP CONSTRAINT IF EXISTS devices_condition_check;
ALTER TABLE devices ADD CONSTRAINT devices_condition_check CHECK (condition IN
    ('ready', 'charging_hold', 'too_hot', 'unresponsive', 'booting', 'recovering',
     'quarantined', 'offline', 'low_storage'));

-- An operator releasing a quarantined device (Admin.ReleaseDevice) is a host event of its
-- own kind, 'release'. (A database older than host_events gets the table from schema.sql,
-- with this check.)
DO $$
BEGIN
    IF to_regclass('host_events') IS NOT NULL THEN
        ALTER TABLE host_events DROP CONSTRAINT IF EXISTS host_events_kind_check;
        ALTER TABLE host_events ADD CONSTRAINT host_events_kind_check CHECK (kind IN
            ('cordon', 'uncordon', 'drain', 'remove', 'recovery', 'release'));
    END IF;
END $$;
