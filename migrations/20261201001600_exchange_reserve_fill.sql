-- Reserves filled by providers (SPEC §3). Providers bid until the window starts; at the start
-- the sweep awards the reserve to the lowest feasible bid: the order becomes `committed` to that
-- provider's bundle at the bid's rate, the buyer's intents in the window draw `used_ms` of it at
-- no price of their own, and at the window's end the provider's take-or-pay receipt makes it
-- `filled` (a job of its tab, paid rate × compute_ms whatever was drawn). A reserve with no
-- feasible bid at its start is `expired`; one whose provider never claims it is `unclaimed`;
-- either returns its hold.
ALTER TABLE exchange_standing_orders
    ADD COLUMN provider_key_hash BYTEA CHECK (length(provider_key_hash) = 32),
    ADD COLUMN bundle_id TEXT,
    ADD COLUMN rate_wei_per_s BIGINT CHECK (rate_wei_per_s > 0),
    ADD COLUMN used_ms BIGINT NOT NULL DEFAULT 0 CHECK (used_ms >= 0);

-- One bid per provider per reserve (a later bid replaces it until the window starts), signed
-- by the provider's ML-DSA key; `won` or `lost` once awarded, `refusal` saying why it lost.
CREATE TABLE exchange_reserve_bids (
    reserve            BYTEA NOT NULL REFERENCES exchange_standing_orders (digest),
    provider_key_hash  BYTEA NOT NULL CHECK (length(provider_key_hash) = 32),
    bundle_id          TEXT NOT NULL,
    rate_wei_per_s     BIGINT NOT NULL CHECK (rate_wei_per_s > 0),
    bid                JSONB NOT NULL,
    status             TEXT NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'won', 'lost')),
    refusal            JSONB,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (reserve, provider_key_hash)
);

-- The committed reserves a bundle serves (capacity over overlapping windows) and an account's
-- live ones (the draws of its intents).
CREATE INDEX exchange_standing_orders_committed ON exchange_standing_orders (bundle_id)
    WHERE status = 'committed';
CREATE INDEX exchange_standing_orders_drawable ON exchange_standing_orders (account, chain_id, escrow_id)
    WHERE status = 'committed';
