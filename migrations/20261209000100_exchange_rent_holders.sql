-- A rent's holders (SPEC §3). A rent that tolerates a miss probability ε is placed on as many
-- capable providers as 1 − ε needs (distinct providers, cheapest ρ first, each provider's miss
-- probability estimated from its observed residency), each holding the state for the whole
-- term at its own ρ and under its own share of ε, observed every sweep and claiming its own
-- term as a job of the tab (holder 0's job id is the rent's digest, holder k's derived from it:
-- `cx_protocol::holders`). The rent's order keeps what the holders share (|a|, the start) and
-- its hold, which each claim lowers by that holder's term; it is `filled` once every holder
-- claimed, and what no holder claimed returns at the grace's end (`unclaimed`).
CREATE TABLE exchange_rent_holders (
    rent                BYTEA NOT NULL REFERENCES exchange_standing_orders (digest),
    holder              SMALLINT NOT NULL CHECK (holder BETWEEN 0 AND 3),
    job_id              BYTEA NOT NULL UNIQUE CHECK (length(job_id) = 32),
    provider_key_hash   BYTEA NOT NULL CHECK (length(provider_key_hash) = 32),
    bundle_id           TEXT NOT NULL,
    rho_wei_per_gb_hour NUMERIC(39, 0) NOT NULL CHECK (rho_wei_per_gb_hour >= 0),
    -- This holder's share of the buyer's ε (the product of all holders' is at most ε).
    epsilon_ppm         INTEGER NOT NULL CHECK (epsilon_ppm BETWEEN 0 AND 999999),
    -- Its term's whole rent ρ·|a|·term, wei: its part of the order's hold.
    rent_wei            NUMERIC(39, 0) NOT NULL CHECK (rent_wei >= 0),
    resident_reports    BIGINT NOT NULL DEFAULT 0 CHECK (resident_reports >= 0),
    absent_reports      BIGINT NOT NULL DEFAULT 0 CHECK (absent_reports >= 0),
    claimed             BOOLEAN NOT NULL DEFAULT false,
    PRIMARY KEY (rent, holder),
    UNIQUE (rent, provider_key_hash)
);

-- A provider's rents (its pins, what it claims) and its observed residency.
CREATE INDEX exchange_rent_holders_provider ON exchange_rent_holders (provider_key_hash);

-- Rents committed before: their one holder, holder 0.
INSERT INTO exchange_rent_holders (rent, holder, job_id, provider_key_hash, bundle_id,
                                   rho_wei_per_gb_hour, epsilon_ppm, rent_wei,
                                   resident_reports, absent_reports, claimed)
SELECT digest, 0, digest, provider_key_hash, bundle_id, rho_wei_per_gb_hour, epsilon_ppm,
       held_wei, resident_reports, absent_reports, status = 'filled'
FROM exchange_standing_orders
WHERE kind = 'rent' AND provider_key_hash IS NOT NULL AND bundle_id IS NOT NULL
  AND rho_wei_per_gb_hour IS NOT NULL;

-- What was one holder's now lives with the holders; the bundle and provider columns stay the
-- reserve's.
UPDATE exchange_standing_orders SET provider_key_hash = NULL, bundle_id = NULL WHERE kind = 'rent';
ALTER TABLE exchange_standing_orders
    DROP COLUMN rho_wei_per_gb_hour,
    DROP COLUMN resident_reports,
    DROP COLUMN absent_reports;

-- A rent's target kind (`adapter`, `base`), a term as its target is: read by the sweep that
-- observes residency (an adapter in a bundle's report, a base in its provider's) and by claims.
ALTER TABLE exchange_standing_orders
    ADD COLUMN target_kind TEXT CHECK (target_kind IN ('adapter', 'base', 'prefix'));
UPDATE exchange_standing_orders s SET target_kind = o.body #>> '{rent,order,target_kind}'
FROM exchange_orders o WHERE o.digest = s.digest AND s.kind = 'rent';
ALTER TABLE exchange_standing_orders DROP CONSTRAINT exchange_standing_orders_terms;
ALTER TABLE exchange_standing_orders ADD CONSTRAINT exchange_standing_orders_terms CHECK (
    CASE kind
        WHEN 'reserve' THEN model IS NOT NULL AND starts_s IS NOT NULL AND compute_ms IS NOT NULL
                            AND target IS NULL AND target_kind IS NULL AND epsilon_ppm IS NULL
        WHEN 'rent' THEN target IS NOT NULL AND target_kind IS NOT NULL
                         AND epsilon_ppm IS NOT NULL AND model IS NULL AND compute_ms IS NULL
        ELSE model IS NULL AND compute_ms IS NULL AND target IS NULL AND target_kind IS NULL
             AND epsilon_ppm IS NULL AND starts_s IS NULL
    END);
