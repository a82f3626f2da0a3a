-- Residency claims the work contradicted (SPEC §4, §8: residency is self-revealing). A job is
-- cleared onto a bundle because of what its last report said it holds (the decision's zero
-- base-load or adapter-load term); when that job then misses its deadline, or its provider
-- fetches the adapter it said it held, the claim was false and is recorded here against the
-- provider. One row per job and kind of evidence.
CREATE TABLE exchange_residency_misses (
    job_id            BYTEA NOT NULL REFERENCES exchange_jobs (id),
    provider_key_hash BYTEA NOT NULL REFERENCES exchange_providers (key_hash),
    bundle_id         TEXT NOT NULL,
    claimed           TEXT NOT NULL CHECK (claimed IN ('base', 'adapter', 'base+adapter')),
    evidence          TEXT NOT NULL CHECK (evidence IN ('deadline', 'fetched')),
    estimate_ms       BIGINT NOT NULL CHECK (estimate_ms >= 0),
    elapsed_ms        BIGINT NOT NULL CHECK (elapsed_ms >= 0),
    at                TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, evidence)
);

CREATE INDEX exchange_residency_misses_provider ON exchange_residency_misses (provider_key_hash, at DESC);
