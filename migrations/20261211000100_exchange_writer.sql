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

CREATE FUNCTION exchange_writer_fence() RETURNS trigger AS $$
DECLARE
    mine TEXT := current_setting('cx.writer_epoch', true);
BEGIN
    IF mine IS NOT NULL AND mine <> ''
       AND mine::bigint IS DISTINCT FROM (SELECT epoch FROM exchange_writer) THEN
        RAISE EXCEPTION 'fenced: writer epoch % was superseded', mine
            USING ERRCODE = 'CX001';
    END IF;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

-- Once per statement (not per row): what commits a clearing or a fill, and what settles.
CREATE TRIGGER exchange_orders_fence BEFORE INSERT OR UPDATE OR DELETE ON exchange_orders
    FOR EACH STATEMENT EXECUTE FUNCTION exchange_writer_fence();
CREATE TRIGGER exchange_jobs_fence BEFORE INSERT OR UPDATE OR DELETE ON exchange_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION exchange_writer_fence();
CREATE TRIGGER exchange_standing_orders_fence BEFORE INSERT OR UPDATE OR DELETE
    ON exchange_standing_orders FOR EACH STATEMENT EXECUTE FUNCTION exchange_writer_fence();
CREATE TRIGGER exchange_tabs_fence BEFORE INSERT OR UPDATE OR DELETE ON exchange_tabs
    FOR EACH STATEMENT EXECUTE FUNCTION exchange_writer_fence();
CREATE TRIGGER settlement_batches_fence BEFORE INSERT OR UPDATE OR DELETE ON settlement_batches
    FOR EACH STATEMENT EXECUTE FUNCTION exchange_writer_fence();
