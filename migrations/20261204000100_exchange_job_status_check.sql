-- A job's status is one of its lifecycle's states (cx_exchange_server::books::JobStatus), not any
-- text: a statement that writes another name fails instead of leaving a job no sweep will ever
-- find. The server's test `job_status_check_allows_exactly_the_lifecycle` keeps the two lists
-- equal.
ALTER TABLE exchange_jobs ADD CONSTRAINT exchange_jobs_status_check CHECK (status IN (
    'assigned', 'running', 'verifying', 'done', 'expired', 'cancelled', 'refunded', 'failed'));
