-- A database of the releases before schema.sql (their migrations 001 to 006, squashed into
-- it) gets what schema.sql has and they did not. schema.sql, applied right after in the
-- same transaction, then replaces every function.

-- task_events.kind is one of control_plane.lifecycle.Event.
ALTER TABLE task_events ADD CONSTRAINT task_events_kind_check CHECK (kind IN
    ('submit', 'assign', 'acknowledge', 'cancel', 'cancel_requested', 'report', 'expired',
     'released'));

-- Functions that went away, or whose signature changed (OR REPLACE cannot change that):
-- amc_acquire returns the idle devices itself (amc_acquire_idle wrapped it); amc_expire
-- only sweeps, and amc_release ends one lease after checking its host in the same
-- statement (amc_expire_offers wrapped amc_expire, which did both behind a flag);
-- amc_renew returns the ids as uuids.
DROP FUNCTION amc_acquire_idle(text, text[], interval);
DROP FUNCTION amc_acquire(text, text[], interval);
DROP FUNCTION amc_expire_offers(integer, uuid, text);
DROP FUNCTION amc_expire(integer, uuid, text);
DROP FUNCTION amc_renew(text, uuid[], interval);
