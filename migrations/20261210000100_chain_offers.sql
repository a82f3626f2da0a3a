-- Every transaction offer a sender of this exchange made (cx_settlement::evm::sender), kept so
-- that the nonces of its accounts are in the books: a restarted exchange knows which offer holds
-- its posting account's next nonce, recognises it when it is mined (the same call: a batch
-- posted before the crash), and otherwise outbids it at that nonce with fees above the highest
-- it offered, instead of sending behind it or guessing its fee.
CREATE TABLE chain_offers (
    tx_hash                  BYTEA PRIMARY KEY CHECK (length(tx_hash) = 32),
    chain_id                 BIGINT NOT NULL CHECK (chain_id > 0),
    account                  BYTEA NOT NULL CHECK (length(account) = 20),
    nonce                    BIGINT NOT NULL CHECK (nonce >= 0),
    -- keccak256(to ‖ value ‖ input): offers of one call share it, whatever their fees.
    call_hash                BYTEA NOT NULL CHECK (length(call_hash) = 32),
    max_fee_per_gas          BIGINT NOT NULL CHECK (max_fee_per_gas >= 0),
    max_priority_fee_per_gas BIGINT NOT NULL CHECK (max_priority_fee_per_gas >= 0),
    sent_at                  TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- pending: in a pool as far as the sender knows; mined: this offer is the one in a block;
    -- replaced: another offer (or another transaction) took its nonce; used: its nonce was
    -- taken while no sender watched (a restart), by this offer or another.
    outcome                  TEXT NOT NULL DEFAULT 'pending'
                             CHECK (outcome IN ('pending', 'mined', 'replaced', 'used'))
);

CREATE INDEX chain_offers_pending ON chain_offers (chain_id, account, nonce)
    WHERE outcome = 'pending';
