-- PostgreSQL's 0022 keys owners by the MD5 of their text, which a btree entry's size limit
-- needs there. SQLite has no such limit: its owners stay keyed by the text itself.
SELECT 1;
