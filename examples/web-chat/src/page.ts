// The chat page: the transcript (newest page first loaded), the live answer
// of the run in progress, a Stop button that works from any tab, the
// approvals runs ask for (Approve / Deny), and what was typed while a run
// was busy, queued until the run takes it (Withdraw).
//
// The page is static. Everything it knows comes from sessionstore over
// gRPC-Web: the session id is in the address (?session=…), so every tab on
// that address shows the same conversation; the server URL and the bearer
// token are kept in localStorage (given once as ?server=…&token=…); where
// this tab is in the watch stream is kept in sessionStorage (live.ts), so a
// reload resumes from its last revision and delta index with the partial
// answer intact.

import type { Approval, QueuedInput, SessionEvent, StoredMessage } from "./gen/sessionstore/v1/messages_pb.js";
import { ApprovalDecision, ApprovalState, InputMode, Role } from "./gen/sessionstore/v1/messages_pb.js";
import { connect, failure, isCanceled, type Failure } from "./client.js";
import { approvals, queued, renderApprovals, renderQueue, textOf } from "./control.js";
import {
  applyDelta,
  clearState,
  cursors,
  finishRun,
  loadState,
  newState,
  openRun,
  saveState,
  type LiveRun,
  type WatchState,
} from "./live.js";

const element = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const transcript = element<HTMLOListElement>("transcript");
const older = element<HTMLButtonElement>("older");
const live = element<HTMLElement>("live");
const liveText = element<HTMLParagraphElement>("live-text");
const liveNote = element<HTMLSpanElement>("live-note");
const stopButton = element<HTMLButtonElement>("stop");
const approvalsSection = element<HTMLElement>("approvals");
const approvalList = element<HTMLUListElement>("approval-list");
const queueSection = element<HTMLElement>("queue");
const queueList = element<HTMLOListElement>("queued-list");
const composer = element<HTMLFormElement>("composer");
const question = element<HTMLTextAreaElement>("question");
const sendButton = element<HTMLButtonElement>("send");
const statusLine = element<HTMLParagraphElement>("status");
const sessionTitle = element<HTMLParagraphElement>("session-title");

// ---------------------------------------------------------------------------
// Settings: ?server=…&token=… are remembered for this origin, and taken out
// of the address so that it can be shared (and reloaded) as is.

const params = new URLSearchParams(location.search);
for (const name of ["server", "token"]) {
  const value = params.get(name);
  if (value !== null) {
    localStorage.setItem(`sessionstore.${name}`, value);
    params.delete(name);
  }
}
const server = localStorage.getItem("sessionstore.server") ?? "http://127.0.0.1:50051";
const token = localStorage.getItem("sessionstore.token") ?? "";
history.replaceState(null, "", addressOf(params.get("session") ?? ""));

element<HTMLInputElement>("server").value = server;
element<HTMLInputElement>("token").value = token;
element<HTMLFormElement>("settings-form").addEventListener("submit", (event) => {
  event.preventDefault();
  localStorage.setItem("sessionstore.server", element<HTMLInputElement>("server").value);
  localStorage.setItem("sessionstore.token", element<HTMLInputElement>("token").value);
  location.reload();
});

const client = connect(server, token);

function addressOf(sessionId: string): string {
  return sessionId === "" ? location.pathname : `${location.pathname}?session=${encodeURIComponent(sessionId)}`;
}

// ---------------------------------------------------------------------------
// What the page shows.

let sessionId = "";
let state: WatchState | undefined;
/** The stored messages loaded so far, by sequence. */
const messages = new Map<bigint, StoredMessage>();
let olderPageToken = "";

function say(text: string): void {
  statusLine.textContent = text;
  delete statusLine.dataset.code;
  delete statusLine.dataset.reason;
}

function sayFailure(what: string, failed: Failure): void {
  const reason = failed.reason === "" ? "" : ` (${failed.reason})`;
  statusLine.textContent = `${what}: ${failed.code}${reason}: ${failed.message}`;
  statusLine.dataset.code = failed.code;
  statusLine.dataset.reason = failed.reason;
}

function roleName(stored: StoredMessage): string {
  const role = stored.message?.role ?? Role.UNSPECIFIED;
  return (Role[role] ?? "unknown").toLowerCase();
}

function renderTranscript(): void {
  const items = [...messages.values()]
    .sort((a, b) => (a.sequence < b.sequence ? -1 : 1))
    .map((stored) => {
      const item = document.createElement("li");
      item.className = `message ${roleName(stored)}`;
      item.dataset.sequence = String(stored.sequence);
      const label = document.createElement("div");
      label.className = "role";
      label.textContent = roleName(stored);
      if (stored.message?.incomplete) {
        item.classList.add("incomplete");
        const badge = document.createElement("span");
        badge.className = "badge";
        badge.textContent = "stopped before the end";
        label.append(badge);
      }
      const text = document.createElement("p");
      text.className = "text";
      text.textContent = stored.redacted ? "(redacted)" : textOf(stored.message);
      item.append(label, text);
      return item;
    });
  transcript.replaceChildren(...items);
  older.hidden = olderPageToken === "";
}

/** The run whose answer is shown live: the newest one still open. */
function currentRun(): LiveRun | undefined {
  return state?.runs[state.runs.length - 1];
}

function renderLive(): void {
  const run = currentRun();
  live.hidden = run === undefined;
  if (run === undefined) {
    live.dataset.state = "idle";
    delete live.dataset.runId;
    delete live.dataset.lastIndex;
    return;
  }
  live.dataset.runId = run.runId;
  live.dataset.lastIndex = String(run.lastIndex);
  live.dataset.state = run.cancelRequested ? "stopping" : "streaming";
  liveText.textContent = run.text;
  liveNote.textContent = run.cancelRequested ? "stopping…" : "answering…";
  stopButton.disabled = run.cancelRequested;
  window.scrollTo(0, document.body.scrollHeight);
}

function upsert(stored: StoredMessage[]): void {
  for (const message of stored) {
    messages.set(message.sequence, message);
  }
}

function renderControl(): void {
  renderApprovals(approvalsSection, approvalList, decide);
  renderQueue(queueSection, queueList, withdraw);
}

/** A fresh idempotency key (crypto.randomUUID needs a secure context; this does not). */
function requestId(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return `web-${[...bytes].map((b) => b.toString(16).padStart(2, "0")).join("")}`;
}

// ---------------------------------------------------------------------------
// The session: the newest page of messages, then the watch stream.

async function openSession(id: string): Promise<void> {
  sessionId = id;
  const restored = loadState(id);
  if (restored !== undefined) {
    // A reload: show the partial answer this tab had at once, and resume after it.
    state = restored;
    document.body.dataset.restoredIndex = String(currentRun()?.lastIndex ?? -1);
    renderLive();
  }
  const session = await client.getSession({ sessionId: id });
  sessionTitle.textContent = session.title;
  if (state === undefined) {
    // A new tab: start at the session's revision now; the watch sends the
    // deltas of the run in progress (include_active_deltas).
    state = newState(id, Number(session.revision));
    if (session.activeRunId !== "") {
      openRun(state, session.activeRunId);
    }
    saveState(state);
    renderLive();
  }
  const page = await client.listMessages({ sessionId: id, orderBy: "sequence desc", pageSize: 30 });
  upsert(page.messages);
  olderPageToken = page.nextPageToken;
  renderTranscript();
  // The approvals still pending and the inputs waiting. Whatever changes
  // meanwhile comes on the watch (from the revision read above), keyed by
  // id, so reading these before or after such a change shows the same.
  let pageToken = "";
  do {
    const listed = await client.listApprovals({ sessionId: id, state: ApprovalState.PENDING, pageToken });
    listed.approvals.forEach((approval) => approvals.set(approval.approvalId, approval));
    pageToken = listed.nextPageToken;
  } while (pageToken !== "");
  do {
    const listed = await client.listQueuedInputs({ sessionId: id, pageToken });
    listed.inputs.forEach((input) => queued.set(input.inputId, input));
    pageToken = listed.nextPageToken;
  } while (pageToken !== "");
  renderControl();
  void watch(id);
}

older.addEventListener("click", async () => {
  try {
    const page = await client.listMessages({
      sessionId,
      orderBy: "sequence desc",
      pageSize: 30,
      pageToken: olderPageToken,
    });
    upsert(page.messages);
    olderPageToken = page.nextPageToken;
    renderTranscript();
  } catch (error) {
    sayFailure("Loading older messages failed", failure(error));
  }
});

/** Errors that a new attempt would only repeat. */
const FINAL = ["Unauthenticated", "PermissionDenied", "NotFound", "InvalidArgument"];

/** Watches the session until it is deleted or a final error, reconnecting after others. */
async function watch(id: string): Promise<void> {
  let pause = 500;
  while (sessionId === id && state !== undefined) {
    const request = {
      sessionId: id,
      afterRevision: BigInt(state.revision),
      includeActiveDeltas: true,
      deltaCursors: cursors(state),
    };
    document.body.dataset.watchFrom = JSON.stringify({
      afterRevision: state.revision,
      deltaCursors: state.runs.map((run) => ({ runId: run.runId, afterIndex: run.lastIndex })),
    });
    try {
      for await (const event of client.watchSession(request)) {
        if (!handle(event)) {
          return;
        }
        pause = 500;
      }
    } catch (error) {
      if (isCanceled(error)) {
        return;
      }
      const failed = failure(error);
      sayFailure("Watching the session failed", failed);
      if (FINAL.includes(failed.code)) {
        document.body.dataset.watch = "stopped";
        return;
      }
      if (failed.code === "OutOfRange") {
        // The session is behind what this tab saw (restored from a backup?): start over.
        clearState(id);
        state = newState(id, 0);
        messages.clear();
        approvals.clear();
        queued.clear();
      }
    }
    document.body.dataset.watch = "reconnecting";
    await new Promise((resolve) => setTimeout(resolve, pause));
    pause = Math.min(pause * 2, 10_000);
  }
}

/** Applies one event; false when the stream is over (the session was deleted). */
function handle(event: SessionEvent): boolean {
  if (state === undefined) {
    return false;
  }
  const change = event.event;
  let stored = true;
  let control = false;
  switch (change.case) {
    case "caughtUp":
      stored = false;
      state.revision = Math.max(state.revision, Number(event.revision));
      document.body.dataset.watch = "live";
      say("");
      break;
    case "progress":
      stored = false;
      break;
    case "delta":
      stored = false;
      if (change.value.firstIndex < change.value.index) {
        // Merged by the server (a run's buffer at its bound): counted, for the browser test.
        document.body.dataset.mergedDeltas = String(Number(document.body.dataset.mergedDeltas ?? 0) + 1);
      }
      applyDelta(state, change.value);
      break;
    case "runDiscarded":
      stored = false;
      finishRun(state, change.value.runId);
      break;
    case "runBegun":
      openRun(state, change.value.runId);
      break;
    case "runCancelRequested": {
      const run = openRun(state, change.value.runId);
      if (run !== undefined) {
        run.cancelRequested = true;
      }
      document.body.dataset.cancelRequested = change.value.runId;
      say(`Stop requested${change.value.reason === "" ? "" : `: ${change.value.reason}`}`);
      break;
    }
    case "runEnded":
      finishRun(state, change.value.runId);
      break;
    case "exchangeAppended":
      upsert(change.value.messages);
      if (change.value.runId !== "") {
        finishRun(state, change.value.runId);
      }
      if (change.value.messages.some((stored) => stored.message?.incomplete)) {
        say("Stopped: the answer so far is stored, marked incomplete.");
      } else if (change.value.runId !== "") {
        say("");
      }
      break;
    case "sessionCreated":
      upsert(change.value.messages);
      sessionTitle.textContent = change.value.session?.title ?? "";
      break;
    case "sessionUpdated":
      sessionTitle.textContent = change.value.session?.title ?? "";
      break;
    case "rolledBack":
      for (const sequence of [...messages.keys()]) {
        if (sequence > change.value.afterSequence) {
          messages.delete(sequence);
        }
      }
      break;
    case "messageEdited":
      if (change.value.message !== undefined) {
        upsert([change.value.message]);
      }
      break;
    case "messageRedacted": {
      const redacted = messages.get(change.value.sequence);
      if (redacted !== undefined) {
        redacted.redacted = true;
      }
      break;
    }
    case "approvalRequested":
    case "approvalDecided": {
      const approval = change.value.approval;
      if (approval !== undefined) {
        approvals.set(approval.approvalId, approval);
      }
      if (change.case === "approvalDecided" && change.value.toolResult !== undefined) {
        // A denial: the call's tool result says so.
        upsert([change.value.toolResult]);
      }
      control = true;
      break;
    }
    case "inputQueued":
      if (change.value.input !== undefined) {
        queued.set(change.value.input.inputId, change.value.input);
      }
      control = true;
      break;
    case "inputTaken":
      // Out of the queue, into the history.
      queued.delete(change.value.inputId);
      upsert(change.value.messages);
      control = true;
      break;
    case "inputWithdrawn":
      queued.delete(change.value.inputId);
      control = true;
      break;
    case "sessionDeleted":
      say("This session was deleted.");
      clearState(state.sessionId);
      state = undefined;
      renderLive();
      return false;
    default:
      break;
  }
  if (stored) {
    state.revision = Number(event.revision);
  }
  saveState(state);
  renderTranscript();
  if (control) {
    renderControl();
  }
  renderLive();
  return true;
}

// ---------------------------------------------------------------------------
// Sending a question, stopping an answer, deciding an approval, withdrawing
// a queued input.

composer.addEventListener("submit", async (event) => {
  event.preventDefault();
  const text = question.value.trim();
  if (text === "") {
    return;
  }
  sendButton.disabled = true;
  try {
    if (sessionId === "") {
      const session = await client.createSession({ title: text.slice(0, 60) });
      history.replaceState(null, "", addressOf(session.id));
      await openSession(session.id);
    }
    // Appended at once when no run is busy with the session; queued while
    // one is, until a run takes it into the history.
    const submitted = await client.submitInput({
      sessionId,
      messages: [{ role: Role.USER, content: text }],
      mode: InputMode.QUEUE,
      requestId: requestId(),
    });
    if (submitted.queued) {
      // Shown from the watch (input_queued), which also brings its removal:
      // a run may take it before this answer arrives.
      say("Queued: it goes into the conversation when the run in progress takes it.");
    } else {
      upsert(submitted.messages);
      renderTranscript();
      say("Sent. The answer appears here as it is produced.");
    }
    question.value = "";
  } catch (error) {
    sayFailure("Sending failed", failure(error));
  } finally {
    sendButton.disabled = false;
  }
});

stopButton.addEventListener("click", async () => {
  const run = currentRun();
  if (run === undefined) {
    return;
  }
  stopButton.disabled = true;
  try {
    await client.cancelRun({ sessionId, runId: run.runId, reason: "stopped from the web page" });
    say("Stop requested.");
  } catch (error) {
    sayFailure("Stopping failed", failure(error));
    stopButton.disabled = false;
  }
});

function decide(approval: Approval, decision: ApprovalDecision, buttons: HTMLButtonElement[]): void {
  const approve = decision === ApprovalDecision.APPROVE;
  client
    .decideApproval({
      sessionId,
      approvalId: approval.approvalId,
      decision,
      reason: approve ? "" : "denied from the web page",
      decidedBy: "web chat",
      requestId: requestId(),
    })
    .then((decided) => {
      if (decided.approval !== undefined) {
        approvals.set(decided.approval.approvalId, decided.approval);
      }
      if (decided.toolResult !== undefined) {
        upsert([decided.toolResult]);
        renderTranscript();
      }
      renderControl();
      say(approve ? "Approved." : "Denied.");
    })
    .catch((error) => {
      // Decided elsewhere first, or expired: the watch brings the outcome.
      sayFailure(approve ? "Approving failed" : "Denying failed", failure(error));
      buttons.forEach((b) => (b.disabled = false));
    });
}

function withdraw(input: QueuedInput, button: HTMLButtonElement): void {
  client
    .withdrawQueuedInput({ sessionId, inputId: input.inputId })
    .then(() => {
      queued.delete(input.inputId);
      renderControl();
      say("Withdrawn.");
    })
    .catch((error) => {
      // Taken meanwhile (INPUT_ALREADY_TAKEN): the watch brings it to the transcript.
      sayFailure("Withdrawing failed", failure(error));
      button.disabled = false;
    });
}

// ---------------------------------------------------------------------------

const initial = params.get("session");
if (initial !== null && initial !== "") {
  openSession(initial).catch((error) => sayFailure("Opening the session failed", failure(error)));
} else {
  say("Ask something to start a new session.");
}
