-- The currency an incident's price and waste are in: that of its hosts' bill, or of the rate
-- card. Incidents recorded before were priced without one; their bills were in dollars.
ALTER TABLE incidents ADD COLUMN currency TEXT NOT NULL DEFAULT 'USD';
