-- Training data by content: the dataset file a train order names by its content id (what the
-- buyer computed for the same bytes), kept as sent. Providers read it only while they run a
-- training job that names it.
CREATE TABLE exchange_datasets (
    id          TEXT PRIMARY KEY CHECK (id ~ '^[0-9a-f]{64}$'),
    body        BYTEA NOT NULL,
    sequences   INTEGER NOT NULL CHECK (sequences > 0),
    tokens      BIGINT NOT NULL CHECK (tokens > 0),
    max_token   BIGINT NOT NULL CHECK (max_token >= 0),
    stored_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
