#!/usr/bin/env node
// A demo producer: what an agent runtime or gateway does while a model
// answers. It takes the session's lease for a run (BeginRun), streams a
// fake answer piece by piece with PublishDelta, stops as soon as a
// PublishDelta answer says cancel_requested (someone pressed Stop), stores
// what it has with AppendExchange (the answer marked incomplete if it was
// cut short) and ends the run (EndRun).
//
//   node producer.mjs --session ses_… [--server http://127.0.0.1:50051]
//                     [--token TOKEN] [--pieces 120] [--interval-ms 80]
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

import { Role } from "./src/gen/sessionstore/v1/messages_pb.js";
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

/**
 * Streams an answer into `sessionId` as run `runId`. Resolves when the run
 * is over, with { runId, published, cancelled, text, revision }. `signal`
 * stops it early (the partial answer is still stored, marked incomplete).
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
  const client = createClient(SessionStore, transport);
  const lease = durationFromMs(Math.max(60_000, pieces * intervalMs * 2));

  await client.beginRun({ sessionId, runId, lease });
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
    providerCall: {
      provider: "demo",
      model: "fake-words",
      requestedModel: "fake-words",
      completionTokens: BigInt(published),
      totalTokens: BigInt(published),
    },
    responseMessages: [{ role: Role.ASSISTANT, content: text.trimEnd(), incomplete }],
  });
  await client.endRun({ sessionId, runId });
  log(`run ${runId} ended at revision ${stored.revision}`);
  if (failure !== undefined && !cancelled && !(signal?.aborted ?? false)) {
    throw failure;
  }
  return { runId, published, cancelled, text: text.trimEnd(), revision: Number(stored.revision) };
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
    },
  });
  if (!values.session) {
    console.error("usage: node producer.mjs --session SESSION_ID [--server URL] [--token TOKEN] [--pieces N] [--interval-ms MS]");
    process.exit(2);
  }
  const stop = new AbortController();
  process.once("SIGINT", () => stop.abort());
  const result = await produce({
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
