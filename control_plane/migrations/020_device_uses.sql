-- The queue's counts keep each selector's matching devices by what keeps them from its
-- tasks (amc_device_use), as GetTask's pending reason counts them, in one map instead of
-- three numbers (idle, busy, the rest). queue_group_stats is a cache every replica asks
-- to be recounted every few seconds: it is dropped here and made again by schema.sql,
-- and GetQueue says "not counted yet" until the first count after the upgrade.
DROP TABLE IF EXISTS queue_group_stats;
