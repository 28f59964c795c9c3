-- Sessions across replicas (issue 23): where each replica is reached by the others
-- (replicas.address, written with its heartbeat), and which replica holds each session's
-- client call (session_relays, written with the session's task), so that a host whose
-- SessionActions call reached another replica is relayed to it.
ALTER TABLE replicas ADD COLUMN address text;
CREATE TABLE IF NOT EXISTS session_relays (
    task_id    uuid PRIMARY KEY REFERENCES tasks ON DELETE CASCADE,
    replica_id text NOT NULL
);
