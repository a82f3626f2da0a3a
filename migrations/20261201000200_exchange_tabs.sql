-- Tabs: escrows an agent opened on chain (Escrow.openJob), mirrored by the chain watcher, and
-- what the exchange has committed of each to jobs. `held_wei <= amount_wei` is the invariant that
-- concurrent intents cannot break: every hold is one conditional UPDATE.
CREATE TABLE exchange_tabs (
    chain_id      BIGINT NOT NULL,
    escrow_id     BIGINT NOT NULL,
    buyer         BYTEA NOT NULL CHECK (length(buyer) = 20),
    amount_wei    NUMERIC(39, 0) NOT NULL CHECK (amount_wei >= 0),
    held_wei      NUMERIC(39, 0) NOT NULL DEFAULT 0 CHECK (held_wei >= 0),
    deadline_s    BIGINT NOT NULL,
    ref           BYTEA NOT NULL CHECK (length(ref) = 32),
    status        TEXT NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'reclaimed')),
    opened_block  BIGINT NOT NULL,
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, escrow_id),
    CONSTRAINT exchange_tabs_within_amount CHECK (held_wei <= amount_wei)
);

CREATE INDEX exchange_tabs_buyer ON exchange_tabs (buyer);
