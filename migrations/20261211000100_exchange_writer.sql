-- The node that writes the exchange's books. Until markets are sharded across nodes, a database
-- has one writer at a time (ARCHITECTURE, "Past one machine"): `cx serve` takes a PostgreSQL
-- session advisory lock on a connection of its own (released by PostgreSQL when that connection
-- ends, so a killed node loses it as soon as its socket closes), then raises the epoch here and
-- tags every pooled connection with it (`SET cx.writer_epoch`). The epoch is the fencing token:
-- a write to the tables below from a connection tagged with an older epoch — a node that lost
-- the lock and has not noticed yet — is refused by the trigger, so a superseded node cannot
-- commit a clearing, a fill or a batch after another took over. Sessions without the tag
-- (migrations, tools, in-process tests) are not fenced.
CREATE TABLE exchange_writer (
    only_row BOOLEAN PRIMARY KEY DEFAULT true CHECK (only_row),
    epoch    BIGINT NOT NULL CHECK (epoch > 0),
    holder   TEXT NOT NULL,
    since    TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Called only for tagged sessions (the triggers' WHEN), so untagged ones pay no PL/pgSQL call.
CREATE FUNCTION exchange_writer_fence() RETURNS trigger AS $$
BEGIN
    IF current_setting('cx.writer_epoch')::bigint
       IS DISTINCT FROM (SELECT epoch FROM exchange_writer) THEN
        RAISE EXCEPTION 'fenced: writer epoch % was superseded', current_setting('cx.writer_epoch')
            USING ERRCODE = 'CX001';
    END IF;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

-- Once per statement (not per row), on the tables every commit of a clearing, a fill or a
-- settlement writes: an intent's order, tab hold and job are one statement, so fencing its job
-- refuses the whole of it; a reserve's or rent's commit writes its standing order; a batch its
-- row. (One trigger per commit: each costs ~4-8 µs of PostgreSQL time.)
CREATE TRIGGER exchange_jobs_fence BEFORE INSERT OR UPDATE OR DELETE ON exchange_jobs
    FOR EACH STATEMENT
    WHEN (coalesce(current_setting('cx.writer_epoch', true), '') <> '')
    EXECUTE FUNCTION exchange_writer_fence();
CREATE TRIGGER exchange_standing_orders_fence BEFORE INSERT OR UPDATE OR DELETE
    ON exchange_standing_orders FOR EACH STATEMENT
    WHEN (coalesce(current_setting('cx.writer_epoch', true), '') <> '')
    EXECUTE FUNCTION exchange_writer_fence();
CREATE TRIGGER settlement_batches_fence BEFORE INSERT OR UPDATE OR DELETE ON settlement_batches
    FOR EACH STATEMENT
    WHEN (coalesce(current_setting('cx.writer_epoch', true), '') <> '')
    EXECUTE FUNCTION exchange_writer_fence();
