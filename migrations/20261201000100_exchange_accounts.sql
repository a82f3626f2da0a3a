-- Agents: an Ethereum account bound once to an ML-DSA-65 identity (SPEC §9: the PQ key is a
-- retrofit beside the secp256k1 account). Both signatures of the binding are kept, so anyone can
-- re-check it. One key belongs to one account.
CREATE TABLE exchange_bindings (
    account        BYTEA PRIMARY KEY CHECK (length(account) = 20),
    chain_id       BIGINT NOT NULL,
    mldsa_key      BYTEA NOT NULL,
    mldsa_key_hash BYTEA NOT NULL CHECK (length(mldsa_key_hash) = 32),
    binding        JSONB NOT NULL,
    bound_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT exchange_bindings_key_unique UNIQUE (mldsa_key_hash)
);
