-- The chain watcher's progress per chain (the next block to read, so a restart resumes and
-- replays nothing twice), and the settlement batches it saw land.
CREATE TABLE exchange_chain_cursors (
    chain_id    BIGINT PRIMARY KEY,
    next_block  BIGINT NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE exchange_batches_seen (
    chain_id        BIGINT NOT NULL,
    nonce           BIGINT NOT NULL,
    receipts_root   BYTEA NOT NULL,
    balances_root   BYTEA NOT NULL,
    settled_wei     NUMERIC(78, 0) NOT NULL,
    block           BIGINT NOT NULL,
    PRIMARY KEY (chain_id, nonce)
);
