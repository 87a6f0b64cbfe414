-- An owner's text is as long as its dimensions' values: many dimensions with long values (labels
-- are up to 256 bytes each, bill tags longer) pass the ~2.7 KB a btree entry may hold, and the
-- insert would fail. The unique key is the text's MD5 instead; the server looks owners up by it.
ALTER TABLE owners DROP CONSTRAINT owners_labels_key;
CREATE UNIQUE INDEX owners_labels_md5 ON owners (md5(labels));
