-- Which hosts are connected, at no write per host per interval (issue 11.2).
--
-- A host is connected while it holds its renewal stream open to a live replica, whether or
-- not it holds leases. The replica that holds the stream writes hosts.replica_id when the
-- stream opens and clears it when it closes (batched with other hosts' changes), and
-- heartbeats its own row in `replicas`; a host's last_seen is then its replica's
-- heartbeat. A replica that dies stops heartbeating, and its hosts show disconnected after
-- the window (they reconnect elsewhere, which overwrites replica_id).
CREATE TABLE replicas (
    replica_id text PRIMARY KEY,
    started_at timestamptz NOT NULL DEFAULT now(),
    seen_at    timestamptz NOT NULL DEFAULT now()
);

-- `streams` was never kept by anyone.
ALTER TABLE hosts DROP COLUMN streams;
ALTER TABLE hosts ADD COLUMN replica_id text;
