-- Files pulled from a phone (Action.pull_file) are artifacts of a kind of their own,
-- 'pulled_file'. (A database older than the artifacts table gets it from schema.sql, with
-- this check; the app library's tables are schema.sql's alone.)
DO $$
BEGIN
    IF to_regclass('artifacts') IS NOT NULL THEN
        ALTER TABLE artifacts DROP CONSTRAINT IF EXISTS artifacts_kind_check;
        ALTER TABLE artifacts ADD CONSTRAINT artifacts_kind_check CHECK (kind IN
            ('screenshot', 'ui_dump', 'screen_recording', 'pulled_file'));
    END IF;
END $$;
