-- What the chain watcher needs to see a reorg below its confirmation depth and undo what it
-- had read from the replaced blocks: the hash each recent pass ended at (pruned to the newest
-- few hundred per chain), the block each reclaim was read in, and a record of every reorg seen.
CREATE TABLE exchange_chain_blocks (
    chain_id  BIGINT NOT NULL,
    number    BIGINT NOT NULL,
    hash      BYTEA NOT NULL,
    PRIMARY KEY (chain_id, number)
);

ALTER TABLE exchange_tabs ADD COLUMN reclaimed_block BIGINT;

CREATE TABLE exchange_chain_reorgs (
    id               BIGSERIAL PRIMARY KEY,
    chain_id         BIGINT NOT NULL,
    -- The first block whose hash changed (everything read from it on is read again).
    fork_block       BIGINT NOT NULL,
    -- The watcher's cursor when it saw the reorg.
    cursor_block     BIGINT NOT NULL,
    dropped_tabs     BIGINT NOT NULL,
    reopened_tabs    BIGINT NOT NULL,
    dropped_batches  BIGINT NOT NULL,
    -- True when a replaced block held a tab something already draws on: the watcher stops
    -- there for the operator instead of rewriting money the books have promised.
    halted           BOOLEAN NOT NULL,
    detail           TEXT NOT NULL,
    seen_at          TIMESTAMPTZ NOT NULL DEFAULT now()
);
