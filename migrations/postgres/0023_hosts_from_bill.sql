-- A GPU instance the bill charges and no agent has reported gets a host of its own, known from
-- the bill alone (1), so its cost is attributed (as unmonitored, to the owner its tags name)
-- rather than left aside. An agent that later reports the same instance has its own host, which
-- takes the instance's bill lines from then on (attribution prefers it).
ALTER TABLE hosts ADD COLUMN from_bill BIGINT NOT NULL DEFAULT 0;
