// report_browser.test.mjs - report.html of a short training run opened in headless Chromium:
// the page is drawn (a screenshot that is not blank), it has one plot per metric group and every
// metric of metrics.jsonl in exactly one of them, the episode browser shows every logged episode
// and its filters keep exactly the matching ones, an episode opens turn by turn; and the report
// of a run with invalid UTF-8 and broken lines still renders, showing U+FFFD and the problems.
//
//   node --test tests/report/report_browser.test.mjs   (MOONRL_BUILD: the build folder)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync, appendFileSync, rmSync, cpSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { launch, decodePng } from './cdp.mjs';

const ROOT = process.env.MOONRL_ROOT || resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const BUILD = process.env.MOONRL_BUILD || join(ROOT, 'build');
const MOONRL = join(BUILD, 'moonrl');

let tmp; let run; let broken; let browser; const pageErrors = [];

// The JSON lines of a file that parse (the others skipped), as the report should read them.
function jsonLines(path) {
  const out = [];
  for (const line of readFileSync(path, 'utf8').split('\n')) {
    if (!line.trim()) continue;
    try { out.push(JSON.parse(line)); } catch { /* a broken line */ }
  }
  return out;
}

async function open(dir) {
  pageErrors.length = 0;
  await browser.goto(pathToFileURL(join(dir, 'report.html')).href);
}

const count = () => browser.evaluate("document.querySelectorAll('#episodes .episode').length");

// Sets a filter control and fires the event the page listens to; returns the shown count.
async function filter(id, value) {
  await browser.evaluate(`(() => { const e = document.getElementById(${JSON.stringify(id)});
    e.value = ${JSON.stringify(value)};
    e.dispatchEvent(new Event(${JSON.stringify(id === 'f-task' ? 'input' : 'change')})); })()`);
  return count();
}

before(async () => {
  tmp = mkdtempSync(join(tmpdir(), 'moonrl-report-'));
  execFileSync(MOONRL, ['run', join(ROOT, 'tests/report/short_run.lua'), tmp],
    { cwd: ROOT, env: { ...process.env, MOONRL_ROOT: ROOT }, stdio: 'pipe' });
  run = join(tmp, 'short');
  // a copy whose files a crash or a hand edit broke: invalid UTF-8 in an episode, a line that is
  // not JSON in episodes.jsonl and in metrics.jsonl
  broken = join(tmp, 'broken');
  cpSync(run, broken, { recursive: true });
  const eps = readFileSync(join(broken, 'episodes.jsonl'), 'latin1').split('\n').filter((l) => l);
  eps[0] = eps[0].replace(/"action":"/, '"action":"\xff\xfe bad bytes \xc3 ');
  eps.splice(1, 0, '{"step": 1, "record": [ truncated');
  writeFileSync(join(broken, 'episodes.jsonl'), Buffer.from(eps.join('\n') + '\n', 'latin1'));
  appendFileSync(join(broken, 'metrics.jsonl'), '{"step": 7, "reward/mean": \n');
  execFileSync(MOONRL, ['report', broken], { stdio: 'pipe' });
  browser = await launch(join(tmp, 'profile'));
  browser.on('Runtime.exceptionThrown', (p) => pageErrors.push(p.exceptionDetails.text));
});

after(async () => {
  if (browser) await browser.close();
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

test('the report of a training run is drawn: a screenshot that is not blank', async () => {
  await open(run);
  const png = await browser.screenshot(1280, 1200);
  if (process.env.MOONRL_SCREENSHOT) writeFileSync(process.env.MOONRL_SCREENSHOT, png);
  const { width, height, channels, pixels } = decodePng(png);
  assert.equal(width, 1280);
  let ink = 0; const colours = new Set();
  for (let i = 0; i < width * height * channels; i += channels) {
    const [r, g, b] = [pixels[i], pixels[i + 1], pixels[i + 2]];
    if (r < 240 || g < 240 || b < 240) ink++;
    colours.add((r << 16) | (g << 8) | b);
  }
  assert.ok(ink / (width * height) > 0.01, `only ${ink} pixels are not white`);
  assert.ok(colours.size > 20, `only ${colours.size} colours`);
  assert.deepEqual(pageErrors, []);
});

test('one plot per metric group, every metric of metrics.jsonl in exactly one', async () => {
  await open(run);
  const plots = await browser.evaluate(`[...document.querySelectorAll('.plot')].map((p) => ({
    group: p.dataset.group, svg: p.querySelectorAll('svg').length,
    lines: p.querySelectorAll('svg g.series').length,
    legend: [...p.querySelectorAll('.legend li')].map((li) => li.firstChild.nextSibling.textContent.trim()) }))`);
  const groups = plots.map((p) => p.group);
  assert.equal(new Set(groups).size, groups.length, `a group twice: ${groups}`);
  for (const p of plots) {
    assert.equal(p.svg, 1, `${p.group}: one svg`);
    assert.equal(p.lines, p.legend.length, `${p.group}: a line per legend entry`);
  }
  for (const g of ['rewards', 'success', 'loss', 'kl', 'entropy', 'grad', 'clip', 'time']) {
    assert.ok(groups.includes(g), `no ${g} plot in ${groups}`);
  }
  const keys = new Set();
  for (const row of jsonLines(join(run, 'metrics.jsonl'))) {
    for (const [k, v] of Object.entries(row)) if (k !== 'step' && typeof v === 'number') keys.add(k);
  }
  const shown = plots.flatMap((p) => p.legend);
  assert.equal(shown.length, new Set(shown).size, 'a metric in two plots');
  assert.deepEqual([...shown].sort(), [...keys].sort());
});

test('the episode browser shows every logged episode and its filters keep the matching ones', async () => {
  await open(run);
  const eps = jsonLines(join(run, 'episodes.jsonl'));
  assert.ok(eps.length > 0);
  assert.equal(await count(), eps.length);
  assert.equal(await browser.evaluate("document.getElementById('ep-count').textContent"),
    `${eps.length} of ${eps.length} episodes`);
  const wins = eps.filter((e) => e.success === true).length;
  assert.ok(wins > 0 && wins < eps.length, `the run should have successes and failures (${wins})`);
  assert.equal(await filter('f-success', 'yes'), wins);
  assert.equal(await filter('f-success', 'no'), eps.length - wins);
  await filter('f-success', '');
  const step = eps[eps.length - 1].step;
  assert.equal(await filter('f-step', String(step)), eps.filter((e) => e.step === step).length);
  await filter('f-step', '');
  const end = eps[0].end;
  assert.equal(await filter('f-end', end), eps.filter((e) => e.end === end).length);
  await filter('f-end', '');
  const task = JSON.stringify(eps[0].task);
  assert.equal(await filter('f-task', task), eps.filter((e) => JSON.stringify(e.task) === task).length);
  assert.equal(await filter('f-task', 'no task has this text'), 0);
  assert.equal(await filter('f-task', ''), eps.length);
  // the first episode, opened: one row per turn, with its action
  const turns = await browser.evaluate(`new Promise((done) => {
    const d = document.querySelector('#episodes .episode');
    d.addEventListener('toggle', () => done([...d.querySelectorAll('tr.turn')].map((r) => r.cells[1].textContent)));
    d.open = true; })`);
  assert.equal(turns.length, eps[0].record.length);
  assert.deepEqual(pageErrors, []);
});

test('a run with invalid UTF-8 and broken lines still renders and names the problems', async () => {
  await open(broken);
  const readable = jsonLines(join(broken, 'episodes.jsonl')).length;
  assert.equal(await count(), readable);
  const problems = await browser.evaluate("document.querySelector('.problems')?.textContent || ''");
  assert.match(problems, /episodes\.jsonl line 2/);
  assert.match(problems, /metrics\.jsonl line \d+/);
  const first = await browser.evaluate(`new Promise((done) => {
    const d = document.querySelector('#episodes .episode');
    d.addEventListener('toggle', () => done(d.querySelector('tr.turn').cells[1].textContent));
    d.open = true; })`);
  assert.ok(first.includes('\uFFFD') && first.includes('bad bytes'), JSON.stringify(first));
  assert.ok(await browser.evaluate("document.querySelectorAll('.plot').length") > 5);
  assert.deepEqual(pageErrors, []);
});
