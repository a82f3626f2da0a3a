-- Any node takes any request (ARCHITECTURE, "Past one machine"): a node that does not hold the
-- writer lease forwards what it is sent to the node that does. The writer says here where it
-- is reached (`url`, what `cx serve --advertise` gives, else its listening address) and the
-- token a forwarding node proves itself with (`forward_token`, fresh at every epoch: a
-- forwarded request names its client's address, which the writer's per-address limits count,
-- and only a node that can read this row may name one). Both are NULL for a writer that does
-- not take forwarded requests (a bench, a test).
ALTER TABLE exchange_writer
    ADD COLUMN url           TEXT,
    ADD COLUMN forward_token TEXT;
