-- How a host is bought (on_demand | spot), for pricing it from the rate card before its bill.
ALTER TABLE hosts ADD COLUMN lifecycle TEXT;
