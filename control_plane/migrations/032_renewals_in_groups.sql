-- A replica renews several hosts' leases in one statement (a group commit): amc_renew
-- takes each lease's host (a new signature: schema.sql makes it again).
DROP FUNCTION IF EXISTS amc_renew(text, uuid[], interval);
