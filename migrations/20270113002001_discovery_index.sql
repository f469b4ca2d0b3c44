-- `discovery: index`: the meta-tools with every visible tool's name and one line.
ALTER TABLE agents DROP CONSTRAINT agents_discovery_check;
ALTER TABLE agents ADD CONSTRAINT agents_discovery_check
    CHECK (discovery IN ('full', 'search', 'index', 'auto'));
