// Captures next-run answers from the reference's own cron code (bunqueue
// 2.9.5 on Bun.cron, Bun 1.4.4) for TestCronReferenceVectors:
//
//   (cd compat && bun cron-vectors.ts > ../testdata/vectors/cron-next-reference-2.9.5.tsv)
//
// Each line: expression, zone, from (ms), and the reference's answer: the
// next run in ms, "none", or "error" when the expression is refused. A tab
// inside an expression is written as \t. The pseudo-random generator is
// seeded, so a rerun writes the same file.
import {
  expandCronShortcut,
  getNextCronRun,
  validateCronExpression,
} from './node_modules/bunqueue/dist/infrastructure/scheduler/cronParser.js';

let seed = 20260301;
const rnd = () => {
  seed = (seed * 1103515245 + 12345) % 2147483648;
  return seed / 2147483648;
};
const ri = (a: number, b: number) => a + Math.floor(rnd() * (b - a + 1));
const pick = <T>(xs: T[]): T => xs[Math.floor(rnd() * xs.length)];

const months = ['JAN', 'FEB', 'MAR', 'APR', 'MAY', 'JUN', 'JUL', 'AUG', 'SEP', 'OCT', 'NOV', 'DEC'];
const days = ['SUN', 'MON', 'TUE', 'WED', 'THU', 'FRI', 'SAT'];

// Well-formed expressions, weighted towards what schedules use.
function item(min: number, max: number, names?: string[]): string {
  const value = () =>
    names && rnd() < 0.3
      ? rnd() < 0.5 ? pick(names).toLowerCase() : pick(names)
      : String(ri(min, max));
  const r = rnd();
  if (r < 0.25) return value();
  if (r < 0.45) { const a = ri(min, max); return `${a}-${ri(a, max)}`; }
  if (r < 0.6) return `*/${ri(1, max - min + 2)}`;
  if (r < 0.7) { const a = ri(min, max); return `${a}-${ri(a, max)}/${ri(1, 10)}`; }
  if (r < 0.78) return `${ri(min, max)}/${ri(1, 15)}`;
  return value();
}
function field(min: number, max: number, star: number, names?: string[]): string {
  if (rnd() < star) return '*';
  const n = rnd() < 0.7 ? 1 : ri(2, 3);
  return Array.from({ length: n }, () => item(min, max, names)).join(',');
}
function wellFormed(): string {
  if (rnd() < 0.03) return pick(['@yearly', '@monthly', '@weekly', '@daily', '@hourly', '@midnight', '@annually', '@Daily']);
  let e = [field(0, 59, 0.25), field(0, 23, 0.5), field(1, 31, 0.6), field(1, 12, 0.7, months), field(0, 7, 0.6, days)].join(' ');
  if (rnd() < 0.15) e = pick(['0', '*', '*/5', '0-10/3', '15,45', '30', '59', '5-7']) + ' ' + e;
  return e;
}

// Token soup, for what is accepted and what is refused.
const tokens = ['*', '*', '/', '-', ',', '0', '1', '2', '5', '7', '9', '10', '12', '13', '23', '24', '29', '30', '31', '32',
  '59', '60', '61', '99', '127', '128', '255', '256', '+', '_', 'L', '?', '#', 'W', 'jan', 'DEC', 'Feb', 'mon', 'SUN', 'sat',
  'friday', 'MONDAY', 'tues', 'jun', 'x', '01', '00', '1_0', '-0', '+1', '0x1', ' '];
function soup(): string {
  if (rnd() < 0.05) return pick(['@yearly', '@YEARLY', '@reboot', '@every', '@daily ', '@ daily', '@', '@hourly 1', '@Weekly']);
  const n = pick([5, 5, 5, 5, 6, 6, 4, 7]);
  const fields = Array.from({ length: n }, () => {
    if (rnd() < 0.5) return '*';
    let s = '';
    for (let i = ri(1, 5); i > 0; i--) s += pick(tokens);
    return s.trim() || '*';
  });
  return fields.join(pick([' ', ' ', '  ', '\t']));
}

const zones = ['UTC', 'America/New_York', 'Europe/Berlin', 'Australia/Sydney', 'Australia/Lord_Howe', 'America/Havana',
  'America/Santiago', 'Asia/Kolkata', 'Pacific/Chatham', 'America/St_Johns', 'Europe/London', 'Asia/Tehran', 'America/Sao_Paulo'];
// Around the 2026 clock changes of those zones.
const changes = [Date.UTC(2026, 2, 8, 7), Date.UTC(2026, 10, 1, 6), Date.UTC(2026, 2, 29, 1), Date.UTC(2026, 9, 25, 1),
  Date.UTC(2026, 3, 4, 16), Date.UTC(2026, 9, 3, 16), Date.UTC(2026, 3, 4, 15), Date.UTC(2026, 9, 3, 15, 30),
  Date.UTC(2026, 2, 8, 5), Date.UTC(2026, 10, 1, 5), Date.UTC(2026, 3, 5, 3), Date.UTC(2026, 8, 6, 4),
  Date.UTC(2026, 3, 4, 14), Date.UTC(2026, 8, 26, 14), Date.UTC(2026, 2, 8, 5, 30), Date.UTC(2026, 10, 1, 4, 30)];

function from(): number {
  let t = rnd() < 0.6
    ? pick(changes) + ri(-6 * 3600, 6 * 3600) * 1000 + (rnd() < 0.3 ? ri(0, 999) : 0)
    : Date.UTC(2024, 0, 1) + Math.floor(rnd() * 4 * 365 * 86400) * 1000;
  if (rnd() < 0.5) t = Math.floor(t / 60000) * 60000 + (rnd() < 0.5 ? 0 : ri(0, 59) * 1000);
  return t;
}

const lines: string[] = [];
for (let i = 0; i < 3000; i++) {
  const expr = i < 2000 ? wellFormed() : soup();
  const zone = i < 2000 ? pick(zones) : 'UTC';
  const at = from();
  const expanded = expandCronShortcut(expr);
  let answer: string;
  if (validateCronExpression(expanded, zone)) answer = 'error';
  else {
    const next = getNextCronRun(expanded, at, zone);
    answer = next === 0 ? 'none' : String(next);
  }
  lines.push([expr.replaceAll('\t', '\\t'), zone, String(at), answer].join('\t'));
}
console.log(lines.join('\n'));
