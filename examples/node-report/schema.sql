-- The report's source: an application's orders. The script only reads it.
CREATE TABLE IF NOT EXISTS report_order (
    id         bigint PRIMARY KEY,
    ordered_at timestamptz NOT NULL
);
