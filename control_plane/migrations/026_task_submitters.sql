-- Who submitted a task, as people read it (Task.submitted_by): the submitting token's name,
-- kept with the task when it is submitted. Tasks submitted before have none ('': their
-- caller's token id is shown, as for a token without a name).
ALTER TABLE tasks ADD COLUMN caller_name text NOT NULL DEFAULT '';
