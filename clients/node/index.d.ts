import type { Client, Pool, PoolClient } from 'pg';

/** The run a command job works on, from the worker's environment. */
export interface RunContext {
  /** The run's key, e.g. `nightly-invoices:2026-09-15`, or for a scoped run
   *  `daily-settlement:2026-09-15@seller-4711` (a partition of it adds `.p<n>`). */
  readonly key: string;
  readonly job: string;
  /** `YYYY-MM-DD`. */
  readonly businessDate: string;
  /** From 1. */
  readonly attempt: number;
  /** A 64-bit integer, kept as a string: never round it through a JS number. */
  readonly leaseToken: string;
  /** The worker's id (`BATCHONCE_WORKER_ID`); null when it is not set. */
  readonly workerId: string | null;
  /** The run's IANA time zone, fixed when it was enqueued. */
  readonly timezone: string;
  /** The period `[periodStart, periodEnd)`. */
  readonly periodStart: Date;
  readonly periodEnd: Date;
  /** The run's lease; keep each fenced transaction under a third of it. Null when the worker does not say. */
  readonly leaseTtlMs: number | null;
  /** `BATCHONCE_PAYLOAD`, parsed (`{}` when it is not set). */
  readonly payload: unknown;
  /** `whole`, or for a job with `partitions = N`: `partition` (this run is
   *  one partition of its business period) or `final` (every partition
   *  succeeded; do what must happen once, such as a summary). */
  readonly step: 'whole' | 'partition' | 'final';
  /** This partition's number, 1 to `partitions`: work on the items for which
   *  `batchonce_partition(item_key, partitions)` equals it. `null` unless
   *  `step` is `partition`. */
  readonly partition: number | null;
  /** The run's number of partitions; `null` for a whole run. */
  readonly partitions: number | null;
  /** For a job with `scopes`: the scope this run is about (`seller-4711`,
   *  from `BATCHONCE_SCOPE`, the same as the key's `@<scope>`); work only on
   *  that scope's items. `null` for an unscoped run. */
  readonly scope: string | null;
  /** `BATCHONCE_DATABASE_URL` (or `DATABASE_URL`), given with `database_url_env`. */
  readonly databaseUrl: string | null;
}

/** The context `run` hands the script, with its stop signal. */
export interface LiveRunContext extends RunContext {
  /** True once the worker asked the script to stop (SIGTERM). */
  readonly stopping: boolean;
  /** Aborted when the worker asks the script to stop. */
  readonly signal: AbortSignal;
  /** Throws StoppedError once the worker asked the script to stop. */
  throwIfStopping(): void;
}

/** What `fenced` gives the caller's function. */
export interface FencedTx {
  query: Client['query'];
  /** Adds to the run's processed and failed counts, in this transaction. */
  progress(processed: number, failed?: number): void;
}

/**
 * Runs `fn` on `items` with at most `limit` calls in flight; no new call starts once
 * `ctx.stopping`. Resolves to the settled results of the calls that started, in item order.
 */
export function concurrently<T, R>(
  ctx: { readonly stopping?: boolean } | null,
  items: readonly T[],
  limit: number,
  fn: (item: T, index: number) => Promise<R> | R,
): Promise<PromiseSettledResult<R>[]>;

/** Reads and checks the run's context; throws ContextError naming the first bad variable. */
export function context(env?: NodeJS.ProcessEnv): RunContext;
/**
 * BEGIN; batchonce_fence; fn(tx); batchonce_progress when tx.progress was called; COMMIT.
 * Needs one connection (a Client, or a client from pool.connect()), never a Pool.
 * Rejects with LeaseLostError (nothing committed) when the lease is gone.
 */
export function fenced<T>(
  client: Client | PoolClient,
  ctx: RunContext,
  fn: (tx: FencedTx) => Promise<T> | T,
): Promise<T>;
/** The script's entry point: exit 0, 3 (SkipRun), 2 (FatalError, ContextError) or 1. */
export function run(main: (ctx: LiveRunContext) => Promise<void> | void, env?: NodeJS.ProcessEnv): Promise<void>;
/** Prints `reason` as the last stdout line and exits 3 at once (no `finally` runs). */
export function skip(reason: string): never;

export interface EnqueueReport {
  enqueued: string[];
  duplicates: string[];
  skipped: string[];
}
/**
 * Enqueues a declared daily (unscoped) job for each date (a `YYYY-MM-DD` string, or a Date
 * taken at its UTC calendar date), 1 to 366 of them within 1970-01-01..2199-12-31.
 */
export function enqueue(
  client: Client | PoolClient | Pool,
  request: { job: string; dates: Array<Date | string>; payload?: unknown },
): Promise<EnqueueReport>;

export class ContextError extends Error {
  constructor(message: string);
}
export class LeaseLostError extends Error {
  constructor(key: string, cause?: unknown);
  readonly key: string;
}
export class SkipRun extends Error {
  constructor(reason: string);
  readonly reason: string;
}
export class FatalError extends Error {
  constructor(message: string);
}
export class StoppedError extends Error {
  constructor();
}
export class EnqueueError extends Error {
  constructor(message: string, code: 'BO002' | 'BO003' | 'BO004' | 'BO005' | '22023');
  /** `BO002` no live process declares the job, `BO003` they disagree, `BO004` a per-firing job,
   *  `BO005` a scoped job (its runs are enqueued per scope, by the producer or `batchonce enqueue`), `22023` bad input. */
  readonly code: 'BO002' | 'BO003' | 'BO004' | 'BO005' | '22023';
}

/** The partition (1..partitions) of an item key, equal to the database's
 *  `batchonce_partition(item_key, partitions)`. */
export function partitionOf(itemKey: string, partitions: number): number;
