-- Rents on state filled by providers (SPEC §3). A rent is `committed` when it is accepted: to
-- the live bundle that serves the adapter's base, has room for it and has the lowest ρ (its
-- ask per byte of its free memory, per GB-hour), holding the term's rent ρ·|a|·term. Every
-- sweep observes whether the bundle's latest report holds the adapter (`resident_reports` /
-- `absent_reports`); jobs of the adapter on that bundle that missed their deadline in the term
-- count as absent too (read from `exchange_jobs`, never copied). At the term's end the provider
-- claims the rent less the rebate a missed SLA earns with a receipt it signs: `filled`, a job
-- of the tab. Unclaimed, it is `unclaimed` and the hold returns (as a reserve's take-or-pay).
ALTER TABLE exchange_standing_orders
    ADD COLUMN rho_wei_per_gb_hour NUMERIC(39, 0) CHECK (rho_wei_per_gb_hour >= 0),
    ADD COLUMN size_bytes BIGINT CHECK (size_bytes > 0),
    ADD COLUMN starts_s BIGINT,
    ADD COLUMN resident_reports BIGINT NOT NULL DEFAULT 0 CHECK (resident_reports >= 0),
    ADD COLUMN absent_reports BIGINT NOT NULL DEFAULT 0 CHECK (absent_reports >= 0);
