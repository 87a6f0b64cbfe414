-- Owners as data: the owner dimensions come from the config's schema, so rollups no longer hold
-- one column per dimension. Each distinct owner (every dimension's value at once) is one row of
-- `owners`, keyed by one text: a JSON object of its non-empty values, keys in order, no spaces
-- (`{"model":"llama","team":"research"}`, `{}` for nobody), the form the server writes.
-- Rollup rows refer to it by id. Rows keep their identity, so every amount is kept as it was.

CREATE TABLE owners (
    id      BIGSERIAL PRIMARY KEY,
    labels  TEXT      NOT NULL UNIQUE
);

-- Each combination of the four old columns, with its text.
CREATE TEMP TABLE owner_map AS
SELECT DISTINCT model, experiment, endpoint, team,
    '{' || concat_ws(',',
        CASE WHEN endpoint <> '' THEN '"endpoint":' || to_json(endpoint)::text END,
        CASE WHEN experiment <> '' THEN '"experiment":' || to_json(experiment)::text END,
        CASE WHEN model <> '' THEN '"model":' || to_json(model)::text END,
        CASE WHEN team <> '' THEN '"team":' || to_json(team)::text END) || '}' AS labels
FROM (SELECT model, experiment, endpoint, team FROM rollup_hours
      UNION SELECT model, experiment, endpoint, team FROM rollup_days
      UNION SELECT model, experiment, endpoint, team FROM rollup_host_days) AS combos;

INSERT INTO owners (labels) SELECT DISTINCT labels FROM owner_map ORDER BY labels;

ALTER TABLE rollup_hours ADD COLUMN owner_id BIGINT;
UPDATE rollup_hours r SET owner_id = o.id
FROM owner_map m JOIN owners o ON o.labels = m.labels
WHERE m.model = r.model AND m.experiment = r.experiment
    AND m.endpoint = r.endpoint AND m.team = r.team;
ALTER TABLE rollup_hours ALTER COLUMN owner_id SET NOT NULL;
DROP INDEX rollup_hours_experiments;
ALTER TABLE rollup_hours DROP COLUMN model, DROP COLUMN experiment, DROP COLUMN endpoint,
    DROP COLUMN team;

ALTER TABLE rollup_days ADD COLUMN owner_id BIGINT;
UPDATE rollup_days r SET owner_id = o.id
FROM owner_map m JOIN owners o ON o.labels = m.labels
WHERE m.model = r.model AND m.experiment = r.experiment
    AND m.endpoint = r.endpoint AND m.team = r.team;
ALTER TABLE rollup_days ALTER COLUMN owner_id SET NOT NULL;
ALTER TABLE rollup_days DROP COLUMN model, DROP COLUMN experiment, DROP COLUMN endpoint,
    DROP COLUMN team;

ALTER TABLE rollup_host_days ADD COLUMN owner_id BIGINT;
UPDATE rollup_host_days r SET owner_id = o.id
FROM owner_map m JOIN owners o ON o.labels = m.labels
WHERE m.model = r.model AND m.experiment = r.experiment
    AND m.endpoint = r.endpoint AND m.team = r.team;
ALTER TABLE rollup_host_days ALTER COLUMN owner_id SET NOT NULL;
ALTER TABLE rollup_host_days DROP COLUMN model, DROP COLUMN experiment, DROP COLUMN endpoint,
    DROP COLUMN team;

DROP TABLE owner_map;
