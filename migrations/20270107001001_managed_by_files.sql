-- `managed: files` in an agent's policy file (or a group's entry in groups.yaml): the admin UI
-- and API refuse to change it; only `policy apply` does.
ALTER TABLE agents ADD COLUMN managed_by text CHECK (managed_by IN ('files'));
ALTER TABLE tool_groups ADD COLUMN managed_by text CHECK (managed_by IN ('files'));
