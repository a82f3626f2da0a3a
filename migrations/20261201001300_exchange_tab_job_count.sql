-- How many jobs a tab has taken. A tab settles once, whole, in one batch part, and a part holds
-- at most 400 vouchers (cx_settlement::ledger::MAX_RECEIPTS_PER_BATCH): the hold that would be a
-- tab's 401st job is refused, in the same conditional UPDATE as the money, so concurrent calls
-- cannot pass it.
ALTER TABLE exchange_tabs ADD COLUMN jobs INTEGER NOT NULL DEFAULT 0;
