// Where this tab is in a session's watch stream, kept in sessionStorage so
// that a reload resumes where it stopped: the last revision seen, and for
// each run still streaming its partial text and the last delta index seen.

import type { Delta } from "./gen/sessionstore/v1/messages_pb.js";

/** The partial output of one run, as far as this tab has it. */
export interface LiveRun {
  runId: string;
  /** The highest delta index received (-1: none yet). */
  lastIndex: number;
  /** The text of deltas 0..lastIndex, concatenated. */
  text: string;
  /**
   * For each delta received, the length of `text` after it, by the delta's
   * last index: where a merged delta that starts inside what we have
   * overlaps it.
   */
  ends: Record<number, number>;
  /** CancelRun was asked for this run (RunCancelRequested seen). */
  cancelRequested: boolean;
}

export interface WatchState {
  sessionId: string;
  /** The last revision seen (0: none yet). */
  revision: number;
  /** Runs with partial output still open, oldest first. */
  runs: LiveRun[];
  /** Runs that are over (answer stored, discarded or ended): late deltas of theirs are dropped. */
  finished: string[];
}

const key = (sessionId: string) => `sessionstore.watch.${sessionId}`;

export function loadState(sessionId: string): WatchState | undefined {
  const saved = sessionStorage.getItem(key(sessionId));
  if (saved === null) {
    return undefined;
  }
  try {
    const state = JSON.parse(saved) as WatchState;
    return state.sessionId === sessionId ? state : undefined;
  } catch {
    return undefined;
  }
}

export function saveState(state: WatchState): void {
  sessionStorage.setItem(key(state.sessionId), JSON.stringify(state));
}

export function clearState(sessionId: string): void {
  sessionStorage.removeItem(key(sessionId));
}

export function newState(sessionId: string, revision: number): WatchState {
  return { sessionId, revision, runs: [], finished: [] };
}

export function findRun(state: WatchState, runId: string): LiveRun | undefined {
  return state.runs.find((run) => run.runId === runId);
}

/** The run's entry, made if it is new; undefined for a run that is over. */
export function openRun(state: WatchState, runId: string): LiveRun | undefined {
  if (state.finished.includes(runId)) {
    return undefined;
  }
  let run = findRun(state, runId);
  if (run === undefined) {
    run = { runId, lastIndex: -1, text: "", ends: {}, cancelRequested: false };
    state.runs.push(run);
  }
  return run;
}

/** The run is over: its partial output is dropped (its answer, if any, is a stored message now). */
export function finishRun(state: WatchState, runId: string): void {
  state.runs = state.runs.filter((run) => run.runId !== runId);
  if (!state.finished.includes(runId)) {
    state.finished.push(runId);
    state.finished = state.finished.slice(-50);
  }
}

/** Where to resume each open run: WatchSessionRequest.delta_cursors. */
export function cursors(state: WatchState): { runId: string; afterIndex: bigint }[] {
  return state.runs
    .filter((run) => run.lastIndex >= 0)
    .map((run) => ({ runId: run.runId, afterIndex: BigInt(run.lastIndex) }));
}

/**
 * Adds a delta to its run. Deltas this tab already has are dropped; a
 * merged delta (first_index < index) that overlaps what we have keeps only
 * its new part. Returns false if nothing changed.
 */
export function applyDelta(state: WatchState, delta: Delta): boolean {
  const run = openRun(state, delta.runId);
  if (run === undefined) {
    return false;
  }
  const index = Number(delta.index);
  const first = Math.min(Number(delta.firstIndex), index);
  if (index <= run.lastIndex) {
    return false;
  }
  let text = "";
  if (delta.delta.case === "text") {
    text = delta.delta.value;
  } else if (delta.delta.case === "block" && delta.delta.value.block.case === "text") {
    text = delta.delta.value.block.value.text;
  }
  if (first <= run.lastIndex) {
    // The merged text starts with deltas first..lastIndex, which we have.
    const start = first === 0 ? 0 : run.ends[first - 1];
    if (start === undefined) {
      throw new Error(`run ${run.runId}: merged delta ${first}..${index} starts where no delta of ours ended`);
    }
    text = text.slice(run.text.length - start);
  }
  run.text += text;
  run.lastIndex = index;
  run.ends[index] = run.text.length;
  return true;
}
