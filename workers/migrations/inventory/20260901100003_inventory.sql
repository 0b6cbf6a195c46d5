-- inventory-sync: the upstream stock (the source, normally replicated from
-- the warehouse system) and the synced level per SKU. A level is replaced
-- only by a strictly newer source version, so a late or repeated run never
-- overwrites fresher data.

CREATE TABLE IF NOT EXISTS inventory_source (
    sku            text        PRIMARY KEY CHECK (length(sku) BETWEEN 1 AND 200),
    quantity       bigint      NOT NULL CHECK (quantity >= 0),
    source_version bigint      NOT NULL CHECK (source_version >= 0),
    updated_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE inventory_level (
    sku            text        NOT NULL,
    quantity       bigint      NOT NULL,
    source_version bigint      NOT NULL,
    synced_at      timestamptz NOT NULL,
    -- The run and lease token of the attempt that wrote this version.
    job_key        text        NOT NULL,
    lease_token    bigint      NOT NULL,
    CONSTRAINT inventory_level_pkey PRIMARY KEY (sku),
    CONSTRAINT inventory_level_quantity CHECK (quantity >= 0),
    CONSTRAINT inventory_level_version CHECK (source_version >= 0)
);
