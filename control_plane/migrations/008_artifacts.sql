-- Artifacts (files the steps kept: screenshots, UI dumps) and their bytes, deleted with
-- their task. schema.sql, applied right after, creates the same tables (IF NOT EXISTS) and
-- the function that stores one (amc_put_artifact); this file only has to exist so the
-- release is recorded: it creates nothing schema.sql does not.
SELECT 1;
