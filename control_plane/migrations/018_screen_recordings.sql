-- Screen recordings (issue 24): a task's recording of its phone's screen is an artifact of
-- a kind of its own, 'screen_recording' (an animated PNG). (A database older than the
-- artifacts table gets it from schema.sql, with this check.)
DO $$
BEGIN
    IF to_regclass('artifacts') IS NOT NULL THEN
        ALTER TABLE artifacts DROP CONSTRAINT IF EXISTS artifacts_kind_check;
        ALTER TABLE artifacts ADD CONSTRAINT artifacts_kind_check CHECK (kind IN
            ('screenshot', 'ui_dump', 'screen_recording'));
    END IF;
END $$;
