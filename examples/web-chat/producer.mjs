#!/usr/bin/env node
// A demo producer: what an agent runtime or gateway does while a model
// answers. It takes the session's lease for a run (BeginRun), streams a
// fake answer piece by piece with PublishDelta, stops as soon as a
// PublishDelta answer says cancel_requested (someone pressed Stop), stores
// what it has with AppendExchange (the answer marked incomplete if it was
// cut short) and ends the run, taking what was typed meanwhile into the
// history (TakeQueuedInput, EndRun with take_next).
//
// With --approval the fake model calls a tool that needs a person's
// approval instead: the run stores the call, asks (RequestApproval), waits
// for Approve or Deny in a page (the watch's approval_decided), stores the
// outcome and ends the same way.
//
//   node producer.mjs --session ses_… [--server http://127.0.0.1:50051]
//                     [--token TOKEN] [--pieces 120] [--interval-ms 80]
//                     [--approval]
//
// The server and token also come from SESSIONSTORE_SERVER and
// SESSIONSTORE_TOKEN. It talks plain gRPC (HTTP/2) through
// @connectrpc/connect-node, to the same port the page reaches over gRPC-Web.
// Run `npm run build` first: it imports the generated code in src/gen/.

import { setTimeout as pause } from "node:timers/promises";
import { parseArgs } from "node:util";
import { randomUUID } from "node:crypto";
import { pathToFileURL } from "node:url";

import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

import { ApprovalState, Role } from "./src/gen/sessionstore/v1/messages_pb.js";
import { SessionStore } from "./src/gen/sessionstore/v1/sessionstore_pb.js";

const WORDS = (
  "sessionstore keeps every turn of a conversation exactly as it was " +
  "written and streams each change to the pages watching it, so a tab " +
  "that reloads in the middle of an answer picks up at the last piece it " +
  "had and any tab can stop the run."
).split(" ");

/** The text of the answer's piece `index` (the fake model is deterministic). */
export function piece(index) {
  return `${WORDS[index % WORDS.length]} `;
}

/** The answer's text from piece 0 through piece `lastIndex`. */
export function answerText(lastIndex) {
  let text = "";
  for (let index = 0; index <= lastIndex; index++) {
    text += piece(index);
  }
  return text;
}

/** The fake model's call, recorded with what it produced. */
function modelCall(tokens) {
  return {
    provider: "demo",
    model: "fake-words",
    requestedModel: "fake-words",
    completionTokens: BigInt(tokens),
    totalTokens: BigInt(tokens),
  };
}

/** A client of the server at `server`, over plain gRPC, with the bearer token. */
export function connectTo({ server, token }) {
  const transport = createGrpcTransport({
    baseUrl: server,
    interceptors: [
      (next) => (request) => {
        if (token) {
          request.header.set("authorization", `Bearer ${token}`);
        }
        return next(request);
      },
    ],
  });
  return createClient(SessionStore, transport);
}

/** Takes the session's lease for a new run (BeginRun). Resolves with the run id. */
export async function beginRun(client, { sessionId, runId = `run_${randomUUID()}`, leaseMs = 60_000 }) {
  await client.beginRun({ sessionId, runId, lease: durationFromMs(leaseMs) });
  return runId;
}

/**
 * Ends the run, first taking what was typed while it ran into the history,
 * oldest first: TakeQueuedInput for all but the last input waiting, then
 * EndRun with take_next, which takes the last one and frees the lease in
 * one transaction. Resolves with { taken (the inputs, in order), revision }.
 */
export async function endRunTakingInput(client, { sessionId, runId }) {
  const { inputs } = await client.listQueuedInputs({ sessionId });
  const taken = [];
  for (let i = 1; i < inputs.length; i++) {
    taken.push((await client.takeQueuedInput({ sessionId, runId })).input);
  }
  const ended = await client.endRun({ sessionId, runId, takeNext: true });
  if (ended.takenInput !== undefined) {
    taken.push(ended.takenInput);
  }
  return { taken, revision: Number(ended.revision) };
}

/**
 * The fake model calls a tool that needs a person's approval: the run
 * stores the assistant message making the call (AppendExchange), then asks
 * for a decision on it (RequestApproval). Resolves with { approval,
 * toolCallId, revision }.
 */
export async function askApproval(client, {
  sessionId,
  runId,
  tool = "delete_files",
  args = { path: "/tmp/scratch", recursive: true },
  title = "Delete the files in /tmp/scratch?",
}) {
  const toolCallId = `call_${randomUUID()}`;
  await client.appendExchange({
    sessionId,
    runId,
    providerCall: modelCall(12),
    responseMessages: [
      {
        role: Role.ASSISTANT,
        content: "I will clean up the scratch directory.",
        toolCalls: [{ id: toolCallId, name: tool, arguments: JSON.stringify(args) }],
      },
    ],
  });
  const asked = await client.requestApproval({
    sessionId,
    runId,
    toolCallId,
    title,
    detailJson: JSON.stringify({ tool, arguments: args }),
  });
  return { approval: asked.approval, toolCallId, revision: Number(asked.revision) };
}

/**
 * Waits for the decision on an approval: follows the session's watch stream
 * from `afterRevision` (the revision that asked) to its approval_decided.
 * Resolves with { approval, toolResult } (toolResult: a denial's, stored by
 * the server with the decision).
 */
export async function awaitDecision(client, { sessionId, approvalId, afterRevision, signal }) {
  // The watch is closed once the decision is in (or `signal` fires).
  const done = new AbortController();
  const stop = () => done.abort(signal?.reason);
  signal?.addEventListener("abort", stop, { once: true });
  try {
    const events = client.watchSession({ sessionId, afterRevision: BigInt(afterRevision) }, { signal: done.signal });
    for await (const { event } of events) {
      if (event.case === "approvalDecided" && event.value.approval?.approvalId === approvalId) {
        return { approval: event.value.approval, toolResult: event.value.toolResult };
      }
    }
    throw new Error(`the watch ended before approval ${approvalId} was decided`);
  } finally {
    signal?.removeEventListener("abort", stop);
    done.abort();
  }
}

/**
 * Acts on the decision: approved, the tool "runs" and its result is stored
 * as the tool message answering the call; either way the model says what
 * happened (a denial's tool result is already in the history).
 */
export async function actOnDecision(client, { sessionId, runId, approval }) {
  const approved = approval.state === ApprovalState.APPROVED;
  const stored = await client.appendExchange({
    sessionId,
    runId,
    messages: approved ? [{ role: Role.TOOL, toolCallId: approval.toolCallId, content: "deleted 3 files" }] : [],
    providerCall: modelCall(8),
    responseMessages: [
      { role: Role.ASSISTANT, content: approved ? "Done: the scratch directory is empty." : "Understood: I left the files alone." },
    ],
  });
  return { approved, revision: Number(stored.revision) };
}

/**
 * Streams an answer into `sessionId` as run `runId`. Resolves when the run
 * is over, with { runId, published, cancelled, text, revision, taken }
 * (taken: the ids of the inputs it took as it ended). `signal` stops it
 * early (the partial answer is still stored, marked incomplete).
 */
export async function produce({
  server,
  token,
  sessionId,
  runId = `run_${randomUUID()}`,
  pieces = 120,
  intervalMs = 80,
  signal,
  log = () => {},
}) {
  const client = connectTo({ server, token });
  await beginRun(client, { sessionId, runId, leaseMs: Math.max(60_000, pieces * intervalMs * 2) });
  log(`run ${runId} began`);
  let text = "";
  let published = 0;
  let cancelled = false;
  let failure;
  try {
    for (let index = 0; index < pieces; index++) {
      const answer = await client.publishDelta({
        sessionId,
        runId,
        index: BigInt(index),
        delta: { case: "text", value: piece(index) },
      });
      text += piece(index);
      published = index + 1;
      if (answer.cancelRequested) {
        cancelled = true;
        log(`run ${runId}: cancel requested after ${published} pieces`);
        break;
      }
      if (index + 1 < pieces) {
        await pause(intervalMs, undefined, { signal });
      }
    }
  } catch (error) {
    failure = error;
  }
  const incomplete = cancelled || failure !== undefined;
  // What was produced is stored either way: an answer cut short is marked
  // incomplete, so every reader knows it stops mid-sentence.
  const stored = await client.appendExchange({
    sessionId,
    runId,
    providerCall: modelCall(published),
    responseMessages: [{ role: Role.ASSISTANT, content: text.trimEnd(), incomplete }],
  });
  const { taken } = await endRunTakingInput(client, { sessionId, runId });
  log(`run ${runId} ended after revision ${stored.revision}, taking ${taken.length} queued input(s)`);
  if (failure !== undefined && !cancelled && !(signal?.aborted ?? false)) {
    throw failure;
  }
  return {
    runId,
    published,
    cancelled,
    text: text.trimEnd(),
    revision: Number(stored.revision),
    taken: taken.map((input) => input.inputId),
  };
}

/** The --approval demo: one run that asks before it calls a tool. */
async function approvalRun({ server, token, sessionId, runId, signal, log }) {
  const client = connectTo({ server, token });
  // The run holds the lease while a person decides: long enough for one.
  runId = await beginRun(client, { sessionId, runId, leaseMs: 15 * 60_000 });
  try {
    const asked = await askApproval(client, { sessionId, runId });
    log(`run ${runId} asked for approval ${asked.approval.approvalId}: Approve or Deny it in the page`);
    const { approval } = await awaitDecision(client, {
      sessionId,
      approvalId: asked.approval.approvalId,
      afterRevision: asked.revision,
      signal,
    });
    const { approved } = await actOnDecision(client, { sessionId, runId, approval });
    const { taken } = await endRunTakingInput(client, { sessionId, runId });
    return { runId, approvalId: approval.approvalId, approved, decidedBy: approval.decidedBy, taken: taken.map((input) => input.inputId) };
  } catch (error) {
    // Interrupted: free the lease rather than leave the session busy.
    await client.endRun({ sessionId, runId }).catch(() => {});
    throw error;
  }
}

async function main() {
  const { values } = parseArgs({
    options: {
      server: { type: "string", default: process.env.SESSIONSTORE_SERVER ?? "http://127.0.0.1:50051" },
      token: { type: "string", default: process.env.SESSIONSTORE_TOKEN ?? "" },
      session: { type: "string" },
      "run-id": { type: "string" },
      pieces: { type: "string", default: "120" },
      "interval-ms": { type: "string", default: "80" },
      approval: { type: "boolean", default: false },
    },
  });
  if (!values.session) {
    console.error("usage: node producer.mjs --session SESSION_ID [--server URL] [--token TOKEN] [--pieces N] [--interval-ms MS] [--approval]");
    process.exit(2);
  }
  const stop = new AbortController();
  process.once("SIGINT", () => stop.abort());
  const result = await (values.approval ? approvalRun : produce)({
    server: values.server,
    token: values.token,
    sessionId: values.session,
    runId: values["run-id"],
    pieces: Number(values.pieces),
    intervalMs: Number(values["interval-ms"]),
    signal: stop.signal,
    log: (line) => console.error(line),
  });
  console.log(JSON.stringify(result));
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  main().catch((error) => {
    console.error(`producer failed: ${error.message ?? error}`);
    process.exit(1);
  });
}
