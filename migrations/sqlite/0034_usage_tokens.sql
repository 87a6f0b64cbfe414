-- Tokens an endpoint read and generated in a counted period, where its serving code counts
-- them: what cost per 1M tokens is computed from. NULL where the count said nothing of tokens.
ALTER TABLE usage_counts ADD COLUMN input_tokens BIGINT;
ALTER TABLE usage_counts ADD COLUMN output_tokens BIGINT;
