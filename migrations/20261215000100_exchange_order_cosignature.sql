-- A signed order's ML-DSA-65 co-signature (3,309 bytes) was stored inside its body as 6,618 hex
-- characters: PostgreSQL parsed them as jsonb, tried to compress them (hex of random bytes
-- barely compresses) and moved the body out of line into TOAST — per intent, the largest part of
-- writing its order (135 µs a row against 50 µs with the co-signature as bytes, measured with
-- psql on 20,000 rows; half the table and WAL). Orders from now on keep it here as its bytes,
-- their body holding "0x" where it was; PLAIN keeps these incompressible bytes in the row (no
-- compression attempt, no TOAST rows). Orders written before keep their whole body and a NULL.
ALTER TABLE exchange_orders ADD COLUMN mldsa_signature BYTEA;
ALTER TABLE exchange_orders ALTER COLUMN mldsa_signature SET STORAGE PLAIN;

-- The key of the body's member that is the signed order (as intake writes it: `{"intent": …}`,
-- `{"reserve": …}`, `{"grant": …}` …).
CREATE FUNCTION exchange_order_signed_key(kind TEXT) RETURNS TEXT
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT CASE kind WHEN 'session_grant' THEN 'grant' ELSE kind END $$;

-- The order as received: its body with the co-signature put back. Every reader of a signed
-- order whole reads it through this (`exchange_order_body(o)`); a part that is not the
-- co-signature (`o.body -> 'reserve' -> 'order'`) may be read from the body.
CREATE FUNCTION exchange_order_body(o exchange_orders) RETURNS JSONB
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
        SELECT CASE WHEN o.mldsa_signature IS NULL THEN o.body
                    ELSE jsonb_set(o.body,
                                   ARRAY[exchange_order_signed_key(o.kind), 'mldsa_signature'],
                                   to_jsonb('0x' || encode(o.mldsa_signature, 'hex')))
               END
    $$;
