-- Adapters by content: PEFT's two files, named by their content id (what providers compute for
-- the same files), so an id always names exactly the bytes it hashes. `bytes` is |a| of the
-- feasibility test.
CREATE TABLE exchange_adapters (
    id          TEXT PRIMARY KEY CHECK (id ~ '^[0-9a-f]{64}$'),
    config      BYTEA NOT NULL,
    weights     BYTEA NOT NULL,
    bytes       BIGINT NOT NULL CHECK (bytes > 0),
    stored_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
