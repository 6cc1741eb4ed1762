// The Node.js side of a tfjs:wasm-browser cell (worker.mjs stays the protocol's endpoint): a static server on
// 127.0.0.1 with the headers that make the page cross-origin isolated (SharedArrayBuffer, so the wasm backend's
// threads), headless Chromium started as this worker's child (its process group: the manager's kill of the worker's
// group ends it; setpriv's parent-death signal ends the browser process with this one), and a Chrome DevTools
// protocol client over --remote-debugging-pipe (fd 3 to Chromium, fd 4 from it; JSON messages, each ending in NUL).
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const PACKAGE_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const ISOLATION = {
  'Cross-Origin-Opener-Policy': 'same-origin',
  'Cross-Origin-Embedder-Policy': 'require-corp',
  'Cross-Origin-Resource-Policy': 'same-origin',
  'Cache-Control': 'no-store',
};
const TYPES = { '.html': 'text/html', '.mjs': 'text/javascript', '.js': 'text/javascript', '.wasm': 'application/wasm',
  '.json': 'application/json', '.safetensors': 'application/octet-stream', '.map': 'application/json' }; // prettier-ignore
export const FLAGS = [
  '--headless=new', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-extensions',
  '--disable-background-networking', '--disable-component-update', '--disable-sync', '--disable-quic',
  '--remote-debugging-pipe',
  // a page of a headless browser may count as hidden: its renderer neither deprioritised nor its timers throttled
  '--disable-renderer-backgrounding', '--disable-background-timer-throttling', '--disable-backgrounding-occluded-windows',
]; // prettier-ignore
export const PROFILE_PREFIX = 'chromium-'; // the user-data-dir of a cell's Chromium: <the cell's folder>/chromium-*

/** The Chromium executable: $FWBENCH_CHROMIUM, else chromium, chromium-browser or google-chrome on PATH. */
export function chromiumExecutable() {
  const candidates = process.env.FWBENCH_CHROMIUM ? [process.env.FWBENCH_CHROMIUM] : ['chromium', 'chromium-browser', 'google-chrome'];
  for (const name of candidates) {
    const places = name.includes('/') ? [name] : (process.env.PATH ?? '').split(':').map((dir) => path.join(dir, name));
    for (const place of places) {
      try {
        fs.accessSync(place, fs.constants.X_OK);
        if (fs.statSync(place).isFile()) return place;
      } catch {
        // not there
      }
    }
  }
  throw new Error('no Chromium found ($FWBENCH_CHROMIUM, chromium, chromium-browser, google-chrome on PATH)');
}

/** A static server of `roots` ({url prefix: file or folder}) on 127.0.0.1, an ephemeral port: nothing else is
 * served. Resolves to the server once it listens. */
export function serve(roots) {
  const server = http.createServer((request, response) => {
    const url = new URL(request.url, 'http://127.0.0.1');
    const pathname = decodeURIComponent(url.pathname);
    let file = null;
    for (const [prefix, root] of Object.entries(roots)) {
      if (pathname === prefix) file = root;
      else if (prefix.endsWith('/') && pathname.startsWith(prefix)) {
        const candidate = path.resolve(root, `.${pathname.slice(prefix.length - 1)}`);
        if (candidate.startsWith(root + path.sep)) file = candidate;
      }
      if (file !== null) break;
    }
    let body = null;
    try {
      if (file !== null && fs.statSync(file).isFile()) body = fs.readFileSync(file);
    } catch {
      // not found
    }
    if (body === null) {
      response.writeHead(404, ISOLATION).end();
      return;
    }
    response.writeHead(200, { ...ISOLATION, 'Content-Type': TYPES[path.extname(file)] ?? 'application/octet-stream' });
    response.end(body);
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve(server));
  });
}

function which(name) {
  for (const dir of (process.env.PATH ?? '').split(':')) {
    const place = path.join(dir, name);
    try {
      fs.accessSync(place, fs.constants.X_OK);
      return place;
    } catch {
      // not here
    }
  }
  return null;
}

function statusOf(pid) {
  try {
    return fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  } catch {
    return null;
  }
}

function field(status, name) {
  const found = status?.match(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm'));
  return found ? Number(found[1]) * 1024 : 0;
}

/** Headless Chromium and its DevTools pipe. */
export class Browser {
  /** Chromium started with its profile in `folder` (the cell's: the manager removes it after a killed worker). */
  constructor(executable, folder, { resultFd = null } = {}) {
    this.executable = executable;
    this.profile = fs.mkdtempSync(path.join(folder, PROFILE_PREFIX));
    const setpriv = which('setpriv');
    const command = [executable, ...FLAGS, `--user-data-dir=${this.profile}`, 'about:blank'];
    // the result pipe this worker inherited (not close-on-exec) is closed in the child: only the worker writes it
    const closing = resultFd !== null && resultFd > 4 ? `exec ${resultFd}>&-; ` : '';
    const shell = resultFd !== null && resultFd > 9 ? '/bin/bash' : '/bin/sh'; // dash closes one-digit fds only
    const launched = setpriv ? [setpriv, '--pdeathsig', 'KILL', ...command] : command;
    this.pdeathsig = setpriv !== null;
    this.stderrTail = '';
    this.child = spawn(shell, ['-c', `${closing}exec "$@"`, 'sh', ...launched], {
      stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'],
      // its sockets go into TMPDIR, whose path must fit a socket address (108 bytes)
      env: { ...process.env, HOME: this.profile, XDG_CONFIG_HOME: this.profile, XDG_CACHE_HOME: this.profile,
        TMPDIR: this.profile.length <= 60 ? this.profile : '/tmp' }, // prettier-ignore
    });
    this.pid = this.child.pid;
    this.child.stderr.on('data', (chunk) => {
      this.stderrTail = (this.stderrTail + chunk.toString()).slice(-4000);
    });
    this.exited = new Promise((resolve) => this.child.once('exit', (code, signal) => resolve(code ?? signal)));
    this.toChromium = this.child.stdio[3];
    this.fromChromium = this.child.stdio[4];
    this.buffer = Buffer.alloc(0);
    this.nextId = 0;
    this.pending = new Map();
    this.closed = null;
    this.fromChromium.on('data', (chunk) => this.receive(chunk));
    this.fromChromium.on('close', () => this.lost('the DevTools pipe closed'));
    this.child.once('exit', (code, signal) => this.lost(`Chromium exited (${code ?? signal})`));
    this.child.once('error', (error) => this.lost(`Chromium did not start: ${error.message}`));
  }

  lost(why) {
    this.closed ??= why;
    const tail = this.stderrTail.trim().split('\n').slice(-3).join(' | ');
    for (const { reject } of this.pending.values()) reject(new Error(`${why}${tail ? `; its stderr ended: ${tail}` : ''}`));
    this.pending.clear();
  }

  receive(chunk) {
    this.buffer = Buffer.concat([this.buffer, chunk]);
    let end;
    while ((end = this.buffer.indexOf(0)) >= 0) {
      const message = JSON.parse(this.buffer.subarray(0, end).toString('utf8'));
      this.buffer = this.buffer.subarray(end + 1);
      const waiting = this.pending.get(message.id);
      if (waiting === undefined) continue; // an event
      this.pending.delete(message.id);
      if (message.error) waiting.reject(new Error(`${waiting.method}: ${message.error.message ?? JSON.stringify(message.error)}`));
      else waiting.resolve(message.result);
    }
  }

  /** The DevTools method's result (`session`: a page's session id). */
  call(method, params = {}, session = undefined) {
    if (this.closed !== null) return Promise.reject(new Error(this.closed));
    const id = ++this.nextId;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, method });
      this.toChromium.write(JSON.stringify({ id, method, params, ...(session ? { sessionId: session } : {}) }) + '\0');
    });
  }

  /** A new page at `url`, navigator.hardwareConcurrency reported as `hardwareConcurrency` (set before it loads):
   * its session id. */
  async open(url, hardwareConcurrency) {
    const { targetId } = await this.call('Target.createTarget', { url: 'about:blank' });
    const { sessionId } = await this.call('Target.attachToTarget', { targetId, flatten: true });
    await this.call('Runtime.enable', {}, sessionId);
    await this.call('Emulation.setHardwareConcurrencyOverride', { hardwareConcurrency }, sessionId);
    await this.call('Page.navigate', { url }, sessionId);
    this.session = sessionId;
    return sessionId;
  }

  /** `expression`'s value in the page (a promise awaited); an exception thrown there is thrown here with its text. */
  async evaluate(expression) {
    const answer = await this.call('Runtime.evaluate', { expression, awaitPromise: true, returnByValue: true }, this.session);
    if (answer.exceptionDetails) {
      const details = answer.exceptionDetails;
      throw new Error(`in the page: ${details.exception?.description ?? details.text}`);
    }
    return answer.result.value;
  }

  /** Waits until the page's module has run (window.fwbenchLoaded), at most `seconds`. */
  async loaded(seconds) {
    const deadline = Date.now() + seconds * 1000;
    for (;;) {
      if (await this.evaluate('window.fwbenchLoaded === true')) return;
      if (Date.now() > deadline) throw new Error(`the page's module did not load within ${seconds} s`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }

  async version() {
    return (await this.call('Browser.getVersion')).product;
  }

  /** Chromium's processes: the browser and its descendants (zygotes, GPU, utility, renderers). */
  processes() {
    const parents = new Map();
    for (const name of fs.readdirSync('/proc')) {
      if (!/^\d+$/.test(name)) continue;
      try {
        const stat = fs.readFileSync(`/proc/${name}/stat`, 'utf8');
        parents.set(Number(name), Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]));
      } catch {
        // gone
      }
    }
    const found = new Set([this.pid]);
    for (let grew = true; grew; ) {
      grew = false;
      for (const [pid, parent] of parents) {
        if (found.has(parent) && !found.has(pid)) {
          found.add(pid);
          grew = true;
        }
      }
    }
    return [...found].filter((pid) => statusOf(pid) !== null);
  }

  /** The peak resident memory of each of its processes now (VmHWM), summed, and how many. */
  peakMemory() {
    const pids = this.processes();
    return { bytes: pids.reduce((sum, pid) => sum + field(statusOf(pid), 'VmHWM'), 0), processes: pids.length };
  }

  /** Its processes' proportional set size now (Pss: each shared page divided among the processes mapping it),
   * summed: what VmHWM's sum counts several times (Chromium's binary and libraries, shared memory). */
  proportionalMemory() {
    let bytes = 0;
    for (const pid of this.processes()) {
      try {
        bytes += field(fs.readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8'), 'Pss');
      } catch {
        // gone, or no smaps_rollup (Linux before 4.14)
      }
    }
    return bytes;
  }

  /** Browser.close, then SIGKILL to whatever of it is left, waiting (at most 5 s) until none is; the profile
   * removed. Returns the pids still there (none, normally). */
  async close() {
    const pids = this.processes();
    if (this.closed === null) {
      this.call('Browser.close').catch(() => {});
      await Promise.race([this.exited, new Promise((resolve) => setTimeout(resolve, 2000))]);
    }
    const left = this.kill(pids);
    const deadline = Date.now() + 5000;
    while (left.some((pid) => statusOf(pid) !== null && !/^State:\s+Z/m.test(statusOf(pid))) && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    await Promise.race([this.exited, new Promise((resolve) => setTimeout(resolve, 1000))]);
    fs.rmSync(this.profile, { recursive: true, force: true });
    return left.filter((pid) => statusOf(pid) !== null && !/^State:\s+Z/m.test(statusOf(pid)));
  }

  /** SIGKILL to `pids` and to every process of the browser still there (synchronous: also on the way out). */
  kill(pids = []) {
    const all = [...new Set([...pids, ...this.processes()])];
    for (const pid of all) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone
      }
    }
    return all;
  }
}

/** The roots a cell's page is served from: the tfjs package (the page, TF.js's bundles, the engine-neutral .mjs
 * files), the model files' folder, the weights file, and the cell's inputs and parity inputs (not its
 * folder: Chromium's profile is there). */
export function cellRoots(prepared) {
  return {
    '/pkg/': PACKAGE_DIR,
    '/model/': path.dirname(path.resolve(prepared.model.file)),
    '/weights': path.resolve(prepared.weights),
    '/cell/inputs.safetensors': path.resolve(prepared.inputs),
    ...(prepared.parity === null ? {} : { '/cell/parity.safetensors': path.resolve(prepared.parity) }),
  };
}
