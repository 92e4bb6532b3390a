"""One process of the durable tool approval tests of test_openai_agents.py
(``python openai_agents_approvals_process.py MODE URL SESSION_ID MARKS``):

- ``pause``: two turns of an agent on a ``SessionstoreSession``; the second
  calls a tool that needs approval, so the run pauses. It asks for the
  approvals in the store (``request_approvals``), prints them as one JSON
  line, and waits to be killed.
- ``resume``: continues the run from the store alone (``resume``) and
  prints what the resumed run did as one JSON line (``null``: nothing to
  continue).
- ``wait-and-resume``: first checks that ``load_decided_run`` finds nothing
  to continue and prints ``{"ready": false}``, then resumes as ``resume``
  does, waiting for the decision (``wait=True``).

The tool writes ``MARKS/ran-<pid>`` when it runs, so the tests see which
process ran it. The test process imports this module for the same agent and
turns, run against the SDK's own ``SQLiteSession`` as the reference.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from agents import Agent, RunConfig, Runner, function_tool
from agents.memory import Session
from agents.result import RunResult
from agents.testing import ScriptedModel, assistant_message, function_call

CONFIG = RunConfig(tracing_disabled=True)
CALL_ID = "call_delete_1"
PATH = "/srv/reports/q3.txt"
ANSWER = "Done."


def build(marks: Path) -> tuple[Agent[Any], ScriptedModel]:
    """The agent (its tool needs approval) and its scripted model."""
    model = ScriptedModel()

    @function_tool(needs_approval=True)
    def delete_file(path: str) -> str:
        """Deletes a file."""
        (marks / f"ran-{os.getpid()}").write_text(path)
        return f"deleted {path}"

    return Agent(name="janitor", model=model, tools=[delete_file]), model


async def run_until_paused(agent: Agent[Any], model: ScriptedModel, session: Session) -> RunResult:
    """A first turn, then one whose tool call waits for approval."""
    model.enqueue([assistant_message("Hello. What should I clean up?")])
    await Runner.run(agent, "Hi", session=session, run_config=CONFIG)
    model.enqueue([function_call("delete_file", {"path": PATH}, call_id=CALL_ID)])
    result = await Runner.run(agent, f"Delete {PATH}", session=session, run_config=CONFIG)
    assert len(result.interruptions) == 1, result.interruptions
    return result


def model_input(model: ScriptedModel) -> Any:
    """What the model was sent last, as JSON."""
    return json.loads(json.dumps(model.calls[-1].input, default=repr))


async def main(mode: str, url: str, session_id: str, marks: Path) -> None:
    from sessionstore import AsyncClient
    from sessionstore.integrations.openai_agents import (
        SessionstoreSession,
        load_decided_run,
        request_approvals,
        resume,
    )

    agent, model = build(marks)
    session = SessionstoreSession(session_id, client=AsyncClient(url))
    if mode == "pause":
        result = await run_until_paused(agent, model, session)
        approvals = await request_approvals(session, result)
        print(json.dumps({"approvals": [a.approval_id for a in approvals]}), flush=True)
        await asyncio.Event().wait()  # until killed
    elif mode in ("resume", "wait-and-resume"):
        if mode == "wait-and-resume":
            # A look first, on another session object (as a process that
            # only looks would): nothing to continue while pending.
            peek = SessionstoreSession(session_id, client=session.client)
            if await load_decided_run(peek, agent) is not None:
                raise SystemExit("the approval was decided before the look")
            print(json.dumps({"ready": False}), flush=True)
        model.enqueue([assistant_message(ANSWER)])
        resumed = await resume(
            session, agent, wait=mode == "wait-and-resume", timeout=120, run_config=CONFIG
        )
        print(
            json.dumps(
                None
                if resumed is None
                else {
                    "final_output": resumed.final_output,
                    "interruptions": len(resumed.interruptions),
                    "model_input": model_input(model),
                }
            ),
            flush=True,
        )
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])))
