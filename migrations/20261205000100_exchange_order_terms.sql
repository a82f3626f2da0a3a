-- The terms of signed orders that statements compare, as columns: copied once, when the order is
-- accepted, from the signed order (which stays whole, as received, in `exchange_orders.body`).
-- Before, fourteen statements read them out of that JSON by path, cast at every use.
--   reserve: `model`, `starts_s` (the window's start; its end is `ends_s`), `compute_ms`;
--   rent:    `target` (the adapter's content id, 64 lowercase hex digits, as `exchange_jobs.adapter`
--            names adapters) and `epsilon_ppm` (its SLA's tolerance); its `starts_s` is set when
--            it is committed, as before.
ALTER TABLE exchange_standing_orders
    ADD COLUMN model TEXT,
    ADD COLUMN compute_ms BIGINT CHECK (compute_ms > 0),
    ADD COLUMN target TEXT CHECK (target ~ '^[0-9a-f]{64}$'),
    ADD COLUMN epsilon_ppm BIGINT CHECK (epsilon_ppm >= 0);

UPDATE exchange_standing_orders s
SET model = o.body #>> '{reserve,order,model}',
    starts_s = (o.body #>> '{reserve,order,window_start_s}')::bigint,
    compute_ms = (o.body #>> '{reserve,order,compute_ms}')::bigint
FROM exchange_orders o
WHERE o.digest = s.digest AND s.kind = 'reserve';

UPDATE exchange_standing_orders s
SET target = lower(substr(o.body #>> '{rent,order,target}', 3)),
    epsilon_ppm = (o.body #>> '{rent,order,epsilon_ppm}')::bigint
FROM exchange_orders o
WHERE o.digest = s.digest AND s.kind = 'rent';

-- Each kind has the terms its statements read; the others have none of them.
ALTER TABLE exchange_standing_orders ADD CONSTRAINT exchange_standing_orders_terms CHECK (
    CASE kind
        WHEN 'reserve' THEN model IS NOT NULL AND starts_s IS NOT NULL AND compute_ms IS NOT NULL
                            AND target IS NULL AND epsilon_ppm IS NULL
        WHEN 'rent' THEN target IS NOT NULL AND epsilon_ppm IS NOT NULL
                         AND model IS NULL AND compute_ms IS NULL
        ELSE model IS NULL AND compute_ms IS NULL AND target IS NULL AND epsilon_ppm IS NULL
             AND starts_s IS NULL
    END);

-- The open reserves still taking bids and those due for their award, by window start.
CREATE INDEX exchange_standing_orders_reserve_start ON exchange_standing_orders (starts_s)
    WHERE kind = 'reserve' AND status = 'open';

-- An intent's limit (`max_price_wei`): the most its job and the job's verification runs may cost
-- together, which re-clearing keeps a re-placed job within. Other orders have none (a session's
-- cap is `exchange_sessions.spend_cap_wei`).
ALTER TABLE exchange_orders ADD COLUMN limit_wei NUMERIC(39, 0) CHECK (limit_wei >= 0);

UPDATE exchange_orders SET limit_wei = (body #>> '{intent,order,max_price_wei}')::numeric
WHERE kind = 'intent';

ALTER TABLE exchange_orders ADD CONSTRAINT exchange_orders_limit
    CHECK ((kind = 'intent') = (limit_wei IS NOT NULL));
