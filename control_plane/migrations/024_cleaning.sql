-- Phones cleaned between leases: a device's condition may be 'cleaning' (its host cleans
-- it; set with the lease's end when the host asks), and each step of a clean is a
-- 'cleaning' host event.
ALTER TABLE devices DROP CONSTRAINT IF EXISTS devices_condition_check;
ALTER TABLE devices ADD CONSTRAINT devices_condition_check CHECK (condition IN
    ('ready', 'charging_hold', 'too_hot', 'unresponsive', 'booting', 'recovering',
     'quarantined', 'offline', 'low_storage', 'cleaning'));

DO $$
BEGIN
    IF to_regclass('host_events') IS NOT NULL THEN
        ALTER TABLE host_events DROP CONSTRAINT IF EXISTS host_events_kind_check;
        ALTER TABLE host_events ADD CONSTRAINT host_events_kind_check CHECK (kind IN
            ('cordon', 'uncordon', 'drain', 'remove', 'recovery', 'release', 'cleaning'));
    END IF;
END $$;

-- A lease's end takes whether its host cleans the phone next (p_cleans): new signatures,
-- which schema.sql creates.
DROP FUNCTION IF EXISTS amc_report(text, uuid, integer, uuid, text, bytea, text);
DROP FUNCTION IF EXISTS amc_release(text, uuid, text);
DROP FUNCTION IF EXISTS amc_give_back(text, uuid, text, text, integer);
