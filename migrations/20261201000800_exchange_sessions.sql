-- Session keys (SPEC §3): an account's signed SessionGrant lets the bearer of a secret whose
-- SHA-256 is `bearer_hash` spend from one tab through the OpenAI-compatible door, within
-- `spend_cap_wei`, until `expiry_s`. `spent_wei` counts what the session's jobs hold or were
-- charged; `spent_wei <= spend_cap_wei` is kept by one conditional UPDATE per call, as tabs are.
ALTER TABLE exchange_orders DROP CONSTRAINT exchange_orders_kind_check;
ALTER TABLE exchange_orders ADD CONSTRAINT exchange_orders_kind_check
    CHECK (kind IN ('intent', 'reserve', 'rent', 'search', 'session_grant'));

CREATE TABLE exchange_sessions (
    id             BYTEA PRIMARY KEY REFERENCES exchange_orders (digest),
    account        BYTEA NOT NULL CHECK (length(account) = 20),
    chain_id       BIGINT NOT NULL,
    escrow_id      BIGINT NOT NULL,
    spend_cap_wei  NUMERIC(39, 0) NOT NULL CHECK (spend_cap_wei > 0),
    spent_wei      NUMERIC(39, 0) NOT NULL DEFAULT 0 CHECK (spent_wei >= 0),
    expiry_s       BIGINT NOT NULL,
    grant_terms    JSONB NOT NULL,
    bearer_hash    BYTEA NOT NULL CHECK (length(bearer_hash) = 32),
    revoked_at     TIMESTAMPTZ,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    FOREIGN KEY (chain_id, escrow_id) REFERENCES exchange_tabs (chain_id, escrow_id),
    CONSTRAINT exchange_sessions_bearer_unique UNIQUE (bearer_hash),
    CONSTRAINT exchange_sessions_within_cap CHECK (spent_wei <= spend_cap_wei)
);

-- What a provider needs to run a job, when it must be done by, and what came back. A job made by
-- a session call names its session (its order is the session's grant).
ALTER TABLE exchange_jobs
    ADD COLUMN session_id BYTEA REFERENCES exchange_sessions (id),
    ADD COLUMN deadline_s BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN adapter    TEXT,
    ADD COLUMN request    JSONB,
    ADD COLUMN result     JSONB;

-- The deadline sweep reads only unfinished jobs.
CREATE INDEX exchange_jobs_due ON exchange_jobs (deadline_s) WHERE status IN ('assigned', 'running');
