-- Jobs and every state transition of their lifecycle. A job is created by the order that asked
-- for it, with the clearing decision (every cost term, every rejected bundle) it was placed by,
-- and the amount it holds on its tab.
CREATE TABLE exchange_jobs (
    id            BYTEA PRIMARY KEY CHECK (length(id) = 32),
    order_digest  BYTEA NOT NULL REFERENCES exchange_orders (digest),
    account       BYTEA NOT NULL CHECK (length(account) = 20),
    chain_id      BIGINT NOT NULL,
    escrow_id     BIGINT NOT NULL,
    model         TEXT NOT NULL,
    status        TEXT NOT NULL,
    bundle_id     TEXT,
    held_wei      NUMERIC(39, 0) NOT NULL CHECK (held_wei >= 0),
    decision      JSONB NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    FOREIGN KEY (chain_id, escrow_id) REFERENCES exchange_tabs (chain_id, escrow_id)
);

CREATE INDEX exchange_jobs_account ON exchange_jobs (account, created_at DESC);

CREATE TABLE exchange_job_events (
    job_id  BYTEA NOT NULL REFERENCES exchange_jobs (id),
    seq     INTEGER NOT NULL,
    status  TEXT NOT NULL,
    detail  JSONB NOT NULL DEFAULT '{}'::jsonb,
    at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, seq)
);
