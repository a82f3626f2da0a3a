-- Every signed order the exchange accepted, with both signatures, exactly as received. The
-- (account, chain, nonce) key is what refuses a replay.
CREATE TABLE exchange_orders (
    digest          BYTEA PRIMARY KEY CHECK (length(digest) = 32),
    kind            TEXT NOT NULL CHECK (kind IN ('intent', 'reserve', 'rent', 'search')),
    account         BYTEA NOT NULL CHECK (length(account) = 20),
    chain_id        BIGINT NOT NULL,
    nonce           NUMERIC(20, 0) NOT NULL,
    body            JSONB NOT NULL,
    received_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT exchange_orders_nonce_unique UNIQUE (account, chain_id, nonce)
);
