// The run control plane as the page shows it: the approvals runs asked for
// (pending ones with Approve and Deny buttons, decided ones with their
// outcome) and the input typed while the session was busy, waiting in its
// queue (each with a Withdraw button) until a run takes it into the
// history. What is shown comes from ListApprovals and ListQueuedInputs when
// the session opens, then from the watch stream.

import type { Approval, Message, QueuedInput } from "./gen/sessionstore/v1/messages_pb.js";
import { ApprovalDecision, ApprovalState } from "./gen/sessionstore/v1/messages_pb.js";

/** The approvals this tab knows of, by id. */
export const approvals = new Map<string, Approval>();
/** The inputs waiting in the session's queue, by id. */
export const queued = new Map<string, QueuedInput>();

/** The text of a message: its content and its text blocks, and the tools it calls. */
export function textOf(message: Message | undefined): string {
  if (message === undefined) {
    return "";
  }
  const blocks = message.contentBlocks
    .map((block) => (block.block.case === "text" ? block.block.value.text : ""))
    .filter((text) => text !== "");
  const calls = message.toolCalls.map((call) => `→ ${call.name}(${call.arguments})`);
  return [message.content, ...blocks, ...calls].filter((text) => text !== "").join("\n");
}

export function stateName(state: ApprovalState): string {
  return (ApprovalState[state] ?? "unknown").toLowerCase();
}

function button(label: string, className: string, onClick: (button: HTMLButtonElement) => void): HTMLButtonElement {
  const element = document.createElement("button");
  element.type = "button";
  element.className = className;
  element.textContent = label;
  element.addEventListener("click", () => onClick(element));
  return element;
}

/**
 * Shows the approvals in `list`, oldest first: each one's title and tool
 * call, and its state; a pending one has Approve and Deny buttons that call
 * `decide` (which re-enables them if the decision failed).
 */
export function renderApprovals(
  section: HTMLElement,
  list: HTMLElement,
  decide: (approval: Approval, decision: ApprovalDecision, buttons: HTMLButtonElement[]) => void,
): void {
  // In the order this tab learnt of them: oldest first.
  const items = [...approvals.values()].map((approval) => {
    const item = document.createElement("li");
    const state = stateName(approval.state);
    item.className = `approval ${state}`;
    item.dataset.approvalId = approval.approvalId;
    item.dataset.state = state;
    const title = document.createElement("p");
    title.className = "title";
    title.textContent = approval.title === "" ? `Tool call ${approval.toolCallId}` : approval.title;
    const outcome = document.createElement("span");
    outcome.className = "badge";
    const by = approval.decidedBy === "" ? "" : ` by ${approval.decidedBy}`;
    outcome.textContent = approval.state === ApprovalState.PENDING ? "waiting for a decision" : `${state}${by}`;
    title.append(outcome);
    item.append(title);
    if (approval.detailJson !== "") {
      const detail = document.createElement("code");
      detail.className = "detail";
      detail.textContent = approval.detailJson;
      item.append(detail);
    }
    if (approval.state === ApprovalState.PENDING) {
      const buttons: HTMLButtonElement[] = [];
      const onClick = (decision: ApprovalDecision) => () => {
        buttons.forEach((b) => (b.disabled = true));
        decide(approval, decision, buttons);
      };
      buttons.push(button("Approve", "approve", onClick(ApprovalDecision.APPROVE)));
      buttons.push(button("Deny", "deny", onClick(ApprovalDecision.DENY)));
      item.append(...buttons);
    }
    return item;
  });
  list.replaceChildren(...items);
  section.hidden = items.length === 0;
}

/** Shows the waiting inputs by position, each with a Withdraw button that calls `withdraw`. */
export function renderQueue(
  section: HTMLElement,
  list: HTMLElement,
  withdraw: (input: QueuedInput, button: HTMLButtonElement) => void,
): void {
  const items = [...queued.values()]
    .sort((a, b) => (a.position < b.position ? -1 : 1))
    .map((input) => {
      const item = document.createElement("li");
      item.className = "queued";
      item.dataset.inputId = input.inputId;
      item.dataset.position = String(input.position);
      const text = document.createElement("p");
      text.className = "text";
      text.textContent = input.messages.map(textOf).join("\n");
      item.append(
        text,
        button("Withdraw", "withdraw", (element) => {
          element.disabled = true;
          withdraw(input, element);
        }),
      );
      return item;
    });
  list.replaceChildren(...items);
  section.hidden = items.length === 0;
}
