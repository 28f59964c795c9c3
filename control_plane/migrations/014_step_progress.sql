-- Step progress while a task runs (issue 27.8): amc_renew takes the steps that ended with
-- the renewal (a new signature: schema.sql makes it again, and the attempt_steps table
-- they are kept in).
DROP FUNCTION IF EXISTS amc_renew(text, uuid[], interval);
