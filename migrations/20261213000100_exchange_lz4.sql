-- Every intent writes its signed order (its ML-DSA signature alone is ~6.6 kB of hex) and a
-- decision for its job and each verification run (up to 32 feasible and 32 refused bundles,
-- ~10-20 kB): values PostgreSQL compresses into TOAST. Its default, pglz, was the largest
-- single cost of PostgreSQL's share of intake (`perf` during `cx bench intake`); lz4 compresses
-- the same values several times faster. It applies to values written from now on; a server
-- built without lz4 keeps pglz (the notice says so), and nothing else changes.
DO $$
BEGIN
    ALTER TABLE exchange_orders ALTER COLUMN body SET COMPRESSION lz4;
    ALTER TABLE exchange_jobs ALTER COLUMN decision SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR syntax_error THEN
    RAISE NOTICE 'lz4 is not available (%): order bodies and decisions stay pglz-compressed', SQLERRM;
END
$$;
