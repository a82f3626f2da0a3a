-- An offer replaces its provider's bundle set (issue 32 item 8): a bundle the provider no longer
-- offers leaves the engine and the set a node loads at start, and is marked here.
--   NULL       offered by the provider's latest offer (live).
--   'leaving'  dropped by the latest offer. Its row is deleted at the provider's next offer if
--              nothing names it by then: an order cleared on the engine just before the
--              withdrawal may still be writing its job, and that job must find the row.
--   'kept'     dropped, and named by history (a job, a re-clearing, a standing order, a
--              reserve bid), so it stays: its jobs still run, complete and settle under its
--              owner, φ still counts them, and no other key can take the id.
-- So a provider holds at most two offers' worth of rows beyond those its history names.
ALTER TABLE exchange_bundles
    ADD COLUMN withdrawal TEXT CHECK (withdrawal IN ('leaving', 'kept'));

-- A provider's bundles (every offer reads and replaces them).
CREATE INDEX exchange_bundles_provider ON exchange_bundles (provider_key_hash);

-- Whether a job names a bundle (before a withdrawn bundle's row is deleted).
CREATE INDEX exchange_jobs_bundle ON exchange_jobs (bundle_id);

-- Re-clearings by the bundle their job left: φ counts them against its provider, and a withdrawn
-- bundle they name is kept.
CREATE INDEX exchange_job_events_recleared_from ON exchange_job_events ((detail ->> 'from'))
    WHERE status = 're-cleared';

-- Standing orders and reserve bids by the bundle they name (likewise).
CREATE INDEX exchange_standing_orders_bundle ON exchange_standing_orders (bundle_id)
    WHERE bundle_id IS NOT NULL;
CREATE INDEX exchange_reserve_bids_bundle ON exchange_reserve_bids (bundle_id);
