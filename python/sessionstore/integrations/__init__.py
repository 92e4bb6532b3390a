"""Adapters that make sessionstore the session backend of agent frameworks.

Each lives in its own module and needs its framework installed (the
package's extras of the same name):

- :mod:`sessionstore.integrations.openai_agents` — ``SessionstoreSession``
  for the OpenAI Agents SDK (``pip install "sessionstore-client[openai-agents]"``);
- :mod:`sessionstore.integrations.adk` — ``SessionstoreSessionService`` for
  Google ADK (``[adk]``);
- :mod:`sessionstore.integrations.langchain` —
  ``SessionstoreChatMessageHistory`` for LangChain (``[langchain]``).

The adapters keep no data of their own: every framework call is one RPC
wherever the framework call is one change.
"""
