-- The market maker's open quote in each market (model × tier), sampled by the sweep: what the
-- explorer's markets chart plots (bid, ask and regime over time). The maker keeps its state in
-- memory; this is its history, pruned to the last day.
CREATE TABLE exchange_quotes (
    model          TEXT NOT NULL,
    tier           TEXT NOT NULL,
    at             TIMESTAMPTZ NOT NULL DEFAULT now(),
    bid_wei_per_s  NUMERIC(20, 0) NOT NULL CHECK (bid_wei_per_s >= 0),
    ask_wei_per_s  NUMERIC(20, 0) NOT NULL CHECK (ask_wei_per_s >= bid_wei_per_s),
    regime         TEXT NOT NULL,
    PRIMARY KEY (model, tier, at)
);

CREATE INDEX exchange_quotes_at ON exchange_quotes (at);
