//! The stored-message round trip: arbitrary messages come back exactly,
//! on every backend.

use super::*;

// ---------------------------------------------------------------------------
// 1. The stored-message round trip

/// One session's life: created with arbitrary fields and history, one
/// exchange appended (as `messages` or as `full_history`), then forked and
/// edited.
#[derive(Clone, Debug)]
struct RoundTrip {
    title: String,
    system_prompt: String,
    user: String,
    metadata: BTreeMap<String, String>,
    initial_history: Vec<pb::Message>,
    messages: Vec<pb::Message>,
    call: Option<pb::ProviderCall>,
    responses: Vec<pb::Message>,
    /// Send the exchange as `full_history` (the stored history plus `messages`).
    full_history: bool,
    /// With `full_history`: lead with a copy of the system prompt.
    prompt_first: bool,
    /// EditMessage's new content for the first message.
    replacement: pb::Message,
    reason: String,
}

fn round_trips() -> impl Strategy<Value = RoundTrip> {
    (
        (text(), text(), text(), metadata()),
        (
            vec(message(), 0..3),
            vec(message(), 0..3),
            vec(message(), 0..3),
        ),
        (provider_call(), any::<bool>(), any::<bool>(), any::<bool>()),
        (message(), text()),
    )
        .prop_map(
            |(
                (title, system_prompt, user, metadata),
                (initial_history, messages, responses),
                (call, with_call, full_history, prompt_first),
                (replacement, reason),
            )| {
                // Valid shapes only: responses need a call, and an exchange
                // needs something to write.
                let with_call = with_call || !responses.is_empty() || messages.is_empty();
                RoundTrip {
                    title,
                    system_prompt,
                    user,
                    metadata,
                    initial_history,
                    messages,
                    call: with_call.then_some(call),
                    responses,
                    full_history,
                    prompt_first,
                    replacement,
                    reason,
                }
            },
        )
}

/// The system message an export with `include_system_prompt` leads with.
fn prompt_copy(prompt: &str) -> pb::Message {
    pb::Message {
        role: pb::Role::System.into(),
        content: prompt.to_owned(),
        ..Default::default()
    }
}

/// Whether `message` restates the system prompt (and so is not history).
fn is_prompt_copy(message: &pb::Message, prompt: &str) -> bool {
    !prompt.is_empty() && *message == prompt_copy(prompt)
}

impl RoundTrip {
    /// The history CreateSession stores: without a leading prompt copy.
    fn stored_initial(&self) -> Vec<pb::Message> {
        match self.initial_history.split_first() {
            Some((first, rest)) if is_prompt_copy(first, &self.system_prompt) => rest.to_vec(),
            _ => self.initial_history.clone(),
        }
    }

    fn append_request(
        &self,
        id: &str,
        stored_initial: &[pb::Message],
    ) -> pb::AppendExchangeRequest {
        let mut request = pb::AppendExchangeRequest {
            session_id: id.to_owned(),
            provider_call: self.call.clone(),
            response_messages: self.responses.clone(),
            request_id: format!("{id}-append"),
            ..Default::default()
        };
        if self.full_history {
            let body: Vec<pb::Message> = stored_initial
                .iter()
                .chain(&self.messages)
                .cloned()
                .collect();
            // A leading prompt copy is skipped by the server, so one that is
            // really history needs a copy in front of it.
            let lead = (self.prompt_first && !self.system_prompt.is_empty())
                || body
                    .first()
                    .is_some_and(|m| is_prompt_copy(m, &self.system_prompt));
            if lead {
                request.full_history.push(prompt_copy(&self.system_prompt));
            }
            request.full_history.extend(body);
        } else {
            request.messages = self.messages.clone();
        }
        request
    }
}

pub(super) async fn try_export(
    client: &mut Client,
    request: pb::ExportHistoryRequest,
) -> Result<Vec<pb::Message>, tonic::Status> {
    let mut stream = client.export_history(request).await?.into_inner();
    let mut out = Vec::new();
    while let Some(chunk) = stream.message().await? {
        out.extend(chunk.messages);
    }
    Ok(out)
}

pub(super) async fn try_list(
    client: &mut Client,
    id: &str,
    page_size: i32,
) -> Result<Vec<pb::StoredMessage>, tonic::Status> {
    let mut out = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_messages(pb::ListMessagesRequest {
                session_id: id.to_owned(),
                page_size,
                page_token,
                ..Default::default()
            })
            .await?
            .into_inner();
        out.extend(page.messages);
        if page.next_page_token.is_empty() {
            return Ok(out);
        }
        page_token = page.next_page_token;
    }
}

pub(super) async fn try_transcript(
    client: &mut Client,
    id: &str,
    format: i32,
) -> Result<Vec<u8>, tonic::Status> {
    let mut stream = client
        .export_transcript(pb::ExportTranscriptRequest {
            session_id: id.to_owned(),
            format,
            target: None,
        })
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Some(chunk) = stream.message().await? {
        out.extend(chunk.data);
    }
    Ok(out)
}

/// The next event of a watch, within [`PATIENCE`].
async fn next_event(events: &mut Events) -> Result<pb::SessionEvent, TestCaseError> {
    match tokio::time::timeout(PATIENCE, events.message()).await {
        Ok(Ok(Some(event))) => Ok(event),
        Ok(Ok(None)) => Err(TestCaseError::fail("watch stream ended")),
        Ok(Err(status)) => Err(failed_call("WatchSession", &status)),
        Err(_) => Err(TestCaseError::fail("no watch event within the patience")),
    }
}

pub(super) fn plain(stored: &[pb::StoredMessage]) -> Vec<pb::Message> {
    stored
        .iter()
        .map(|m| m.message.clone().unwrap_or_default())
        .collect()
}

/// Every string under an `"arguments"` key, anywhere in `value`.
fn arguments_in(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, inner) in map {
                match (key.as_str(), inner) {
                    ("arguments", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => arguments_in(inner, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| arguments_in(v, out)),
        _ => {}
    }
}

async fn round_trip_case(mut client: Client, case: RoundTrip) -> Result<(), TestCaseError> {
    let id = fresh_id("rt");
    let created = rpc(
        "CreateSession",
        client
            .create_session(pb::CreateSessionRequest {
                session_id: id.clone(),
                title: case.title.clone(),
                system_prompt: case.system_prompt.clone(),
                user: case.user.clone(),
                metadata: case.metadata.clone(),
                initial_history: case.initial_history.clone(),
                ..Default::default()
            })
            .await,
    )?;
    prop_assert_eq!(&created.title, &case.title);
    prop_assert_eq!(&created.system_prompt, &case.system_prompt);
    prop_assert_eq!(&created.user, &case.user);
    prop_assert_eq!(&created.metadata, &case.metadata);
    prop_assert_eq!(created.revision, 1);
    let got = rpc(
        "GetSession",
        client
            .get_session(pb::GetSessionRequest {
                session_id: id.clone(),
                ..Default::default()
            })
            .await,
    )?;
    prop_assert_eq!(&got, &created);

    // The exchange, and its idempotent retry.
    let stored_initial = case.stored_initial();
    let request = case.append_request(&id, &stored_initial);
    let appended = rpc(
        "AppendExchange",
        client.append_exchange(request.clone()).await,
    )?;
    let new: Vec<pb::Message> = case
        .messages
        .iter()
        .chain(&case.responses)
        .cloned()
        .collect();
    let first_new = stored_initial.len();
    prop_assert_eq!(
        plain(&appended.messages),
        new.clone(),
        "AppendExchange answer"
    );
    prop_assert_eq!(appended.revision, 2);
    prop_assert_eq!(appended.next_sequence, (first_new + new.len()) as i64);
    let call_id = appended
        .provider_call
        .as_ref()
        .map(|c| c.id.clone())
        .unwrap_or_default();
    for (i, stored) in appended.messages.iter().enumerate() {
        prop_assert_eq!(stored.sequence, (first_new + i) as i64);
        prop_assert_eq!(&stored.session_id, &id);
        prop_assert!(stored.id.starts_with("msg_"), "message id {:?}", stored.id);
        let linked = if i >= case.messages.len() {
            call_id.as_str()
        } else {
            ""
        };
        prop_assert_eq!(stored.produced_by_call_id.as_str(), linked, "message {}", i);
    }
    match (&case.call, &appended.provider_call) {
        (None, None) => {}
        (Some(sent), Some(stored)) => {
            let total = if sent.total_tokens == 0 {
                sent.prompt_tokens.saturating_add(sent.completion_tokens)
            } else {
                sent.total_tokens
            };
            let expected = pb::ProviderCall {
                id: stored.id.clone(),
                session_id: id.clone(),
                total_tokens: total,
                create_time: stored.create_time,
                ..sent.clone()
            };
            prop_assert_eq!(stored, &expected);
            prop_assert!(stored.id.starts_with("call_"), "call id {:?}", stored.id);
        }
        (sent, stored) => prop_assert!(false, "sent call {:?}, stored {:?}", sent, stored),
    }
    let retried = rpc(
        "AppendExchange retry",
        client.append_exchange(request).await,
    )?;
    prop_assert_eq!(
        &retried,
        &appended,
        "an idempotent retry answers the first result"
    );

    // Every read returns exactly what was written.
    let expected: Vec<pb::Message> = stored_initial.iter().chain(&new).cloned().collect();
    let export_request = pb::ExportHistoryRequest {
        session_id: id.clone(),
        ..Default::default()
    };
    let exported = try_export(&mut client, export_request.clone())
        .await
        .map_err(|s| failed_call("ExportHistory", &s))?;
    prop_assert_eq!(&exported, &expected, "ExportHistory");
    let with_prompt = try_export(
        &mut client,
        pb::ExportHistoryRequest {
            include_system_prompt: true,
            ..export_request.clone()
        },
    )
    .await
    .map_err(|s| failed_call("ExportHistory with prompt", &s))?;
    let prompt: Vec<pb::Message> = (!case.system_prompt.is_empty())
        .then(|| prompt_copy(&case.system_prompt))
        .into_iter()
        .collect();
    prop_assert_eq!(
        &with_prompt[..prompt.len().min(with_prompt.len())],
        &prompt[..]
    );
    prop_assert_eq!(
        &with_prompt[prompt.len().min(with_prompt.len())..],
        &expected[..]
    );

    let listed = try_list(&mut client, &id, 2)
        .await
        .map_err(|s| failed_call("ListMessages", &s))?;
    prop_assert_eq!(plain(&listed), expected.clone(), "ListMessages");
    for (i, stored) in listed.iter().enumerate() {
        prop_assert_eq!(stored.sequence, i as i64);
    }
    prop_assert_eq!(&listed[first_new..], &appended.messages[..]);

    let calls = rpc(
        "ListProviderCalls",
        client
            .list_provider_calls(pb::ListProviderCallsRequest {
                session_id: id.clone(),
                ..Default::default()
            })
            .await,
    )?;
    let expected_calls: Vec<pb::ProviderCall> = appended.provider_call.iter().cloned().collect();
    prop_assert_eq!(&calls.provider_calls, &expected_calls);

    // The event log holds the same bodies.
    let mut events = client
        .watch_session(pb::WatchSessionRequest {
            session_id: id.clone(),
            after_revision: 0,
            include_active_deltas: false,
            ..Default::default()
        })
        .await
        .map_err(|s| failed_call("WatchSession", &s))?
        .into_inner();
    let event = next_event(&mut events).await?;
    let Some(Event::SessionCreated(made)) = event.event else {
        return Err(TestCaseError::fail(format!("first event {event:?}")));
    };
    prop_assert_eq!(
        plain(&made.messages),
        stored_initial.clone(),
        "session_created"
    );
    prop_assert_eq!(&listed[..first_new], &made.messages[..]);
    let event = next_event(&mut events).await?;
    let Some(Event::ExchangeAppended(exchange)) = event.event else {
        return Err(TestCaseError::fail(format!("second event {event:?}")));
    };
    prop_assert_eq!(&exchange.messages, &appended.messages, "exchange_appended");
    prop_assert_eq!(&exchange.provider_call, &appended.provider_call);
    let event = next_event(&mut events).await?;
    prop_assert!(
        matches!(event.event, Some(Event::CaughtUp(_))),
        "expected caught_up, got {:?}",
        event
    );
    drop(events);

    // Transcripts render anything; the OpenAI form keeps every argument.
    let markdown = try_transcript(&mut client, &id, pb::TranscriptFormat::Markdown.into())
        .await
        .map_err(|s| failed_call("ExportTranscript markdown", &s))?;
    prop_assert!(String::from_utf8(markdown).is_ok(), "Markdown is not UTF-8");
    let openai = try_transcript(&mut client, &id, pb::TranscriptFormat::OpenaiJson.into())
        .await
        .map_err(|s| failed_call("ExportTranscript openai", &s))?;
    let openai: serde_json::Value = serde_json::from_slice(&openai)
        .map_err(|e| TestCaseError::fail(format!("OpenAI transcript is not JSON: {e}")))?;
    prop_assert!(openai.is_array(), "OpenAI transcript is not an array");
    if !case.system_prompt.is_empty() {
        prop_assert_eq!(&openai[0]["role"], "system");
        prop_assert_eq!(
            openai[0]["content"].as_str(),
            Some(case.system_prompt.as_str())
        );
    }
    let mut found = Vec::new();
    arguments_in(&openai, &mut found);
    for message in &expected {
        let sent = message.tool_calls.iter().map(|c| &c.arguments).chain(
            message
                .content_blocks
                .iter()
                .filter_map(|b| match &b.block {
                    Some(Block::ToolUse(u)) => Some(&u.input),
                    _ => None,
                }),
        );
        for arguments in sent {
            let at = found.iter().position(|f| f == arguments);
            prop_assert!(
                at.is_some(),
                "arguments {:?} missing from {}",
                arguments,
                openai
            );
            if let Some(at) = at {
                found.swap_remove(at);
            }
        }
    }

    // A fork copies the history exactly.
    let fork_id = format!("{id}-fork");
    let fork = rpc(
        "ForkSession",
        client
            .fork_session(pb::ForkSessionRequest {
                session_id: id.clone(),
                at_sequence: expected.len() as i64 - 1,
                new_session_id: fork_id.clone(),
            })
            .await,
    )?;
    prop_assert_eq!(&fork.metadata, &case.metadata);
    prop_assert_eq!(&fork.system_prompt, &case.system_prompt);
    let forked = try_export(
        &mut client,
        pb::ExportHistoryRequest {
            session_id: fork_id,
            ..Default::default()
        },
    )
    .await
    .map_err(|s| failed_call("ExportHistory of the fork", &s))?;
    prop_assert_eq!(&forked, &expected, "fork");

    // An edit replaces the first message; the event keeps the previous one.
    if let Some(first) = listed.first() {
        let edited = rpc(
            "EditMessage",
            client
                .edit_message(pb::EditMessageRequest {
                    session_id: id.clone(),
                    message_id: first.id.clone(),
                    message: Some(case.replacement.clone()),
                    reason: case.reason.clone(),
                    run_id: String::new(),
                })
                .await,
        )?;
        prop_assert_eq!(
            edited.message.as_ref().and_then(|m| m.message.as_ref()),
            Some(&case.replacement)
        );
        let mut after_edit = expected.clone();
        after_edit[0] = case.replacement.clone();
        let exported = try_export(&mut client, export_request)
            .await
            .map_err(|s| failed_call("ExportHistory after edit", &s))?;
        prop_assert_eq!(&exported, &after_edit, "after EditMessage");
        let mut events = client
            .watch_session(pb::WatchSessionRequest {
                session_id: id.clone(),
                after_revision: appended.revision,
                include_active_deltas: false,
                ..Default::default()
            })
            .await
            .map_err(|s| failed_call("WatchSession after edit", &s))?
            .into_inner();
        let event = next_event(&mut events).await?;
        let Some(Event::MessageEdited(change)) = event.event else {
            return Err(TestCaseError::fail(format!("edit event {event:?}")));
        };
        prop_assert_eq!(change.previous.as_ref(), Some(&expected[0]));
        prop_assert_eq!(
            change.message.as_ref().and_then(|m| m.message.as_ref()),
            Some(&case.replacement)
        );
        prop_assert_eq!(&change.reason, &case.reason);
    }
    Ok(())
}

fn round_trip(backend: Backend) {
    let runtime = runtime();
    if matches!(backend, Backend::Postgres)
        && !runtime.block_on(postgres_available("hostile::round_trip_postgres"))
    {
        return;
    }
    let server = runtime.block_on(TestServer::start(backend));
    let client = runtime.block_on(server.client());
    run_property(
        &runtime,
        &format!("message round trip on {backend:?}"),
        round_trips(),
        |case| round_trip_case(client.clone(), case),
    );
    drop(client);
    runtime
        .block_on(server.stop())
        .expect("the server stops cleanly");
}

#[test]
fn round_trip_memory() {
    round_trip(Backend::Memory);
}

#[test]
fn round_trip_file() {
    round_trip(Backend::File);
}

#[test]
fn round_trip_postgres() {
    round_trip(Backend::Postgres);
}
