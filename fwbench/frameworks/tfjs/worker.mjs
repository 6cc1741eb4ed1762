// fwbench's worker for TF.js in Node.js: one cell, speaking the same protocol as the Python worker
// (fwbench/runner/messages.py; docs/architecture.md, "A worker in another language").
//
// The cell's Python worker prepared its folder (fwbench/frameworks/tfjs/external.py: cell.json with the job, the
// model's structure, weights, inputs, the float64 reference) and became this process (execve: same pid, CPU
// pinning, process group, parent-death signal). It reads that folder and removes it, then reports each stage it
// enters and exactly one result as JSON lines on --result-fd; an interleaved job's commands arrive on stdin, one JSON
// line each (calibrate, block, finish). Calls are timed with process.hrtime.bigint(); each call runs under tf.tidy,
// so no tensor outlives it; the first call is timed apart, then the warm-up, then the manager's blocks.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import readline from 'node:readline';
import { parseArgs } from 'node:util';
import { arraysOf, buildModel, loadTf, makeInputs, makeStep, threadReport, versions } from './backend.mjs';
import { readSafetensors, writeSafetensors } from './weights.mjs';

const HF2019_NUMBER = 3; // fwbench.measure.timer: calls per block of the 2019 protocol
const SETTLE_RATIO = 1.5; // fwbench.measure.timer.warm_up: a call this close to the fastest counts as settled
const MAX_SETTLE_CALLS = 50;

const { values: args } = parseArgs({
  options: { 'result-fd': { type: 'string' }, 'manager-pid': { type: 'string' }, folder: { type: 'string' } },
});
if (process.ppid !== Number(args['manager-pid'])) process.exit(3); // the manager is gone already
const channel = Number(args['result-fd']);

const seconds = () => Number(process.hrtime.bigint()) / 1e9;

function send(type, fields = {}) {
  fs.writeSync(channel, JSON.stringify({ type, ...fields }) + '\n');
}

// -- the machine, as the Python worker reads it (fwbench.measure.memory, .environment) ---------------------------
function statusBytes(field, pid = 'self') {
  const found = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm'));
  return found ? Number(found[1]) * 1024 : null;
}

function resetPeakRss() {
  try {
    fs.writeFileSync('/proc/self/clear_refs', '5');
    return true;
  } catch {
    return false;
  }
}

function cpuList(text) {
  return text.split(',').flatMap((part) => {
    const [first, last] = part.split('-').map(Number);
    return Array.from({ length: (last ?? first) - first + 1 }, (_, i) => first + i);
  });
}

function allowedCpus(pid = 'self') {
  return fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/^Cpus_allowed_list:\s+(\S+)/m)[1];
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

// -- timing (ports of fwbench.measure.timer's warm_up and calibrate_block) ---------------------------------------
function timeBlock(step, calls) {
  const start = process.hrtime.bigint();
  for (let i = 0; i < calls; i++) step();
  return Number(process.hrtime.bigint() - start) / 1e9;
}

function warmUp(step, calls, settleBudget) {
  const times = [];
  const deadline = seconds() + settleBudget;
  const minimum = Math.max(2, calls);
  while (times.length < minimum + MAX_SETTLE_CALLS) {
    times.push(timeBlock(step, 1));
    if (times.length < minimum) continue;
    if (times.at(-1) <= SETTLE_RATIO * Math.min(...times) || seconds() >= deadline) break;
  }
  return times;
}

function calibrateBlock(step, minBlock, budget) {
  let number = 1;
  for (;;) {
    let elapsed = timeBlock(step, number);
    if (elapsed >= minBlock && elapsed <= budget / 20) elapsed = Math.min(elapsed, timeBlock(step, number));
    if (elapsed >= minBlock) return [number, elapsed];
    const factor = Math.max(2, Math.floor(minBlock / Math.max(elapsed, 1e-9)));
    const grown = number * 2 ** (factor - 1).toString(2).length;
    if ((elapsed * grown) / number > budget / 2) return [number, elapsed];
    number = grown;
  }
}

// -- the cell ----------------------------------------------------------------------------------------------------
class Cell {
  constructor(prepared) {
    this.prepared = prepared;
    this.job = prepared.job;
    this.result = { stage_seconds: {} };
    this.stageName = 'start';
    this.stageStarted = seconds() - process.uptime(); // stage start: this process's start (the preparation: prepare_s)
    this.result.prepare_s = prepared.prepare_s;
    const stdin = readline.createInterface({ input: process.stdin, terminal: false });
    this.commands = stdin[Symbol.asyncIterator]();
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
    const { case: cellCase, settings } = job;
    if (cellCase.phase !== 'inference') throw new Error(`tfjs runs phase inference only, not ${cellCase.phase}`);
    if (job.export_to !== null) throw new Error('tfjs writes no deployment artefact (fwbench export)');
    if (job.profile_to !== null) throw new Error('tfjs has no profiler fwbench reads (fwbench profile)');
    const mode = cellCase.runtime.split(':')[1];

    this.stage('import');
    const tf = await loadTf(mode);
    this.result.threads_effective = await threadReport(tf, mode);
    this.result.matmul_precision = { tfjs: 'float32 (TF.js has no reduced-precision matmul on cpu or wasm)' };
    this.result.versions = versions(tf);

    this.stage('build');
    const { forward, layout } = await buildModel(tf, prepared.model, prepared.weights);
    const inputs = makeInputs(tf, readSafetensors(prepared.inputs));
    const parityArrays = prepared.parity === null ? null : readSafetensors(prepared.parity);
    if (layout !== undefined) this.result.layout = layout;

    if (job.verify_output !== null) return this.verify(tf, forward, inputs);
    if (!job.interleaved) {
      throw new Error("tfjs cells are timed in interleaved rounds only (--interleave off stops on scipy's rule, in Python)");
    }
    const step = makeStep(tf, forward, inputs);
    this.stage('first_call');
    this.result.first_call_s = timeBlock(step, 1);
    this.stage('warmup');
    const warmup = warmUp(step, settings.warmup_calls, settings.max_time_s);
    this.result.warmup_calls = warmup.length;
    this.result.warmup_call_s = warmup;

    this.stage('timing');
    const tensorsBefore = tf.memory().numTensors;
    this.result.loadavg_before_timing = readLoadavg();
    this.result.rss_before_timing_bytes = statusBytes('VmRSS');
    this.result.peak_memory_before_timing_bytes = statusBytes('VmHWM');
    this.result.peak_memory_scope = resetPeakRss() ? 'timed' : 'process';
    const timing = await this.serveBlocks(step);
    this.result.peak_memory_bytes = statusBytes('VmHWM');
    this.result.compile_health = { after_warmup: {}, after_timing: {}, during_timing: {}, recompiled_in_timed_loop: false, flags: [] };
    this.result.tfjs_tensors = { before_timing: tensorsBefore, after_timing: tf.memory().numTensors };
    if (tf.memory().numTensors !== tensorsBefore) throw new Error(`the timed calls leaked ${tf.memory().numTensors - tensorsBefore} tensors`);
    Object.assign(this.result, { status: 'ok', ...timing });
    if (job.check_parity && parityArrays !== null) this.checkParity(tf, forward, parityArrays);
    this.stage('done');
    return this.result;
  }

  async nextCommand() {
    const { value, done } = await this.commands.next();
    if (done) throw new Error("the manager's command stream ended before finish");
    return JSON.parse(value);
  }

  /** Interleaved timing (fwbench.runner.cell.Cell.serve_blocks): ready, then the manager's commands until finish. */
  async serveBlocks(step) {
    const { settings } = this.job;
    let number = HF2019_NUMBER;
    let started = null;
    const samples = [];
    send('ready', { peak_memory_bytes: statusBytes('VmHWM') });
    for (;;) {
      const command = await this.nextCommand();
      if (command.command === 'finish') break;
      if (command.command === 'calibrate') {
        let blockSeconds;
        if (settings.protocol === 'hf2019') blockSeconds = timeBlock(step, number);
        else [number, blockSeconds] = calibrateBlock(step, settings.min_block_s, this.job.budget_s ?? settings.max_time_s);
        send('calibrated', { calls_per_block: number, block_s: blockSeconds });
        started = seconds();
        continue;
      }
      const calls = Number(command.calls || number);
      started ??= seconds();
      const startUnix = Date.now() / 1000;
      const blockSeconds = timeBlock(step, calls);
      if (!command.calibration) {
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

  /** After timing: the outputs (and checkpoints) at the parity shape, checked against the float64 reference by
   * Python (fwbench.runner.external compare: the tolerance, and where a mismatch starts); a failure makes it
   * mismatch. */
  checkParity(tf, forward, arrays) {
    this.stage('parity');
    const { folder, python } = this.prepared;
    const got = `${folder}/parity-outputs.safetensors`;
    const inputs = makeInputs(tf, arrays, 'input/');
    writeSafetensors(got, arraysOf(tf, forward, inputs, true));
    tf.dispose(Object.values(inputs));
    const check = spawnSync(python, ['-m', 'fwbench.runner.external', 'compare', folder, got], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    if (check.status !== 0) throw new Error(`the parity check (${python} -m fwbench.runner.external compare) ended with status ${check.status ?? check.signal}`);
    const { parity, reason } = JSON.parse(check.stdout.trim().split('\n').at(-1));
    this.result.parity = parity;
    this.result.precision = { policy: this.job.case.dtype, observable: false };
    if (reason !== null) Object.assign(this.result, { status: 'mismatch', reason, samples_s: [] });
  }

  /** fwbench verify / diff: one call at the cell's shape, its outputs written to the job's verify_output; with the
   * job's checkpoints (fwbench diff) also each checkpoint (checkpoint/<name>) and that call's outputs (tapped/<name>:
   * the same call). */
  verify(tf, forward, inputs) {
    this.stage('first_call');
    const arrays = arraysOf(tf, forward, inputs, this.job.checkpoints);
    for (const name of this.prepared.model.outputs) if (this.job.checkpoints) arrays[`tapped/${name}`] = arrays[name];
    writeSafetensors(this.job.verify_output, arrays);
    this.result.status = 'ok';
    this.result.precision = { policy: this.job.case.dtype, observable: false };
    this.stage('done');
    return this.result;
  }

  failure(error) {
    const text = String(error?.message ?? error).trim().split('\n').filter((line) => line.trim());
    const oom = /out of memory|allocation failed|Cannot enlarge memory|Array buffer allocation/i.test(String(error?.message ?? error));
    const name = error?.name ?? 'Error';
    Object.assign(this.result, {
      status: oom ? 'oom' : 'error',
      reason: `${name} during ${this.stageName}: ${text.at(-1) ?? ''}`.replace(/: $/, ''),
      traceback: String(error?.stack ?? error),
    });
    return this.result;
  }
}

function readLoadavg() {
  return fs.readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).map(Number);
}

const prepared = JSON.parse(fs.readFileSync(`${args.folder}/cell.json`, 'utf8'));
const cell = new Cell(prepared);
let result;
try {
  result = await cell.run();
} catch (error) {
  result = cell.failure(error);
} finally {
  fs.rmSync(prepared.folder, { recursive: true, force: true }); // what the Python worker prepared, read
}
result.cpus = cpuList(allowedCpus());
result.thread_cpu_lists = threadCpuLists();
send('result', result);
process.exit(0);
