-- An operator's maintenance session (SessionOpen.maintenance) may take its phone while the
-- phone or its host is cordoned or drained: amc_acquire finds the queued ones by their
-- phone (the index tasks_maintenance, schema.sql).
ALTER TABLE tasks ADD COLUMN maintenance boolean NOT NULL DEFAULT false;
