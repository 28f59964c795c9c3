-- Hosts and devices from the centre: cordon (no new work), drain (cordon, and the agent told
-- to finish and take no more), remove; host_events records who did what and why.
-- schema.sql, applied right after, creates host_events and replaces amc_acquire.
ALTER TABLE hosts ADD COLUMN IF NOT EXISTS cordoned boolean NOT NULL DEFAULT false;
ALTER TABLE hosts ADD COLUMN IF NOT EXISTS draining boolean NOT NULL DEFAULT false;
ALTER TABLE devices ADD COLUMN IF NOT EXISTS cordoned boolean NOT NULL DEFAULT false;
