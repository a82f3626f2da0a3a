-- A tab (one escrow) pays many jobs and settles once, whole: receipts are no longer one per
-- escrow. Each is kept with its voucher (the buyer's order and the exchange's assignment that
-- the signers check it against), so the column holds the voucher, receipt inside.
ALTER TABLE settlement_receipts DROP CONSTRAINT settlement_receipts_escrow_key;
ALTER TABLE settlement_receipts RENAME COLUMN receipt TO voucher;
ALTER TABLE settlement_rejected_receipts RENAME COLUMN receipt TO voucher;
CREATE INDEX settlement_receipts_escrow ON settlement_receipts (chain_id, escrow_id);
