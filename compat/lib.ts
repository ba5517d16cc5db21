// Shared helpers for the compatibility scripts. Each script drives queued
// through the official bunqueue client and exits non-zero with a message
// when what it sees is not what a bunqueue user would expect.
export const port = Number(process.env.QUEUED_PORT ?? 6789);
export const conn = { host: '127.0.0.1', port };

/** A queue name no other script or run uses. */
export function uniq(prefix: string): string {
  return `${prefix}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Waits until a server's GET /health answers on httpPort; the ms it took. */
export async function healthy(httpPort: number, deadlineMs: number): Promise<number> {
  const t0 = performance.now();
  while (performance.now() - t0 < deadlineMs) {
    try {
      const r = await fetch(`http://127.0.0.1:${httpPort}/health`);
      if (r.ok) return performance.now() - t0;
    } catch {}
    await sleep(20);
  }
  throw new Error(`no /health within ${deadlineMs} ms`);
}

export function check(cond: unknown, msg: string): asserts cond {
  if (!cond) throw new Error('check failed: ' + msg);
}

export function eq(got: unknown, want: unknown, msg: string) {
  const g = JSON.stringify(got), w = JSON.stringify(want);
  if (g !== w) throw new Error(`${msg}: got ${g}, want ${w}`);
}

/** Polls fn until it returns a truthy value, or fails after ms. */
export async function waitFor<T>(fn: () => T | Promise<T>, ms: number, what: string): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error('timed out waiting for ' + what);
    await sleep(20);
  }
}

/** Runs a script body with a watchdog; exit code 0 means every check held. */
export async function main(name: string, body: () => Promise<void>, limitMs = 60000) {
  const dog = setTimeout(() => {
    console.error(`${name}: did not finish within ${limitMs} ms`);
    process.exit(3);
  }, limitMs);
  try {
    await body();
    clearTimeout(dog);
    console.log(`${name}: ok`);
    process.exit(0);
  } catch (e) {
    console.error(`${name}: ${e instanceof Error ? e.stack ?? e.message : String(e)}`);
    process.exit(1);
  }
}
