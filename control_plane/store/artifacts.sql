-- The statements store/artifacts.py sends, by name: artifacts: the files the steps kept,
-- stored in chunks. store/sql.py loads every store/*.sql (a name is used once in all of
-- them). Lock order, in every statement and function: as the top of schema.sql says.
--
-- Its functions come first: they are part of the schema (store/schema.py applies them
-- after schema.sql at start-up; CREATE OR REPLACE, so idempotently), and the
-- statements below call them.

-- -- functions --------------------------------------------------------------------------

-- keep an artifact: fenced like a report, in one round trip. Stored only under the live
-- lease of the task's current attempt, as its host (p_host NULL: any host); the task row
-- is held (FOR SHARE) so a report cannot end the attempt half-way. Codes: stored,
-- repeated (this action's artifact with the same sha256 is there already: that one is
-- answered), different (a different one is there), foreign (no such lease for this task
-- and attempt), other_host (the lease is another host's), stale (the lease ended, ran out
-- or was replaced).
CREATE OR REPLACE FUNCTION amc_put_artifact(p_host text, p_task uuid, p_attempt integer,
                                            p_lease uuid, p_id uuid, p_step integer,
                                            p_action integer, p_step_name text, p_kind text,
                                            p_size bigint, p_sha256 bytea, p_chunks bytea[])
RETURNS TABLE (code text, artifact artifacts)
LANGUAGE plpgsql AS $$
DECLARE
    t tasks;
    a attempts;
    v artifacts;
BEGIN
    SELECT * INTO t FROM tasks tk WHERE tk.task_id = p_task FOR SHARE;
    SELECT * INTO a FROM attempts att WHERE att.lease_id = p_lease;
    IF t.task_id IS NULL OR a.task_id IS NULL OR a.task_id <> p_task
       OR a.attempt <> p_attempt THEN
        code := 'foreign';
    ELSIF p_host IS NOT NULL AND a.host_id <> p_host THEN
        code := 'other_host';
    ELSIF a.state <> 'active' OR a.lease_expires_at <= now() OR t.attempt <> a.attempt
          OR t.status NOT IN ('assigned', 'dispatched') THEN
        code := 'stale';
    ELSE
        INSERT INTO artifacts (artifact_id, task_id, attempt, step_index, action_index,
                               step_name, kind, size_bytes, sha256)
        VALUES (p_id, p_task, p_attempt, p_step, p_action, p_step_name, p_kind, p_size,
                p_sha256)
        ON CONFLICT (task_id, attempt, step_index, action_index) DO NOTHING
        RETURNING * INTO v;
        IF v.artifact_id IS NOT NULL THEN
            INSERT INTO artifact_chunks (artifact_id, seq, data)
            SELECT p_id, c.seq - 1, c.data
            FROM unnest(p_chunks) WITH ORDINALITY AS c(data, seq);
            code := 'stored';
        ELSE
            SELECT * INTO v FROM artifacts ar
            WHERE ar.task_id = p_task AND ar.attempt = p_attempt AND ar.step_index = p_step
              AND ar.action_index = p_action;
            code := CASE WHEN v.sha256 = p_sha256 AND v.kind = p_kind THEN 'repeated'
                         ELSE 'different' END;
        END IF;
        artifact := v;
    END IF;
    RETURN NEXT;
END $$;

-- -- statements ------------------------------------------------------------------------

-- name: put_artifact
-- An artifact and its bytes ($12: the chunks, in order), fenced by the lease: see
-- amc_put_artifact() above.
SELECT code, (artifact).* FROM amc_put_artifact($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12);

-- name: list_artifacts
-- A task's artifacts in step order, with whether the task exists (one round trip; a task
-- without artifacts answers one row with artifact_id NULL).
SELECT ar.*
FROM tasks t LEFT JOIN LATERAL (
    SELECT * FROM artifacts a WHERE a.task_id = t.task_id
    ORDER BY a.attempt, a.step_index, a.action_index LIMIT $2
) ar ON true
WHERE t.task_id = $1;

-- name: get_artifact
SELECT * FROM artifacts WHERE task_id = $1 AND artifact_id = $2;

-- name: artifact_chunks
-- Up to $3 chunks of an artifact from chunk $2 on, in order.
SELECT seq, data FROM artifact_chunks WHERE artifact_id = $1 AND seq >= $2
ORDER BY seq LIMIT $3;
