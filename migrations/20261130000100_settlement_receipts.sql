-- Provider-signed receipts the settlement coordinator has accepted, and the batch that settles
-- each (NULL while pending). One receipt per job and per escrow: a job is paid at most once.
CREATE TABLE settlement_receipts (
    job_id      BYTEA PRIMARY KEY,
    chain_id    BIGINT NOT NULL,
    escrow_id   BIGINT NOT NULL,
    receipt     JSONB NOT NULL,
    batch_id    BIGINT,
    received_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT settlement_receipts_escrow_key UNIQUE (chain_id, escrow_id)
);

CREATE INDEX settlement_receipts_pending ON settlement_receipts (received_at) WHERE batch_id IS NULL;
