-- The statements store/library.py sends, by name: the app library's apps and files, their
-- bytes kept once by sha256 (library_blobs and library_chunks). store/sql.py loads every
-- store/*.sql (a name is used once in all of them).
--
-- Its functions come first: they are part of the schema (store/schema.py applies them
-- after schema.sql at start-up; CREATE OR REPLACE, so idempotently), and the
-- statements below call them.

-- -- functions --------------------------------------------------------------------------

-- forget a blob no app or file names any more (its chunks follow it by ON DELETE CASCADE).
-- Its row is locked first: an upload of the same bytes holds it (the blob's insert, or its
-- ON CONFLICT update) until its app or file row is committed, so this either waits and
-- then sees that row, or goes first and the upload writes the blob anew.
CREATE OR REPLACE FUNCTION amc_forget_blob(p_sha256 bytea) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM library_blobs WHERE sha256 = p_sha256 FOR UPDATE;
    DELETE FROM library_blobs b WHERE b.sha256 = p_sha256
      AND NOT EXISTS (SELECT 1 FROM library_apps a WHERE a.sha256 = p_sha256)
      AND NOT EXISTS (SELECT 1 FROM library_files f WHERE f.sha256 = p_sha256);
END $$;

-- remove an app (and its bytes, when no file names them): the app removed, or no row.
CREATE OR REPLACE FUNCTION amc_delete_library_app(p_sha256 bytea) RETURNS SETOF library_apps
LANGUAGE plpgsql AS $$
DECLARE
    v library_apps;
BEGIN
    DELETE FROM library_apps WHERE sha256 = p_sha256 RETURNING * INTO v;
    IF v.sha256 IS NOT NULL THEN
        PERFORM amc_forget_blob(p_sha256);
        RETURN NEXT v;
    END IF;
END $$;

-- remove a file (and its bytes, when no app names them): the file removed, or no row.
CREATE OR REPLACE FUNCTION amc_delete_library_file(p_sha256 bytea) RETURNS SETOF library_files
LANGUAGE plpgsql AS $$
DECLARE
    v library_files;
BEGIN
    DELETE FROM library_files WHERE sha256 = p_sha256 RETURNING * INTO v;
    IF v.sha256 IS NOT NULL THEN
        PERFORM amc_forget_blob(p_sha256);
        RETURN NEXT v;
    END IF;
END $$;

-- -- statements ------------------------------------------------------------------------

-- name: library_put_blob
-- The first statement of an upload's transaction: the blob's row, inserted (true: its
-- chunks follow, by COPY) or found and locked (false: the bytes are kept already), so no
-- removal takes it away before the app or file row that names it commits.
INSERT INTO library_blobs (sha256, size_bytes) VALUES ($1, $2)
ON CONFLICT (sha256) DO UPDATE SET size_bytes = library_blobs.size_bytes
RETURNING (xmax = 0) AS inserted;

-- name: library_put_app
-- The app, unless the library has it already (then no row: library_app reads that one).
INSERT INTO library_apps (sha256, package, version_name, version_code, min_sdk, target_sdk,
                          file_name, uploaded_by, token_id, team)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (sha256) DO NOTHING
RETURNING *, $11::bigint AS size_bytes;

-- name: library_put_file
INSERT INTO library_files (sha256, file_name, uploaded_by, token_id, team)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (sha256) DO NOTHING
RETURNING *, $6::bigint AS size_bytes;

-- name: library_app
-- An app by its sha256 ($1), or else the newest of a package ($2): the highest version
-- code, then the latest upload.
SELECT a.*, b.size_bytes FROM library_apps a JOIN library_blobs b USING (sha256)
WHERE ($1::bytea IS NOT NULL AND a.sha256 = $1) OR ($1::bytea IS NULL AND a.package = $2)
ORDER BY a.version_code DESC, a.created_at DESC LIMIT 1;

-- name: library_apps
-- The apps (of one package, $1, or all), by package and newest version first.
SELECT a.*, b.size_bytes FROM library_apps a JOIN library_blobs b USING (sha256)
WHERE $1::text IS NULL OR a.package = $1
ORDER BY a.package, a.version_code DESC, a.created_at DESC LIMIT $2;

-- name: library_file
SELECT f.*, b.size_bytes FROM library_files f JOIN library_blobs b USING (sha256)
WHERE f.sha256 = $1;

-- name: library_files
SELECT f.*, b.size_bytes FROM library_files f JOIN library_blobs b USING (sha256)
ORDER BY f.created_at DESC LIMIT $1;

-- name: library_delete_app
SELECT d.*, 0::bigint AS size_bytes FROM amc_delete_library_app($1) d;

-- name: library_delete_file
SELECT d.*, 0::bigint AS size_bytes FROM amc_delete_library_file($1) d;

-- name: library_blob
SELECT sha256, size_bytes FROM library_blobs WHERE sha256 = $1;

-- name: library_chunks
-- Up to $3 chunks of a blob from chunk $2 on, in order.
SELECT seq, data FROM library_chunks WHERE sha256 = $1 AND seq >= $2 ORDER BY seq LIMIT $3;

-- name: library_references
-- Which of the app ids ($1), packages ($2) and file ids ($3) a spec names the library has:
-- one round trip for a whole submit, whatever it names.
SELECT 'app_id' AS kind, encode(sha256, 'hex') AS ref FROM library_apps WHERE sha256 = ANY($1)
UNION ALL
SELECT DISTINCT 'package', package FROM library_apps WHERE package = ANY($2)
UNION ALL
SELECT 'file_id', encode(sha256, 'hex') FROM library_files WHERE sha256 = ANY($3);
