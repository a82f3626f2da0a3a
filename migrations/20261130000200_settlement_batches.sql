-- Settlement batches and their per-chain parts: the outbox of what is sent to chains.
-- A part is written 'created' before any signer is asked, 'signed' (with the aggregated FROST
-- signature) before anything is sent to its chain, 'posted' once the chain has it.
CREATE TABLE settlement_batches (
    id         BIGSERIAL PRIMARY KEY,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE settlement_batch_parts (
    batch_id   BIGINT NOT NULL REFERENCES settlement_batches (id),
    chain_id   BIGINT NOT NULL,
    nonce      BIGINT NOT NULL,
    digest     BYTEA NOT NULL,
    body       JSONB NOT NULL,
    status     TEXT NOT NULL,
    signature  BYTEA,
    tx_hash    BYTEA,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (batch_id, chain_id),
    -- One batch per nonce per chain: the contract accepts each nonce once, so must we.
    CONSTRAINT settlement_batch_parts_nonce_key UNIQUE (chain_id, nonce),
    CONSTRAINT settlement_batch_parts_status_check CHECK (status IN ('created', 'signed', 'posted')),
    CONSTRAINT settlement_batch_parts_signed_check CHECK (status = 'created' OR signature IS NOT NULL)
);

CREATE INDEX settlement_batch_parts_unfinished ON settlement_batch_parts (batch_id) WHERE status <> 'posted';

ALTER TABLE settlement_receipts
    ADD CONSTRAINT settlement_receipts_batch_fkey FOREIGN KEY (batch_id) REFERENCES settlement_batches (id);
