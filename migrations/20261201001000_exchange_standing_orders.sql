-- Standing orders: reserves, rents and searches, accepted with both signatures and holding their
-- most on the tab until a provider fills them (the providers' issue) or they end unfilled, when
-- the sweep returns the hold. `ends_s`: the reserve's window end, the rent's term end, the
-- search's deadline.
CREATE TABLE exchange_standing_orders (
    digest      BYTEA PRIMARY KEY REFERENCES exchange_orders (digest),
    kind        TEXT NOT NULL CHECK (kind IN ('reserve', 'rent', 'search')),
    account     BYTEA NOT NULL CHECK (length(account) = 20),
    chain_id    BIGINT NOT NULL,
    escrow_id   BIGINT NOT NULL,
    status      TEXT NOT NULL DEFAULT 'open',
    held_wei    NUMERIC(39, 0) NOT NULL CHECK (held_wei >= 0),
    ends_s      BIGINT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    FOREIGN KEY (chain_id, escrow_id) REFERENCES exchange_tabs (chain_id, escrow_id)
);

CREATE INDEX exchange_standing_orders_due ON exchange_standing_orders (ends_s) WHERE status = 'open';
CREATE INDEX exchange_standing_orders_account ON exchange_standing_orders (account, created_at DESC);
