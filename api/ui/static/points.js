// Metric points kept sorted by step (or by time for points without a step), one value per step:
// a point that arrives twice (a resumed stream, a zoom re-fetch) replaces itself instead of repeating.

export class PointSet {
  constructor() {
    this.keys = [];
    this.steps = [];
    this.times = [];
    this.values = [];
    this.seqs = [];
  }

  get length() {
    return this.keys.length;
  }

  static key(point) {
    return point.step === null || point.step === undefined ? Date.parse(point.ts) / 1000 : point.step;
  }

  add(point) {
    const key = PointSet.key(point);
    let index = this.keys.length;
    if (index && this.keys[index - 1] >= key) index = this.search(key);
    const fields = [key, point.step ?? null, Date.parse(point.ts) / 1000, point.value, point.seq];
    const arrays = [this.keys, this.steps, this.times, this.values, this.seqs];
    if (this.keys[index] === key) arrays.forEach((array, i) => (array[index] = fields[i]));
    else arrays.forEach((array, i) => array.splice(index, 0, fields[i]));
  }

  search(key) {
    let low = 0;
    let high = this.keys.length;
    while (low < high) {
      const middle = (low + high) >> 1;
      if (this.keys[middle] < key) low = middle + 1;
      else high = middle;
    }
    return low;
  }

  // `outside`'s points before and after [low, high] (by key) around `inside`'s points within it.
  static overlay(outside, inside, low, high) {
    const merged = new PointSet();
    const take = (set, keep) => {
      for (let i = 0; i < set.length; i += 1) {
        if (!keep(set.keys[i])) continue;
        merged.keys.push(set.keys[i]);
        merged.steps.push(set.steps[i]);
        merged.times.push(set.times[i]);
        merged.values.push(set.values[i]);
        merged.seqs.push(set.seqs[i]);
      }
    };
    take(outside, (k) => k < low);
    take(inside, (k) => k >= low && k <= high);
    take(outside, (k) => k > high);
    return merged;
  }

  maxSeq() {
    return this.seqs.length ? Math.max(...this.seqs) : 0;
  }
}

// Exponential moving average, as TensorBoard's smoothing slider does it (debiased at the start).
export function smooth(values, weight) {
  if (!weight) return values;
  const out = new Array(values.length);
  let last = 0;
  let count = 0;
  for (let i = 0; i < values.length; i += 1) {
    const value = values[i];
    if (value === null || !Number.isFinite(value)) {
      out[i] = null;
      continue;
    }
    last = last * weight + (1 - weight) * value;
    count += 1;
    out[i] = last / (1 - weight ** count);
  }
  return out;
}
