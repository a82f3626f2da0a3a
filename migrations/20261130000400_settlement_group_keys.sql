-- Public key packages of the committee's FROST keys, one per epoch (0 from the first DKG, +1 per
-- rotation). Public data only: no signer's share ever reaches the coordinator.
CREATE TABLE settlement_group_keys (
    epoch              INTEGER PRIMARY KEY,
    verifying_key      BYTEA NOT NULL,
    public_key_package JSONB NOT NULL,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now()
);
