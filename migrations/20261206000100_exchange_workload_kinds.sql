-- The workload kinds a job may name, as a table the exchange fills from its own list at every
-- start (cx_protocol::workload::WorkloadKind::ALL, in Books::open) instead of a CHECK that lists
-- them: a kind added to the protocol then needs no migration of its own, and a job still names
-- only a kind some build of the exchange knew.
CREATE TABLE exchange_workload_kinds (name TEXT PRIMARY KEY);
INSERT INTO exchange_workload_kinds (name) VALUES ('inference'), ('matmul'), ('train');
ALTER TABLE exchange_jobs DROP CONSTRAINT exchange_jobs_workload_check;
-- A job with a request has a workload and one without (a reserve's take-or-pay, a rent's term,
-- a search's fill) has none.
ALTER TABLE exchange_jobs ADD CONSTRAINT exchange_jobs_workload_check CHECK (
    (request IS NULL) = (workload IS NULL));
ALTER TABLE exchange_jobs ADD CONSTRAINT exchange_jobs_workload_kind
    FOREIGN KEY (workload) REFERENCES exchange_workload_kinds (name);
