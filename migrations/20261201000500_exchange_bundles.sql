-- Provider bundles as registered, the source the matching engine's memory is rebuilt from at
-- start (the engine is a cache of this table).
CREATE TABLE exchange_bundles (
    id          TEXT PRIMARY KEY,
    body        JSONB NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
