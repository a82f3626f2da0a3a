-- A leader per duty (ARCHITECTURE, "Past one machine"): the settlement loop and the chain
-- watchers run once per cluster, each on the node that holds its lease, which need not be the
-- writer's. A duty's lease is the writer's mechanism (`books::Lease`): a session advisory lock
-- of its own key on a connection of its own, an epoch raised here when it is taken, renewed
-- every second (`renewed_at`; a holder silent for `LEASE_TIMEOUT` is cut off by a waiting node),
-- and every connection of the duty's pool tagged with the epoch (`SET cx.<duty>_epoch`).
-- The sweeps stay the writer's: they act on the matching engine, which lives in its memory.
CREATE TABLE exchange_duties (
    duty       TEXT PRIMARY KEY CHECK (duty IN ('settlement', 'watch')),
    epoch      BIGINT NOT NULL CHECK (epoch > 0),
    holder     TEXT NOT NULL,
    since      TIMESTAMPTZ NOT NULL DEFAULT now(),
    renewed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Called only for sessions tagged for the duty (the triggers' WHEN); the duty is the
-- trigger's argument.
CREATE FUNCTION exchange_duty_fence() RETURNS trigger AS $$
DECLARE
    tagged BIGINT := current_setting('cx.' || TG_ARGV[0] || '_epoch')::bigint;
BEGIN
    IF tagged IS DISTINCT FROM (SELECT epoch FROM exchange_duties WHERE duty = TG_ARGV[0]) THEN
        RAISE EXCEPTION 'fenced: % epoch % was superseded', TG_ARGV[0], tagged
            USING ERRCODE = 'CX001';
    END IF;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

-- A batch is the settlement duty's write (the coordinator's outbox): fenced by its epoch now,
-- not the writer's, so a settler that lost its lease cannot cut, sign or post after another
-- took over.
DROP TRIGGER settlement_batches_fence ON settlement_batches;
CREATE TRIGGER settlement_batches_fence BEFORE INSERT OR UPDATE OR DELETE ON settlement_batches
    FOR EACH STATEMENT
    WHEN (coalesce(current_setting('cx.settlement_epoch', true), '') <> '')
    EXECUTE FUNCTION exchange_duty_fence('settlement');

-- Every block range a watcher applies, and every rewind, moves its chain's cursor in the same
-- transaction as the tabs and batches it read: fencing the cursor refuses the whole of it.
CREATE TRIGGER exchange_chain_cursors_fence BEFORE INSERT OR UPDATE OR DELETE
    ON exchange_chain_cursors FOR EACH STATEMENT
    WHEN (coalesce(current_setting('cx.watch_epoch', true), '') <> '')
    EXECUTE FUNCTION exchange_duty_fence('watch');
