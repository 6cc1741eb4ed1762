// fwbench's worker for TF.js in Node.js: one cell, speaking the same protocol as the Python worker
// (fwbench/messages.py; docs/architecture.md, "A worker in another language").
//
// The cell's Python worker prepared its folder (fwbench/frameworks/tfjs/external.py: cell.json with the job, the
// model's structure, weights, inputs, the float64 reference) and became this process (execve: same pid, CPU
// pinning, process group, parent-death signal). It reports each stage it enters and exactly one result as JSON lines
// on --result-fd, whatever happens (an uncaught error too), and removes the folder before it exits; an interleaved
// job's commands arrive on stdin, one JSON line each (calibrate, block, finish). Calls are timed with
// process.hrtime.bigint(); each call runs under tf.tidy, so no tensor outlives it; the first call is timed apart,
// then the warm-up, then the manager's blocks. Its parity check is Python's (fwbench.runner.external compare).
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';

const NON_FINITE = /"__fwbench_(-?Infinity|NaN)__"/g; // compare's JSON-safe stand-ins, sent as Python's literals

/** --result-fd N --manager-pid P --folder DIR (parseArgs needs Node.js 18.3; this works on any). */
function parseArguments(argv) {
  const args = {};
  for (let i = 0; i < argv.length; i += 2) args[argv[i].replace(/^--/, '')] = argv[i + 1];
  return args;
}

const args = parseArguments(process.argv.slice(2));
if (process.ppid !== Number(args['manager-pid'])) process.exit(3); // the manager is gone already
const channel = Number(args['result-fd']);
const seconds = () => Number(process.hrtime.bigint()) / 1e9;

function send(type, fields = {}) {
  fs.writeSync(channel, JSON.stringify({ type, ...fields }).replace(NON_FINITE, '$1') + '\n');
}

// -- the machine, as the Python worker reads it (fwbench.measure.memory, .environment) ---------------------------
function statusBytes(field) {
  const found = fs.readFileSync('/proc/self/status', 'utf8').match(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm'));
  return found ? Number(found[1]) * 1024 : null;
}

function resetPeakRss(pid = 'self') {
  try {
    fs.writeFileSync(`/proc/${pid}/clear_refs`, '5');
    return true;
  } catch {
    return false;
  }
}

function allowedCpus(task = 'self') {
  return fs.readFileSync(`/proc/${task}/status`, 'utf8').match(/^Cpus_allowed_list:\s+(\S+)/m)[1];
}

function cpuList(text) {
  return text.split(',').flatMap((part) => {
    const [first, last] = part.split('-').map(Number);
    return Array.from({ length: (last ?? first) - first + 1 }, (_, i) => first + i);
  });
}

function threadCpuLists() {
  const lists = new Set();
  for (const task of fs.readdirSync('/proc/self/task')) {
    try {
      lists.add(allowedCpus(`self/task/${task}`));
    } catch {
      // the thread ended meanwhile
    }
  }
  return [...lists].sort();
}

function loadavg() {
  return fs.readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).map(Number);
}

/** details.kernels of a kernel probe that threw: one entry saying why (the cell is kept). */
function probeFailure(error) {
  const reason = `the probe failed: ${error?.name ?? 'Error'}: ${error?.message ?? error}`;
  return [{ library: null, version: null, isa: null, ops: [], source: null, not_reported: reason }];
}

// -- the cell ----------------------------------------------------------------------------------------------------
class Cell {
  constructor(folder) {
    this.folder = folder;
    this.result = { stage_seconds: {} };
    this.stageName = 'start';
    this.stageStarted = seconds() - process.uptime(); // stage start: this process's start (the preparation: prepare_s)
    this.prepared = JSON.parse(fs.readFileSync(`${folder}/cell.json`, 'utf8'));
    this.job = this.prepared.job;
    this.result.prepare_s = this.prepared.prepare_s;
    this.timedCalls = 0; // the calls of the manager's timed blocks
    this.commands = readline.createInterface({ input: process.stdin, terminal: false })[Symbol.asyncIterator]();
  }

  stage(name) {
    const now = seconds();
    this.result.stage_seconds[this.stageName] = now - this.stageStarted;
    this.stageName = name;
    this.stageStarted = now;
    send('stage', { stage: name });
  }

  async run() {
    const { job, prepared } = this;
    const { case: cellCase } = job;
    if (!['inference', 'generate'].includes(cellCase.phase)) {
      throw new Error(`tfjs runs phases inference and generate only, not ${cellCase.phase}`);
    }
    if (job.export_to !== null) throw new Error('tfjs writes no deployment artefact (fwbench export)');
    if (job.profile_to !== null) throw new Error('tfjs has no profiler fwbench reads (fwbench profile)');
    if (!job.interleaved && job.verify_output === null) {
      throw new Error("tfjs cells are timed in interleaved rounds only (--interleave off stops on scipy's rule)");
    }
    const mode = cellCase.runtime.split(':')[1];
    if (mode === 'wasm-browser') return this.browserCell();

    this.stage('import');
    const backend = await import('./backend.mjs');
    const { readSafetensors, tensorsOf } = await import('./weights.mjs');
    this.timing = await import('./timing.mjs');
    this.serializeSafetensors = (await import('./safetensors.mjs')).serializeSafetensors;
    const tf = await backend.loadTf(mode);
    this.tf = tf;
    this.backend = backend;
    this.result.threads_effective = await backend.threadReport(tf, mode);
    this.result.matmul_precision = { tfjs: 'float32 (TF.js has no reduced-precision matmul on cpu or wasm)' };
    this.result.versions = backend.versions(tf);

    this.stage('build');
    if (cellCase.phase === 'generate') return this.generateCell();
    const { forward, layout } = await backend.buildModel(tf, prepared.model, prepared.weights);
    this.forward = forward;
    const inputs = tensorsOf(tf, readSafetensors(prepared.inputs));
    if (layout !== undefined) this.result.layout = layout;
    this.parityInputs = () => tensorsOf(tf, readSafetensors(prepared.parity, 'input/'), 'input/');

    if (job.verify_output !== null) return this.verify(inputs);
    const step = backend.makeStep(tf, forward, inputs);
    this.stage('first_call');
    this.result.first_call_s = this.timing.timeBlock(step, 1, seconds);
    const timing = await this.timeSteps(step);
    Object.assign(this.result, { status: 'ok', ...timing });
    if (job.record_kernels ?? true) await this.recordKernels(step); // the cell's first round, at every shape
    if (job.check_parity && prepared.parity !== null) this.checkParity();
    this.stage('done');
    return this.result;
  }

  /** tfjs:wasm-browser (browser/browser.mjs, browser/page.mjs): the same model file and weights in a
   * cross-origin-isolated page of headless Chromium, its wasm thread pool asked for the cell's --threads; the first
   * call, warm-up, calibration and blocks timed in the page, the parity outputs and checkpoints serialized there
   * (fwbench verify / diff: one call at the cell's shape, serialized there too: browserVerify). */
  async browserCell() {
    const { job, prepared } = this;
    if (job.case.phase !== 'inference') {
      throw new Error(`tfjs:wasm-browser runs phase inference only so far, not ${job.case.phase} (tfjs:wasm does)`);
    }
    this.stage('import');
    const { Browser, cellRoots, chromiumExecutable, serve } = await import('./browser/browser.mjs');
    const { threads } = job.settings;
    const executable = chromiumExecutable();
    this.server = await serve(cellRoots(prepared));
    this.browser = new Browser(executable, this.folder, { resultFd: channel });
    const browser = this.browser;
    const chromium = await browser.version();
    // TF.js sizes its pool min(asked, 8, navigator.hardwareConcurrency / 2), read once as its wasm module starts:
    // the page reports twice the threads asked for, so the cell's budget is what caps it
    const reported = 2 * threads;
    await browser.open(`http://127.0.0.1:${this.server.address().port}/pkg/browser/page.html`, reported);
    await browser.loaded(60);
    const page = await browser.evaluate(`fwbench.init(${threads})`);
    const hardware = os.availableParallelism?.() ?? os.cpus().length;
    const wasmFile = page.wasm_files.at(-1) ?? null;
    this.result.browser = {
      chromium, executable, pdeathsig: browser.pdeathsig, user_agent: page.user_agent,
      cross_origin_isolated: page.cross_origin_isolated, shared_array_buffer: page.shared_array_buffer,
      simd: page.simd, multithread: page.multithread,
      threads_requested: threads, threads_got: page.threads_got,
      hardware_concurrency_real: hardware, hardware_concurrency_reported: page.hardware_concurrency_reported,
      timer_resolution_s: page.timer_resolution_s, wasm_file: wasmFile,
    }; // prettier-ignore
    this.result.threads_effective = {
      intra_op: page.threads_got, inter_op: 1, simd: page.simd, multithread: page.multithread,
      why: "TF.js's wasm thread pool in a cross-origin-isolated page of headless Chromium, asked for --threads",
    }; // prettier-ignore
    this.result.matmul_precision = { tfjs: 'float32 (TF.js has no reduced-precision matmul on wasm)' };
    this.result.versions = { ...page.versions, chromium, node: process.versions.node };
    const short = [];
    if (!page.cross_origin_isolated) short.push('the page is not cross-origin isolated');
    if (page.threads_got !== threads) short.push(`the page got ${page.threads_got} of the ${threads} threads asked for`);
    if (!page.simd) short.push('no WebAssembly SIMD');
    this.browserFlags = short.length ? [`browser: ${short.join('; ')}`] : [];
    const minBlock = job.settings.min_block_s;
    if (job.verify_output === null && !(page.timer_resolution_s <= minBlock / 100)) {
      throw new Error(`the page's performance.now() steps by ${page.timer_resolution_s * 1e6} µs, over 1/100 of the ` +
        `${minBlock} s block (is the page cross-origin isolated? ${page.cross_origin_isolated})`); // prettier-ignore
    }

    this.stage('build');
    const { layout } = await browser.evaluate(`fwbench.build(${JSON.stringify({ file: path.basename(prepared.model.file), structure: prepared.model.structure })})`);
    if (layout !== null) this.result.layout = layout;
    if (job.verify_output !== null) return this.browserVerify();
    this.stage('first_call');
    this.result.first_call_s = await browser.evaluate('fwbench.firstCall()');
    const chromiumPeak = () => browser.peakMemory().bytes;
    const engine = {
      warmUp: (calls, budget, rules) => browser.evaluate(`fwbench.warmUp(${calls}, ${budget}, ${JSON.stringify(rules)})`),
      calibrate: (minimum, budget) => browser.evaluate(`fwbench.calibrate(${minimum}, ${budget})`),
      block: (calls) => browser.evaluate(`fwbench.block(${calls})`),
      numTensors: () => browser.evaluate('fwbench.numTensors()'),
      peakMemory: () => statusBytes('VmHWM') + chromiumPeak(),
      resetPeak: () => [process.pid, ...browser.processes()].every((pid) => resetPeakRss(pid)),
    };
    const timing = await this.timeEngine(engine);
    this.result.compile_health.flags.push(...this.browserFlags);
    Object.assign(this.result, { status: 'ok', ...timing });
    if (job.record_kernels ?? true) {
      this.stage('kernels'); // the cell's first round, at every shape; a probe that fails says why, the cell is kept
      try {
        this.result.kernels = await browser.evaluate(`fwbench.kernels(${JSON.stringify(this.result.versions)})`);
      } catch (error) {
        this.result.kernels = probeFailure(error);
      }
    }
    if (job.check_parity && prepared.parity !== null) {
      this.stage('parity');
      const path_ = `${this.folder}/parity-outputs.safetensors`;
      fs.writeFileSync(path_, Buffer.from(await browser.evaluate('fwbench.capture()'), 'base64'));
      const { parity, reason } = this.compare(path_);
      this.result.parity = parity;
      this.result.precision = { policy: job.case.dtype, observable: false };
      if (reason !== null) Object.assign(this.result, { status: 'mismatch', reason, samples_s: [] });
    }
    this.result.peak_memory_note = "the sum of VmHWM over Chromium's processes and the Node.js worker's";
    await this.closeBrowser();
    this.stage('done');
    return this.result;
  }

  /** fwbench verify / diff of tfjs:wasm-browser (after the page's build): one call in the page on the cell's inputs,
   * its outputs and checkpoints serialized there, then Chromium closed and the rest as verify's in Node.js. */
  async browserVerify() {
    this.stage('first_call');
    const bytes = Buffer.from(await this.browser.evaluate('fwbench.capture(true)'), 'base64');
    await this.closeBrowser();
    const path_ = `${this.folder}/verify-outputs.safetensors`;
    fs.writeFileSync(path_, bytes);
    const { parseSafetensors, serializeSafetensors } = await import('./safetensors.mjs');
    this.serializeSafetensors = serializeSafetensors;
    const arrays = parseSafetensors(new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.length), 'the page');
    return this.verified(path_, arrays);
  }

  /** Chromium closed (its process count and proportional memory recorded first), the page's server stopped. */
  async closeBrowser() {
    const { browser } = this;
    this.result.browser.processes = browser.peakMemory().processes;
    this.result.browser.pss_bytes_at_end = browser.proportionalMemory();
    const left = await browser.close();
    this.browser = null;
    if (left.length) throw new Error(`Chromium processes ${left.join(', ')} did not end`);
    this.server.close();
  }

  /** Phase generate (generate.mjs): the cache allocated, a kept first generation (the cell's first call), warm-up
   * and the manager's blocks of one generation each, the last timed generation's tokens against the kept one's, then
   * Python's record and token check of them (fwbench.runner.external generation). */
  async generateCell() {
    const { tf, job, prepared, backend } = this;
    const { settings } = job;
    const { readSafetensors, tensorsOf } = await import('./weights.mjs');
    const { Generator, firstDifference } = await import('./generate.mjs');
    const { cachedForward, newCache } = await backend.buildDecoder(tf, prepared.model, prepared.weights);
    const prompt = tensorsOf(tf, readSafetensors(prepared.inputs)).input_ids;
    const [batch, promptLen] = prompt.shape;
    this.stage('compile'); // nothing compiles in TF.js: the cache is allocated
    const generator = new Generator(tf, cachedForward, newCache(batch, promptLen + settings.new_tokens), prompt,
      settings.new_tokens, seconds); // prettier-ignore
    this.stage('first_call');
    const started = seconds();
    const kept = generator.kept();
    this.result.first_call_s = seconds() - started;
    const step = () => generator.generate();
    const timing = await this.timeSteps(step, true);
    const calls = this.timedCalls; // the blocks' calls (not the warm-up's, nor an hf2019 calibration's)
    const differs = firstDifference(generator.lastGenerated(), kept.tokens);
    generator.dispose();
    prompt.dispose();
    Object.assign(this.result, { status: 'ok', ...timing });
    this.stage('parity');
    const path = `${this.folder}/generation.safetensors`;
    this.write(path, {
      tokens: kept.tokens,
      logits: kept.logits,
      first_generation_s: { shape: [1], data: Float64Array.of(this.result.first_call_s) },
      ...generator.timedSeconds(calls),
    });
    const { generation, parity, reason } = this.service('generation', path);
    this.result.generation = { ...generation, generations_called: generator.prefillS.length };
    if (parity !== null) this.result.parity = parity;
    this.result.precision = { policy: job.case.dtype, observable: false };
    if (differs !== null) {
      Object.assign(this.result, {
        status: 'mismatch', reason: `the last timed generation's tokens differ from the first's from step ${differs}`,
        samples_s: [],
      }); // prettier-ignore
    } else if (reason !== null) Object.assign(this.result, { status: 'mismatch', reason, samples_s: [] });
    this.stage('done');
    return this.result;
  }

  /** Stage kernels, after the timed calls (the cell's first round: job.record_kernels): details.kernels from one
   * more, untimed call of `step` (kernels.mjs); a probe that fails says why, the cell is kept. */
  async recordKernels(step) {
    this.stage('kernels');
    try {
      const { kernelLibraries } = await import('./kernels.mjs');
      this.result.kernels = await kernelLibraries(this.tf, this.job.case.runtime.split(':')[1], step, this.result.versions);
    } catch (error) {
      this.result.kernels = probeFailure(error);
    }
  }

  /** Stages warmup and timing of `step` (after its first call): the warm-up calls, then the manager's blocks, with
   * the memory peaks and the tensor count around them; returns the timing fields. `oneCallPerBlock`: a call is a
   * block whatever it lasts (phase generate), so the calibration calls nothing. */
  async timeSteps(step, oneCallPerBlock = false) {
    return this.timeEngine(this.nodeEngine(step), oneCallPerBlock);
  }

  /** What times `step` in this process (the engine of timeEngine and serveBlocks; browser.mjs's page is the other). */
  nodeEngine(step) {
    const { tf } = this;
    const { warmUp, timeBlock, calibrateBlock } = this.timing;
    return {
      warmUp: async (calls, budget, rules) => warmUp(step, calls, budget, seconds, rules),
      calibrate: async (minBlock, budget) => calibrateBlock(step, minBlock, budget, seconds),
      block: async (calls) => {
        const startUnix = (performance.timeOrigin + performance.now()) / 1000;
        return [timeBlock(step, calls, seconds), startUnix];
      },
      numTensors: async () => tf.memory().numTensors,
      peakMemory: () => statusBytes('VmHWM'),
      resetPeak: () => resetPeakRss(),
    };
  }

  /** Stages warmup and timing of an engine's step (nodeEngine; after its first call): the warm-up calls, then the
   * manager's blocks, with the memory peaks and the tensor count around them; returns the timing fields. */
  async timeEngine(engine, oneCallPerBlock = false) {
    const { job, prepared } = this;
    this.stage('warmup');
    const warmup = await engine.warmUp(job.settings.warmup_calls, job.settings.max_time_s, prepared.timer);
    this.result.warmup_calls = warmup.length;
    this.result.warmup_call_s = warmup;

    this.stage('timing');
    const tensorsBefore = await engine.numTensors();
    this.result.loadavg_before_timing = loadavg();
    this.result.rss_before_timing_bytes = statusBytes('VmRSS');
    this.result.peak_memory_before_timing_bytes = engine.peakMemory();
    this.result.peak_memory_scope = engine.resetPeak() ? 'timed' : 'process';
    const timing = await this.serveBlocks(engine, oneCallPerBlock ? warmup.at(-1) : null);
    this.result.peak_memory_bytes = engine.peakMemory();
    this.result.compile_health = { after_warmup: {}, after_timing: {}, during_timing: {}, recompiled_in_timed_loop: false, flags: [] };
    const tensorsAfter = await engine.numTensors();
    this.result.tfjs_tensors = { before_timing: tensorsBefore, after_timing: tensorsAfter };
    if (tensorsAfter !== tensorsBefore) throw new Error(`the timed calls leaked ${tensorsAfter - tensorsBefore} tensors`);
    return timing;
  }

  async nextCommand() {
    const { value, done } = await this.commands.next();
    if (done) throw new Error("the manager's command stream ended before finish");
    return JSON.parse(value);
  }

  /** Interleaved timing (fwbench.runner.cell.Cell.serve_blocks): ready, then the manager's commands until finish.
   * `oneCallSeconds` (phase generate: the last warm-up call's): the calibration answers one call per block, lasting
   * that, without calling. */
  async serveBlocks(engine, oneCallSeconds = null) {
    const { settings, budget_s: budget } = this.job;
    let number = this.prepared.timer.hf2019_number;
    let started = null;
    const samples = [];
    send('ready', { peak_memory_bytes: engine.peakMemory() });
    for (;;) {
      const command = await this.nextCommand();
      if (command.command === 'finish') break;
      if (command.command === 'calibrate') {
        let blockSeconds;
        if (settings.protocol === 'hf2019') [blockSeconds] = await engine.block(number);
        else if (oneCallSeconds !== null) [number, blockSeconds] = [1, oneCallSeconds];
        else [number, blockSeconds] = await engine.calibrate(settings.min_block_s, budget ?? settings.max_time_s);
        send('calibrated', { calls_per_block: number, block_s: blockSeconds });
        started = seconds();
        continue;
      }
      const calls = Number(command.calls || number);
      started ??= seconds();
      const [blockSeconds, startUnix] = await engine.block(calls);
      if (!command.calibration) {
        this.timedCalls += calls;
        samples.push(blockSeconds / calls);
        number = calls;
      }
      send('block', { seconds: blockSeconds, calls, start_unix_s: startUnix });
    }
    return {
      samples_s: samples,
      calls_per_sample: number,
      stop_reason: 'interleaved',
      timing_elapsed_s: started === null ? 0 : seconds() - started,
    };
  }

  /** One call on `inputs` with the checkpoints, written to the folder's `<name>.safetensors` (outputs by name,
   * checkpoint/<name>): [its path, its arrays]. */
  capture(inputs, name) {
    const arrays = this.backend.arraysOf(this.tf, this.forward, inputs, true);
    this.tf.dispose(Object.values(inputs));
    const path = `${this.folder}/${name}.safetensors`;
    this.write(path, arrays);
    return [path, arrays];
  }

  write(path, arrays) {
    fs.writeFileSync(path, this.serializeSafetensors(arrays));
  }

  /** Python's check of the outputs and checkpoints at `path` against the float64 reference (the tolerance, and where
   * a mismatch starts): {parity, reason (null when it passed)}. */
  compare(path) {
    return this.service('compare', path);
  }

  /** `python -m fwbench.runner.external <command> FOLDER PATH`'s one JSON line (compare, generation). */
  service(command, path) {
    const { folder, python } = this.prepared;
    const check = spawnSync(python, ['-m', 'fwbench.runner.external', command, folder, path], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    if (check.status !== 0) {
      throw new Error(`${python} -m fwbench.runner.external ${command} ended with ${check.status ?? check.signal}`);
    }
    return JSON.parse(check.stdout.trim().split('\n').at(-1));
  }

  /** After timing: the outputs and checkpoints at the parity shape against the float64 reference; a failure makes
   * the cell mismatch (its reason names the first diverging checkpoint). */
  checkParity() {
    this.stage('parity');
    const [path] = this.capture(this.parityInputs(), 'parity-outputs');
    const { parity, reason } = this.compare(path);
    this.result.parity = parity;
    this.result.precision = { policy: this.job.case.dtype, observable: false };
    if (reason !== null) Object.assign(this.result, { status: 'mismatch', reason, samples_s: [] });
  }

  /** fwbench verify / diff: one call at the cell's shape, its outputs written to the job's verify_output; with the
   * job's checkpoints (fwbench diff) also each checkpoint (checkpoint/<name>) and that call's outputs (tapped/<name>:
   * the same call); without, outputs off the reference are located (details.divergence), as the Python worker does. */
  verify(inputs) {
    this.stage('first_call');
    const [path, arrays] = this.capture(inputs, 'verify-outputs');
    return this.verified(path, arrays);
  }

  /** verify's rest, after its call: `arrays` (outputs and checkpoint/<name>, as written to `path`) to the job's
   * verify_output, the outputs' divergence located without checkpoints. */
  verified(path, arrays) {
    const outputs = {};
    for (const name of this.prepared.model.outputs) outputs[name] = arrays[name];
    if (this.job.checkpoints) {
      for (const [name, array] of Object.entries(arrays)) if (name.startsWith('checkpoint/')) outputs[name] = array;
      for (const name of this.prepared.model.outputs) outputs[`tapped/${name}`] = arrays[name];
    } else if (this.prepared.parity !== null) {
      const { parity, reason } = this.compare(path);
      if (reason !== null) this.result.divergence = parity.divergence;
    }
    this.write(this.job.verify_output, outputs);
    this.result.status = 'ok';
    this.result.precision = { policy: this.job.case.dtype, observable: false };
    this.stage('done');
    return this.result;
  }

  failure(error) {
    const message = String(error?.message ?? error);
    const lines = message.trim().split('\n').filter((line) => line.trim());
    const oom = /out of memory|allocation failed|Cannot enlarge memory|Array buffer allocation/i.test(message);
    Object.assign(this.result, {
      status: oom ? 'oom' : 'error',
      reason: `${error?.name ?? 'Error'} during ${this.stageName}: ${lines.at(-1) ?? ''}`.replace(/: $/, ''),
      traceback: String(error?.stack ?? error),
    });
    if (error?.code === 'ENOSPC') this.result.disk_full = { cause: 'no space left on device (ENOSPC)', path: error.path ?? null };
    return this.result;
  }
}

let cell = null;
let ended = false;

/** Send the one result (the cell's, or the failure's), remove the prepared folder, exit. */
function end(result) {
  if (ended) return;
  ended = true;
  try {
    cell?.browser?.kill(); // tfjs:wasm-browser: whatever of Chromium is left (a failure on the way)
  } catch {
    // the manager kills this worker's process group, Chromium's processes included
  }
  try {
    fs.rmSync(args.folder, { recursive: true, force: true });
  } catch {
    // left for the manager, which removes a worker's folder when it closes it
  }
  try {
    result.cpus = cpuList(allowedCpus());
    result.thread_cpu_lists = threadCpuLists();
  } catch {
    // /proc unreadable: the manager has the pinning it asked for
  }
  send('result', result);
  process.exit(0);
}

function fail(error) {
  end(cell === null ? { status: 'error', reason: `${error?.name ?? 'Error'} during start: ${error?.message ?? error}`, stage_seconds: {} } : cell.failure(error));
}

process.on('uncaughtException', fail);
process.on('unhandledRejection', fail);
try {
  cell = new Cell(args.folder);
  end(await cell.run());
} catch (error) {
  fail(error);
}
