-- Step progress is written in bulk by the replica that was sent it (keep_steps), no longer
-- by the renewal: amc_renew loses its step arguments (a new signature: schema.sql makes it
-- again).
DROP FUNCTION IF EXISTS amc_renew(text, uuid[], interval, uuid[], integer[], bytea[]);
