-- The Unix account running each GPU process, as the agent reports it: who to ask about a GPU
-- held idle when no owner label says.
ALTER TABLE process_windows ADD COLUMN user_name TEXT;

-- Each incident's GPUs as people name them (host, NVML index) and, when held idle, the processes
-- holding them: pid, name, user and owner labels. For the Slack message and the incident page.
ALTER TABLE incidents ADD COLUMN devices_json TEXT NOT NULL DEFAULT '[]';
