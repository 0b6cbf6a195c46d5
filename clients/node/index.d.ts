import type { Client, PoolClient, QueryResult } from 'pg';

/** The run a command job works on, from the worker's environment. */
export interface RunContext {
  /** The run's key, e.g. `nightly-invoices:2026-09-15`. */
  readonly key: string;
  readonly job: string;
  /** `YYYY-MM-DD`. */
  readonly businessDate: string;
  /** From 1. */
  readonly attempt: number;
  /** A 64-bit integer, kept as a string: never round it through a JS number. */
  readonly leaseToken: string;
  readonly workerId: string | null;
  /** The run's IANA time zone, fixed when it was enqueued. */
  readonly timezone: string;
  /** The period `[periodStart, periodEnd)`. */
  readonly periodStart: Date;
  readonly periodEnd: Date;
  /** The run's lease; keep each fenced transaction under a third of it. */
  readonly leaseTtlMs: number | null;
  readonly payload: unknown;
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

export function context(env?: NodeJS.ProcessEnv): RunContext;
export function fenced<T>(
  client: Client | PoolClient,
  ctx: RunContext,
  fn: (tx: FencedTx) => Promise<T>,
): Promise<T>;
export function run(main: (ctx: LiveRunContext) => Promise<void>, env?: NodeJS.ProcessEnv): Promise<void>;
export function skip(reason: string): void;

export interface EnqueueReport {
  enqueued: string[];
  duplicates: string[];
  skipped: string[];
}
export function enqueue(
  client: Client | PoolClient,
  request: { job: string; dates: Array<Date | string>; payload?: unknown },
): Promise<EnqueueReport>;

export class ContextError extends Error {}
export class LeaseLostError extends Error {
  readonly key: string;
}
export class SkipRun extends Error {
  constructor(reason: string);
  readonly reason: string;
}
export class FatalError extends Error {}
export class StoppedError extends Error {}
export class EnqueueError extends Error {
  /** `BO002` no live process declares the job, `BO003` they disagree, `BO004` a per-firing job, `22023` bad input. */
  readonly code: string;
}
