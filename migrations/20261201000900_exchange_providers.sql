-- Providers: an ML-DSA-65 identity that registered bundles with a signed offer, the account its
-- receipts pay, and the hash of the secret it pulls jobs with. A bundle belongs to the key that
-- first offered it; another key's offer for the same id is refused.
CREATE TABLE exchange_providers (
    key_hash      BYTEA PRIMARY KEY CHECK (length(key_hash) = 32),
    mldsa_key     BYTEA NOT NULL,
    operator      TEXT NOT NULL,
    payout        BYTEA NOT NULL CHECK (length(payout) = 20),
    token_hash    BYTEA NOT NULL CHECK (length(token_hash) = 32),
    offer         JSONB NOT NULL,
    registered_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    seen_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT exchange_providers_token_unique UNIQUE (token_hash)
);

ALTER TABLE exchange_bundles ADD COLUMN provider_key_hash BYTEA REFERENCES exchange_providers (key_hash);

-- Each result's provider-signed receipt, exactly as received: what the job is charged and the
-- evidence the committee settles (and slashes) on.
CREATE TABLE exchange_receipts (
    job_id            BYTEA PRIMARY KEY REFERENCES exchange_jobs (id),
    provider_key_hash BYTEA NOT NULL REFERENCES exchange_providers (key_hash),
    amount_owed_wei   NUMERIC(39, 0) NOT NULL CHECK (amount_owed_wei >= 0),
    receipt           JSONB NOT NULL,
    received_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);
