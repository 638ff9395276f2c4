// cdp.mjs - drives headless Chromium (Debian's /usr/bin/chromium) over the DevTools protocol on
// a pipe (--remote-debugging-pipe: JSON messages ended by a NUL byte on file descriptors 3 and 4),
// so the report tests need no npm package; and a small PNG decoder to look at a screenshot.
import { spawn } from 'node:child_process';
import { inflateSync } from 'node:zlib';

export const CHROMIUM = process.env.MOONRL_CHROMIUM || '/usr/bin/chromium';

// Starts the browser with a fresh profile in profileDir and opens one page. Returns
// {send(method, params) -> result, on(method, fn), goto(url), evaluate(expr) -> value,
// screenshot(width, height) -> PNG Buffer, close()}.
export async function launch(profileDir) {
  const proc = spawn(CHROMIUM, ['--headless=new', '--no-sandbox', '--disable-gpu',
    '--no-first-run', '--no-default-browser-check', '--hide-scrollbars', '--mute-audio',
    '--remote-debugging-pipe', `--user-data-dir=${profileDir}`, 'about:blank'],
  { stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'] });
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr = (stderr + d).slice(-4000); });
  const toBrowser = proc.stdio[3];
  const fromBrowser = proc.stdio[4];
  const pending = new Map();
  const listeners = new Map();
  let nextId = 1;
  let buffered = Buffer.alloc(0);
  let exited = null;
  proc.on('exit', (code, signal) => {
    exited = `chromium exited (${code ?? signal}): ${stderr}`;
    for (const { reject } of pending.values()) reject(new Error(exited));
    pending.clear();
  });
  fromBrowser.on('data', (chunk) => {
    buffered = Buffer.concat([buffered, chunk]);
    let end;
    while ((end = buffered.indexOf(0)) >= 0) {
      const msg = JSON.parse(buffered.subarray(0, end).toString('utf8'));
      buffered = buffered.subarray(end + 1);
      if (msg.id && pending.has(msg.id)) {
        const { resolve, reject, method } = pending.get(msg.id);
        pending.delete(msg.id);
        if (msg.error) reject(new Error(`${method}: ${msg.error.message}`));
        else resolve(msg.result);
      } else if (msg.method) {
        for (const fn of listeners.get(msg.method) || []) fn(msg.params, msg.sessionId);
      }
    }
  });
  const raw = (method, params = {}, sessionId) => new Promise((resolve, reject) => {
    if (exited) { reject(new Error(exited)); return; }
    const id = nextId++;
    pending.set(id, { resolve, reject, method });
    const msg = { id, method, params };
    if (sessionId) msg.sessionId = sessionId;
    toBrowser.write(JSON.stringify(msg) + '\0');
  });
  const on = (method, fn) => {
    if (!listeners.has(method)) listeners.set(method, []);
    listeners.get(method).push(fn);
  };
  const { targetId } = await raw('Target.createTarget', { url: 'about:blank' });
  const { sessionId } = await raw('Target.attachToTarget', { targetId, flatten: true });
  const send = (method, params) => raw(method, params, sessionId);
  await send('Page.enable');
  await send('Runtime.enable');

  return {
    send,
    on,
    async goto(url) {
      const loaded = new Promise((resolve) => on('Page.loadEventFired', resolve));
      const r = await send('Page.navigate', { url });
      if (r.errorText) throw new Error(`${url}: ${r.errorText}`);
      await loaded;
    },
    async evaluate(expression) {
      const r = await send('Runtime.evaluate', { expression, returnByValue: true, awaitPromise: true });
      if (r.exceptionDetails) {
        throw new Error(`${expression}: ${r.exceptionDetails.exception?.description || r.exceptionDetails.text}`);
      }
      return r.result.value;
    },
    async screenshot(width, height) {
      await send('Emulation.setDeviceMetricsOverride', { width, height, deviceScaleFactor: 1, mobile: false });
      const { data } = await send('Page.captureScreenshot', { format: 'png' });
      return Buffer.from(data, 'base64');
    },
    async close() {
      try { await raw('Browser.close'); } catch { /* it may be gone already */ }
      if (!exited) await new Promise((resolve) => proc.once('exit', resolve));
    },
  };
}

// The pixels of an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes):
// {width, height, channels, pixels (Buffer, rows without filter bytes)}.
export function decodePng(buf) {
  if (buf.readUInt32BE(0) !== 0x89504e47) throw new Error('not a PNG');
  let pos = 8;
  let width; let height; let channels;
  const idat = [];
  while (pos < buf.length) {
    const len = buf.readUInt32BE(pos);
    const type = buf.toString('latin1', pos + 4, pos + 8);
    const data = buf.subarray(pos + 8, pos + 8 + len);
    if (type === 'IHDR') {
      width = data.readUInt32BE(0);
      height = data.readUInt32BE(4);
      const depth = data[8]; const color = data[9]; const interlace = data[12];
      if (depth !== 8 || (color !== 2 && color !== 6) || interlace !== 0) {
        throw new Error(`unsupported PNG (depth ${depth}, colour type ${color}, interlace ${interlace})`);
      }
      channels = color === 6 ? 4 : 3;
    } else if (type === 'IDAT') {
      idat.push(data);
    }
    pos += 12 + len;
  }
  const raw = inflateSync(Buffer.concat(idat));
  const stride = width * channels;
  const out = Buffer.alloc(stride * height);
  for (let y = 0; y < height; y++) {
    const filter = raw[y * (stride + 1)];
    const line = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1));
    for (let x = 0; x < stride; x++) {
      const a = x >= channels ? out[y * stride + x - channels] : 0;
      const b = y > 0 ? out[(y - 1) * stride + x] : 0;
      const c = x >= channels && y > 0 ? out[(y - 1) * stride + x - channels] : 0;
      let v = line[x];
      if (filter === 1) v += a;
      else if (filter === 2) v += b;
      else if (filter === 3) v += (a + b) >> 1;
      else if (filter === 4) {
        const p = a + b - c; const pa = Math.abs(p - a); const pb = Math.abs(p - b); const pc = Math.abs(p - c);
        v += pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      }
      out[y * stride + x] = v & 0xff;
    }
  }
  return { width, height, channels, pixels: out };
}
