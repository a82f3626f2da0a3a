-- A tab's way to settlement: `open` (takes jobs) → `closing` (takes no more: its deadline is
-- within the settle margin) → `submitted` (every job it paid went to the coordinator as one
-- voucher each; the tab settles whole in one batch) → `settled` (that batch is on chain). A tab
-- that paid nothing is `unspent` (its buyer reclaims it after the grace period); `reclaimed` is
-- the chain watcher's.
ALTER TABLE exchange_tabs DROP CONSTRAINT exchange_tabs_status_check;
ALTER TABLE exchange_tabs ADD CONSTRAINT exchange_tabs_status_check
    CHECK (status IN ('open', 'closing', 'submitted', 'settled', 'unspent', 'reclaimed'));
-- When it went to the coordinator, and how many jobs it paid.
ALTER TABLE exchange_tabs ADD COLUMN submitted_at TIMESTAMPTZ, ADD COLUMN jobs_paid INTEGER;
CREATE INDEX exchange_tabs_closing ON exchange_tabs (deadline_s) WHERE status IN ('open', 'closing');
