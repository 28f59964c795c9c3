-- An attempt's phone log (logcat, gzipped) is an artifact of a kind of its own, 'logcat'.
-- The check names every kind before it too (migrations 022 and 025), so that it is the
-- same whichever order a database got them in. (A database older than the artifacts table
-- gets it from schema.sql, with this check.)
DO $$
BEGIN
    IF to_regclass('artifacts') IS NOT NULL THEN
        ALTER TABLE artifacts DROP CONSTRAINT IF EXISTS artifacts_kind_check;
        ALTER TABLE artifacts ADD CONSTRAINT artifacts_kind_check CHECK (kind IN
            ('screenshot', 'ui_dump', 'screen_recording', 'screen_video', 'pulled_file',
             'logcat'));
    END IF;
END $$;
