// The timing rules of fwbench.measure.timer, for any JavaScript engine: `clock` returns seconds (Node.js:
// process.hrtime.bigint()); `rules` are fwbench.measure.timer's constants, as cell.json carries them
// ({settle_ratio, max_settle_calls}).

/** Seconds `calls` calls of `step` take back to back. */
export function timeBlock(step, calls, clock) {
  const start = clock();
  for (let i = 0; i < calls; i++) step();
  return clock() - start;
}

/** fwbench.measure.timer.warm_up without compile counters: at least max(2, calls) calls, then, within
 * `settleBudget` seconds and at most rules.max_settle_calls more, until a call is within rules.settle_ratio of the
 * fastest so far. */
export function warmUp(step, calls, settleBudget, clock, rules) {
  const times = [];
  const deadline = clock() + settleBudget;
  const minimum = Math.max(2, calls);
  while (times.length < minimum + rules.max_settle_calls) {
    times.push(timeBlock(step, 1, clock));
    if (times.length < minimum) continue;
    if (times.at(-1) <= rules.settle_ratio * Math.min(...times) || clock() >= deadline) break;
  }
  return times;
}

/** fwbench.measure.timer.calibrate_block: the smallest power-of-two call count whose block lasts `minBlock`
 * seconds (timed twice when cheap), not growing past half of `budget`: [calls, seconds]. */
export function calibrateBlock(step, minBlock, budget, clock) {
  let number = 1;
  for (;;) {
    let elapsed = timeBlock(step, number, clock);
    if (elapsed >= minBlock && elapsed <= budget / 20) elapsed = Math.min(elapsed, timeBlock(step, number, clock));
    if (elapsed >= minBlock) return [number, elapsed];
    const factor = Math.max(2, Math.floor(minBlock / Math.max(elapsed, 1e-9)));
    const grown = number * 2 ** (factor - 1).toString(2).length;
    if ((elapsed * grown) / number > budget / 2) return [number, elapsed];
    number = grown;
  }
}
