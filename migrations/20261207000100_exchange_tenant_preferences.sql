-- Per-tenant preferences (SPEC §10): each account's one-bit sign delta over the shared quote
-- table (cx_exchange::pricing::tenant::DeltaParts as JSON: cells, sign words, per-layer scales and
-- biases), learned from its market orders. The exchange keeps them in memory and writes the
-- changed ones here every sweep; they are read back at start.
CREATE TABLE exchange_tenant_preferences (
    account       BYTEA PRIMARY KEY CHECK (length(account) = 20),
    delta         JSONB NOT NULL,
    observations  BIGINT NOT NULL CHECK (observations >= 0),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);
