-- Emulator snapshots: the names a host's devices can load (their `snapshot/<name>`
-- labels), so that a task starting from a snapshot no host has is refused at submit.
ALTER TABLE hosts ADD COLUMN IF NOT EXISTS snapshots text[] NOT NULL DEFAULT '{}';
