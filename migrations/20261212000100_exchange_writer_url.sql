-- Any node takes any request (ARCHITECTURE, "Past one machine"): a node that does not hold the
-- writer lease forwards what it is sent to the node that does. The writer says here where it
-- is reached (`url`, what `cx serve --advertise` gives, else its listening address) and the
-- token a forwarding node proves itself with (`forward_token`, fresh at every epoch: a
-- forwarded request names its client's address, which the writer's per-address limits count,
-- and only a node that can read this row may name one). Both are NULL for a writer that does
-- not take forwarded requests (a bench, a test).
--
-- `renewed_at`: the writer renews it every second on its lease connection. A writer that stops
-- renewing for `books::writer::LEASE_TIMEOUT` while its lock is still held — a hung process, or
-- a machine gone without closing its socket — has its lock connection terminated by a standby
-- (`pg_terminate_backend`, which the role that owns the backend may do), which then takes the
-- lease; whatever the old writer still sends is refused by the fence.
ALTER TABLE exchange_writer
    ADD COLUMN url           TEXT,
    ADD COLUMN forward_token TEXT,
    ADD COLUMN renewed_at    TIMESTAMPTZ NOT NULL DEFAULT now();
