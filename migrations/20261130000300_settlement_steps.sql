-- Every step the coordinator takes with a batch (built, signers chosen, signed, posted, refused),
-- for operators and the explorer.
CREATE TABLE settlement_steps (
    id       BIGSERIAL PRIMARY KEY,
    batch_id BIGINT NOT NULL REFERENCES settlement_batches (id),
    chain_id BIGINT,
    step     TEXT NOT NULL,
    detail   TEXT NOT NULL,
    at       TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX settlement_steps_batch ON settlement_steps (batch_id, id);
