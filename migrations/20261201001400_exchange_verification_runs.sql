-- Verification by replication (T1, T3): a run is a job of its own — the same request, model,
-- adapter, class and deadline as the job it verifies, placed on another provider's bundle — whose
-- id is derived from that job's (cx_protocol::replica::run_job_id). Run 0 is the verified job
-- itself (`verifies` NULL). A job with runs waits in `verifying` once its result is in, until the
-- majority of its runs' output hashes decides which are `done` (paid) and which `failed`.
ALTER TABLE exchange_jobs
    ADD COLUMN verifies BYTEA REFERENCES exchange_jobs (id),
    ADD COLUMN run      SMALLINT NOT NULL DEFAULT 0 CHECK (run BETWEEN 0 AND 2),
    ADD CONSTRAINT exchange_jobs_run_of CHECK ((verifies IS NULL) = (run = 0));

CREATE UNIQUE INDEX exchange_jobs_runs ON exchange_jobs (verifies, run) WHERE verifies IS NOT NULL;

-- A verifying job past its deadline without a decision is refunded by the sweep.
DROP INDEX exchange_jobs_due;
CREATE INDEX exchange_jobs_due ON exchange_jobs (deadline_s)
    WHERE status IN ('assigned', 'running', 'verifying');

-- Slashing evidence the exchange found (an outvoted class-D replica), kept until the committee
-- has signed the slash and it landed on chain: an outbox, so a crash loses no evidence and a
-- retry never slashes twice (the registry refuses an evidence hash it has seen).
CREATE TABLE exchange_slashes (
    evidence_hash BYTEA PRIMARY KEY CHECK (length(evidence_hash) = 32),
    job_id        BYTEA NOT NULL REFERENCES exchange_jobs (id),
    chain_id      BIGINT NOT NULL,
    evidence      JSONB NOT NULL,
    status        TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'posted', 'failed')),
    tx_hash       BYTEA,
    attempts      INTEGER NOT NULL DEFAULT 0,
    last_error    TEXT,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX exchange_slashes_pending ON exchange_slashes (created_at) WHERE status = 'pending';
