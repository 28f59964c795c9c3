-- The statements store/artifacts.py sends, by name: artifacts: the files the steps kept,
-- stored in chunks. store/sql.py loads every store/*.sql (a name is used once in all of
-- them). Lock order, in every statement and function: as the top of schema.sql says.

-- name: put_artifact
-- An artifact and its bytes ($12: the chunks, in order), fenced by the lease: see
-- amc_put_artifact() in schema.sql.
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
