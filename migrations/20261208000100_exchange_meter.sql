-- The meter (SPEC §10): one row per routed job once it ended (done, expired, refunded, failed,
-- cancelled) — which arm served it, what it cost and how long it took against the order's terms,
-- and the regime belief it was routed under. The task router folds rows into its outcome models by
-- `seq` (at start, every row; then the new ones every sweep), so what it learned is exactly what
-- was metered, across restarts.
CREATE TABLE exchange_meter (
    seq           BIGSERIAL PRIMARY KEY,
    job_id        BYTEA NOT NULL UNIQUE REFERENCES exchange_jobs (id),
    request       TEXT NOT NULL,
    account       BYTEA NOT NULL CHECK (length(account) = 20),
    arm           TEXT NOT NULL CHECK (arm <> ''),
    cost_wei      NUMERIC(39, 0) NOT NULL CHECK (cost_wei >= 0),
    latency_s     DOUBLE PRECISION NOT NULL CHECK (latency_s >= 0),
    quality       DOUBLE PRECISION NOT NULL CHECK (quality BETWEEN 0 AND 1),
    deadline_s    DOUBLE PRECISION NOT NULL CHECK (deadline_s > 0),
    max_cost_wei  NUMERIC(39, 0),
    tier          TEXT NOT NULL,
    belief        JSONB NOT NULL,
    -- x and the chosen arm's p at routing (what a contextual bandit learns against).
    features      JSONB,
    profile       JSONB,
    metered_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Routed jobs (their decision names a route), by when they last changed: the metering pass reads
-- those that changed lately instead of every job ever routed.
CREATE INDEX exchange_jobs_routed ON exchange_jobs (updated_at)
    WHERE verifies IS NULL AND decision ? 'route';

-- Routed jobs still open, by arm: what the router counts as outcomes on their way (each sweep).
CREATE INDEX exchange_jobs_routed_open ON exchange_jobs ((decision->'route'->>'arm'))
    WHERE verifies IS NULL AND decision ? 'route' AND status IN ('assigned', 'running', 'verifying');
