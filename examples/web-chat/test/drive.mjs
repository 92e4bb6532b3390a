#!/usr/bin/env node
// Drives the built page (dist/) in headless Chromium against a running
// sessionstore, the way a person would, and checks what it shows:
//
//  1. with a wrong token, sending fails with Unauthenticated and the
//     ErrorInfo reason read from grpc-status-details-bin;
//  2. loaded from an origin the server does not allow, the call is refused
//     by the browser (CORS);
//  3. a session is created and a question appended; while the demo producer
//     (../producer.mjs) streams the answer, the tab is reloaded mid-answer,
//     restores the partial text from sessionStorage and resumes from its
//     revision and delta cursor with the text intact, then follows live;
//  4. a second tab on the same session address shows the same live answer
//     and stops the run with CancelRun; the first tab sees the cancel and
//     the stored answer marked incomplete;
//  5. both tabs open a second session; the producer's run asks for approval
//     of a tool call; both tabs show it pending with Approve and Deny; the
//     first tab approves; the second shows it approved, its buttons gone,
//     and the producer sees the decision on its watch;
//  6. the producer begins a run; the first tab types two messages, both
//     shown queued in both tabs, in order, and a third that the second tab
//     withdraws; the producer ends the run taking the queued input (one
//     TakeQueuedInput, then EndRun take_next); both tabs show the two
//     messages in the transcript in order and the queue empty.
//
//   node test/drive.mjs --page http://127.0.0.1:PAGE/ --server http://127.0.0.1:PORT \
//     --token TOKEN --disallowed-page http://localhost:PAGE/ [--screenshot FILE]
//
// Prints a JSON report on stdout; exits 1 if any check failed. Chromium is
// /usr/bin/chromium, or $CHROMIUM. Every wait is on a condition, with
// --timeout-ms (default 30 s) as its limit.

import { parseArgs } from "node:util";
import { chromium } from "playwright-core";

import { ApprovalState } from "../src/gen/sessionstore/v1/messages_pb.js";
import { actOnDecision, answerText, askApproval, awaitDecision, beginRun, connectTo, endRunTakingInput, produce } from "../producer.mjs";

const { values: args } = parseArgs({
  options: {
    page: { type: "string" },
    server: { type: "string" },
    token: { type: "string" },
    "disallowed-page": { type: "string" },
    screenshot: { type: "string" },
    "timeout-ms": { type: "string", default: "30000" },
  },
});
for (const required of ["page", "server", "token", "disallowed-page"]) {
  if (!args[required]) {
    console.error(`drive.mjs: --${required} is required`);
    process.exit(2);
  }
}
const timeout = Number(args["timeout-ms"]);

const report = { ok: false, checks: [] };
const browserLog = [];

function check(name, passed, detail = {}) {
  report.checks.push({ name, passed, ...detail });
  if (!passed) {
    throw new Error(`check failed: ${name}: ${JSON.stringify(detail)}`);
  }
}

/** The page's address with the server and token to remember. */
function withSettings(page, token) {
  const url = new URL(page);
  url.searchParams.set("server", args.server);
  url.searchParams.set("token", token);
  return url.href;
}

function watchBrowser(page, tab) {
  page.on("console", (message) => {
    if (message.type() === "error" || message.type() === "warning") {
      browserLog.push(`${tab} console ${message.type()}: ${message.text()}`);
    }
  });
  page.on("pageerror", (error) => browserLog.push(`${tab} page error: ${error.message}`));
}

/** What the live answer shows: { runId, lastIndex, text, state, hidden, mergedDeltas }. */
async function liveAnswer(page) {
  return page.evaluate(() => {
    const live = document.getElementById("live");
    return {
      runId: live.dataset.runId ?? "",
      lastIndex: Number(live.dataset.lastIndex ?? -1),
      text: document.getElementById("live-text").textContent,
      state: live.dataset.state,
      hidden: live.hidden,
      // Merged deltas (first_index < index) this page load received.
      mergedDeltas: Number(document.body.dataset.mergedDeltas ?? 0),
    };
  });
}

/** Waits until the live answer has reached delta `index`. */
async function liveAnswerAt(page, index) {
  await page.waitForFunction(
    (index) => Number(document.getElementById("live").dataset.lastIndex ?? -1) >= index,
    index,
    { timeout },
  );
  return liveAnswer(page);
}

/** Sends `text` and waits for the status line to say how it went. */
async function send(page, text) {
  await page.fill("#question", text);
  await page.click("#send");
}

/** Resolves as `promise` does, or fails saying `what` did not happen in time. */
function inTime(promise, what) {
  return Promise.race([
    promise,
    new Promise((_, reject) => setTimeout(() => reject(new Error(`${what}: not in time`)), timeout).unref()),
  ]);
}

/** The texts of the transcript's messages with `role`, in order. */
async function transcriptTexts(page, role) {
  return page.$$eval(`#transcript li.message.${role} .text`, (items) => items.map((item) => item.textContent));
}

/** The queued inputs shown: [{ inputId, position, text, withdraw }], in the order shown. */
async function queuedShown(page) {
  return page.$$eval("#queued-list li.queued", (items) =>
    items.map((item) => ({
      inputId: item.dataset.inputId,
      position: Number(item.dataset.position),
      text: item.querySelector(".text").textContent,
      withdraw: item.querySelector("button.withdraw") !== null,
    })),
  );
}

/** Waits until `page` shows `count` queued inputs. */
async function queuedCount(page, count) {
  await page.waitForFunction((count) => document.querySelectorAll("#queued-list li.queued").length === count, count, { timeout });
  return queuedShown(page);
}

/** Sends `text` while a run is busy, and waits until this tab shows it queued (the `count`th) and the box is clear again. */
async function sendQueued(page, text, count) {
  await send(page, text);
  await page.waitForFunction(
    (count) =>
      document.querySelectorAll("#queued-list li.queued").length === count &&
      document.getElementById("question").value === "" &&
      !document.getElementById("send").disabled,
    count,
    { timeout },
  );
}

/** Opens the session at `url` in `page` and waits until its watch is live. */
async function openLive(page, url) {
  await page.goto(url);
  await page.waitForFunction(() => document.body.dataset.watch === "live", null, { timeout });
}

async function statusError(page) {
  await page.waitForSelector("#status[data-code]", { timeout });
  return page.evaluate(() => {
    const status = document.getElementById("status");
    return { code: status.dataset.code, reason: status.dataset.reason, text: status.textContent };
  });
}

async function scenario(browser) {
  // 1. A wrong token: the server's answer, details included, reaches the page.
  {
    const context = await browser.newContext();
    const page = await context.newPage();
    watchBrowser(page, "wrong-token");
    await page.goto(withSettings(args.page, "not-a-token"));
    await send(page, "Is anyone there?");
    const error = await statusError(page);
    check("a wrong token is refused, with the ErrorInfo reason readable", error.code === "Unauthenticated" && error.reason === "UNAUTHENTICATED", error);
    report.wrongToken = error;
    await context.close();
  }

  // 2. An origin the server does not allow: the browser refuses the answer.
  {
    const context = await browser.newContext();
    const page = await context.newPage();
    watchBrowser(page, "disallowed");
    const failed = [];
    page.on("requestfailed", (request) => {
      if (request.url().startsWith(args.server)) {
        failed.push({ url: request.url(), error: request.failure()?.errorText ?? "" });
      }
    });
    await page.goto(withSettings(args["disallowed-page"], args.token));
    const origin = await page.evaluate(() => location.origin);
    await send(page, "Can this origin talk to the server?");
    const error = await statusError(page);
    const refused = error.code === "Unknown" || error.code === "Unavailable";
    check("a page from a disallowed origin cannot call the server", refused && failed.length > 0, { origin, error, failed });
    const corsMessages = browserLog.filter((line) => line.startsWith("disallowed") && line.includes("CORS"));
    report.cors = { origin, refused, error, failedRequests: failed, browserSaid: corsMessages };
    await context.close();
  }

  // 3. The main scenario: one browser context (shared localStorage), two tabs.
  const context = await browser.newContext({ viewport: { width: 900, height: 700 } });
  const tab = await context.newPage();
  watchBrowser(tab, "tab1");
  await tab.goto(withSettings(args.page, args.token));
  check("the token is taken out of the address", !tab.url().includes("token="), { url: tab.url() });
  const questionText = "What does sessionstore keep, and what happens if I reload?";
  await send(tab, questionText);
  await tab.waitForURL(/[?&]session=/, { timeout });
  await tab.waitForSelector("#transcript li.message.user", { timeout });
  const sessionUrl = tab.url();
  const sessionId = new URL(sessionUrl).searchParams.get("session");
  report.sessionId = sessionId;
  report.sessionUrl = sessionUrl;
  const shownQuestion = await tab.textContent("#transcript li.message.user .text");
  check("the question is in the transcript", shownQuestion === questionText, { shownQuestion });

  // The producer streams a long answer: it ends when the second tab stops it.
  const producerStop = new AbortController();
  const producerLog = [];
  report.producerLog = producerLog;
  const producing = produce({
    server: args.server,
    token: args.token,
    sessionId,
    pieces: 100_000,
    intervalMs: 40,
    signal: producerStop.signal,
    log: (line) => producerLog.push(line),
  });
  producing.catch(() => {});
  let second;
  try {
    const before = await liveAnswerAt(tab, 12);
    check("the live answer is the text published so far", before.text === answerText(before.lastIndex), before);
    report.beforeReload = before;

    // Reloaded mid-answer: the partial text is there at once (from
    // sessionStorage), and the watch resumes after it.
    await tab.reload({ waitUntil: "domcontentloaded" });
    // The page restores the partial answer at once, then reads the session
    // and its newest messages, and only then starts the watch (which is
    // when it says where from): wait for both.
    await tab.waitForFunction(
      () => document.body.dataset.restoredIndex !== undefined && document.body.dataset.watchFrom !== undefined,
      null,
      { timeout },
    );
    const restoredIndex = Number(await tab.evaluate(() => document.body.dataset.restoredIndex));
    const watchFrom = JSON.parse(await tab.evaluate(() => document.body.dataset.watchFrom ?? "{}"));
    check("after the reload the tab restored its partial answer", restoredIndex >= before.lastIndex, { restoredIndex, watchFrom });
    check(
      "after the reload the watch resumes from the last revision and delta index seen",
      watchFrom.afterRevision > 0 &&
        watchFrom.deltaCursors?.length === 1 &&
        watchFrom.deltaCursors[0].runId === before.runId &&
        watchFrom.deltaCursors[0].afterIndex === restoredIndex,
      { watchFrom },
    );
    const after = await liveAnswerAt(tab, restoredIndex + 10);
    check(
      "after the reload the answer goes on live, intact",
      after.runId === before.runId && after.text.startsWith(before.text) && after.text === answerText(after.lastIndex),
      { restoredIndex, lastIndex: after.lastIndex, length: after.text.length },
    );
    report.afterReload = { restoredIndex, watchFrom, ...after };
    if (args.screenshot) {
      // The reloaded tab following the answer live, its Stop button ready.
      await tab.screenshot({ path: args.screenshot });
      report.screenshot = args.screenshot;
    }

    // A second tab on the same address: it joins the run in progress (all of
    // its deltas so far) and stops it.
    second = await context.newPage();
    watchBrowser(second, "tab2");
    await second.goto(sessionUrl);
    const joined = await liveAnswerAt(second, after.lastIndex);
    check("a second tab shows the same live answer", joined.runId === before.runId && joined.text === answerText(joined.lastIndex), {
      lastIndex: joined.lastIndex,
    });
    report.secondTab = { runId: joined.runId, lastIndex: joined.lastIndex, mergedDeltas: joined.mergedDeltas };
    await second.click("#stop");

    // Both tabs see the cancel and the stored, incomplete answer.
    const result = await Promise.race([
      producing,
      new Promise((_, reject) => setTimeout(() => reject(new Error("the producer was not stopped in time")), timeout).unref()),
    ]);
    report.producer = { runId: result.runId, published: result.published, cancelled: result.cancelled };
    check("the producer saw cancel_requested", result.cancelled === true, report.producer);
    for (const [name, page] of [["tab1", tab], ["tab2", second]]) {
      await page.waitForSelector("#transcript li.message.assistant.incomplete", { timeout });
      await page.waitForFunction(() => document.getElementById("live").hidden, null, { timeout });
      const cancelSeen = await page.evaluate(() => document.body.dataset.cancelRequested ?? "");
      const stored = await page.textContent("#transcript li.message.assistant.incomplete .text");
      check(`${name} saw the run's cancel and shows the stored answer marked incomplete`, cancelSeen === result.runId && stored === result.text, {
        cancelSeen,
        storedLength: stored?.length,
      });
      if (name === "tab1") {
        report.cancel = { runId: cancelSeen, storedText: stored, storedStartsWithTextBeforeReload: stored.startsWith(before.text.trimEnd()) };
        check("the stored answer begins with what the tab showed before the reload", report.cancel.storedStartsWithTextBeforeReload);
      }
    }
  } finally {
    producerStop.abort();
    await producing.catch(() => {});
  }
  await controlScenario(tab, second);
}

/** 5 and 6: approvals and queued input, tab A (`tab`) and tab B (`second`) on a new session. */
async function controlScenario(tab, second) {
  const client = connectTo({ server: args.server, token: args.token });
  const session = await client.createSession({ title: "Approvals and queued input" });
  const sessionId = session.id;
  const url = new URL(args.page);
  url.searchParams.set("session", sessionId);
  const control = { sessionId };
  report.control = control;
  for (const [name, page] of [["tab A", tab], ["tab B", second]]) {
    await openLive(page, url.href);
    check(`${name} opens the second session, nothing pending or queued`, (await page.isHidden("#approvals")) && (await page.isHidden("#queue")));
  }

  // 5. The run asks before it calls a tool; tab A approves, tab B sees it.
  const stopWatching = new AbortController();
  try {
    const approvalRun = await beginRun(client, { sessionId, leaseMs: 120_000 });
    const asked = await askApproval(client, { sessionId, runId: approvalRun });
    const approvalId = asked.approval.approvalId;
    control.approvalId = approvalId;
    const decision = awaitDecision(client, { sessionId, approvalId, afterRevision: asked.revision, signal: stopWatching.signal });
    decision.catch(() => {});
    const item = `#approval-list li.approval[data-approval-id="${approvalId}"]`;
    for (const [name, page] of [["tab A", tab], ["tab B", second]]) {
      await page.waitForSelector(`${item}[data-state="pending"] button.approve`, { timeout });
      const shown = await page.$eval(item, (li) => ({
        title: li.querySelector(".title").textContent,
        approve: li.querySelector("button.approve") !== null,
        deny: li.querySelector("button.deny") !== null,
      }));
      check(`${name} shows the approval pending, with Approve and Deny`, shown.approve && shown.deny && shown.title.startsWith(asked.approval.title), shown);
    }
    await tab.click(`${item} button.approve`);
    await second.waitForSelector(`${item}[data-state="approved"]`, { timeout });
    for (const [name, page] of [["tab B", second], ["tab A", tab]]) {
      await page.waitForSelector(`${item}[data-state="approved"]`, { timeout });
      const shown = await page.$eval(item, (li) => ({
        state: li.dataset.state,
        buttons: li.querySelectorAll("button").length,
        outcome: li.querySelector(".badge").textContent,
      }));
      check(`${name} shows the approval approved, Approve and Deny gone`, shown.state === "approved" && shown.buttons === 0, shown);
    }
    const decided = await inTime(decision, "the producer sees the decision on its watch");
    control.decision = { state: ApprovalState[decided.approval.state], decidedBy: decided.approval.decidedBy };
    check("the producer sees the approval decided from tab A", decided.approval.state === ApprovalState.APPROVED && decided.approval.decidedBy === "web chat", control.decision);
    await actOnDecision(client, { sessionId, runId: approvalRun, approval: decided.approval });
    const first = await endRunTakingInput(client, { sessionId, runId: approvalRun });
    check("nothing was queued during the approval run", first.taken.length === 0, { taken: first.taken.length });
    await tab.waitForFunction(() => document.getElementById("live").hidden, null, { timeout });
  } finally {
    stopWatching.abort();
  }

  // 6. Typed while a run is busy: queued, in order, then taken in order.
  const typed = ["First, list what was in /tmp/scratch.", "Then tell me how much space that freed."];
  const runId = await beginRun(client, { sessionId, leaseMs: 120_000 });
  control.runId = runId;
  try {
    await tab.waitForFunction((runId) => document.getElementById("live").dataset.runId === runId, runId, { timeout });
    await sendQueued(tab, typed[0], 1);
    await sendQueued(tab, typed[1], 2);
    for (const [name, page] of [["tab A", tab], ["tab B", second]]) {
      const shown = await queuedCount(page, 2);
      check(
        `${name} shows both messages queued, in order, each with Withdraw`,
        shown.map((input) => input.text).join("|") === typed.join("|") && shown[0].position < shown[1].position && shown.every((input) => input.withdraw),
        { shown },
      );
      control.queued = shown.map((input) => input.inputId);
    }
    // A third one, withdrawn from tab B: gone from both, never taken.
    await sendQueued(tab, "Never mind, ignore this one.", 3);
    const third = (await queuedCount(second, 3))[2];
    control.withdrawn = third.inputId;
    await second.click(`#queued-list li.queued[data-input-id="${third.inputId}"] button.withdraw`);
    for (const [name, page] of [["tab B", second], ["tab A", tab]]) {
      const shown = await queuedCount(page, 2);
      check(`${name} no longer shows the withdrawn message`, shown.every((input) => input.inputId !== third.inputId), { shown });
    }
    const ended = await endRunTakingInput(client, { sessionId, runId });
    control.taken = ended.taken.map((input) => input.inputId);
    check("the run ends taking both queued messages, in order", control.taken.join("|") === control.queued.join("|"), {
      taken: control.taken,
      queued: control.queued,
    });
  } catch (error) {
    await client.endRun({ sessionId, runId }).catch(() => {});
    throw error;
  }
  for (const [name, page] of [["tab A", tab], ["tab B", second]]) {
    await page.waitForFunction(
      (typed) => {
        const users = [...document.querySelectorAll("#transcript li.message.user .text")].map((item) => item.textContent);
        return users.join("|") === typed.join("|") && document.getElementById("queue").hidden && document.getElementById("live").hidden;
      },
      typed,
      { timeout },
    );
    const users = await transcriptTexts(page, "user");
    const left = (await queuedShown(page)).length;
    check(`${name} shows the two messages in the transcript in order, and the queue empty`, users.join("|") === typed.join("|") && left === 0, {
      users,
      left,
    });
    control[name === "tab A" ? "tabA" : "tabB"] = {
      user: users,
      assistant: await transcriptTexts(page, "assistant"),
      tool: await transcriptTexts(page, "tool"),
    };
  }
}

let browser;
try {
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    timeout,
  });
  await scenario(browser);
  report.ok = true;
} catch (error) {
  report.error = error instanceof Error ? error.message : String(error);
} finally {
  report.browserLog = browserLog;
  await browser?.close().catch(() => {});
}
console.log(JSON.stringify(report, null, 2));
process.exit(report.ok ? 0 : 1);
