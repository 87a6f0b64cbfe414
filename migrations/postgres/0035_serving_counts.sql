-- Requests and tokens the agents read from the serving engines on their hosts (vLLM, TGI,
-- Triton), summed per host, endpoint, model and hour as reports arrive. Written in the report's
-- own transaction, so a report counted once is counted once here. NULL where the engine does
-- not expose the count (a sum with an unknown part is unknown). `model` is '' where the engine
-- names none (TGI).
CREATE TABLE serving_counts (
    host_id       BIGINT NOT NULL,
    endpoint      TEXT   NOT NULL,
    model         TEXT   NOT NULL,
    hour_ms       BIGINT NOT NULL,
    engine        TEXT   NOT NULL,
    requests      BIGINT,
    input_tokens  BIGINT,
    output_tokens BIGINT,
    PRIMARY KEY (host_id, endpoint, model, hour_ms)
);
CREATE INDEX serving_counts_by_hour ON serving_counts (hour_ms);
