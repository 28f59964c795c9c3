-- Screen recordings as video: a task's recording of its phone's H.264 stream is an MP4,
-- an artifact of a kind of its own, 'screen_video' (an animated PNG stays
-- 'screen_recording'). The check also names 'pulled_file' (the app library's files pulled
-- from a phone, migration 022), so that it is the same whichever of the two a database got
-- first. (A database older than the artifacts table gets it from schema.sql, with this
-- check.)
DO $$
BEGIN
    IF to_regclass('artifacts') IS NOT NULL THEN
        ALTER TABLE artifacts DROP CONSTRAINT IF EXISTS artifacts_kind_check;
        ALTER TABLE artifacts ADD CONSTRAINT artifacts_kind_check CHECK (kind IN
            ('screenshot', 'ui_dump', 'screen_recording', 'screen_video', 'pulled_file'));
    END IF;
END $$;
