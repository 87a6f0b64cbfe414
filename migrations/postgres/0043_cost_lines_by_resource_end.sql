-- The newest line of a resource ending by a given hour, in one index probe: an hour after the
-- bill's last line is estimated at what the bill last charged that host.
CREATE INDEX cost_lines_by_resource_end ON cost_lines (resource_key, charge_period_end_ms);
