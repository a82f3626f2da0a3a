-- What a job computes (cx_protocol::workload::WorkloadKind), kept beside its request instead of
-- worked out again from the market's name by every statement and party that reads the job. A
-- job with a request has a workload and one without (a reserve's take-or-pay, a rent's term, a
-- search's fill) has none.
ALTER TABLE exchange_jobs ADD COLUMN workload TEXT;
UPDATE exchange_jobs SET workload = CASE
        WHEN model = 'cx/matmul-f32' THEN 'matmul'
        WHEN model LIKE 'cx/train/%' THEN 'train'
        ELSE 'inference' END
    WHERE request IS NOT NULL;
ALTER TABLE exchange_jobs ADD CONSTRAINT exchange_jobs_workload_check CHECK (
    workload IN ('inference', 'matmul', 'train') AND (request IS NULL) = (workload IS NULL));
