-- Each owner's value in each dimension, one row apiece, as `owners.labels` holds them: what the
-- hourly reads that group by a dimension (the week's shape, scale-to-zero) join on, instead of
-- parsing every row's owner JSON. Written with each new owner, in the same transaction.
CREATE TABLE owner_values (
    owner_id  BIGINT NOT NULL,
    dimension TEXT   NOT NULL,
    value     TEXT   NOT NULL,
    PRIMARY KEY (owner_id, dimension)
);
CREATE INDEX owner_values_by_dimension ON owner_values (dimension, owner_id);

-- Values that are non-empty texts, as the server reads an owner (Owner::from_key).
INSERT INTO owner_values (owner_id, dimension, value)
SELECT o.id, j.key, j.value #>> '{}'
FROM owners o CROSS JOIN LATERAL jsonb_each(o.labels::jsonb) j
WHERE jsonb_typeof(j.value) = 'string' AND j.value #>> '{}' <> '';
