//! The core RPCs: sessions, exchanges, exports, listings, and the error table.

use std::collections::BTreeMap;

use sessionstore_client::v1 as pb;
use sessionstore_client::v1::content_block::Block;
use tonic::Code;

use crate::support::*;

crate::backend_tests!(
    create_get_and_caller_ids,
    initial_history_drops_the_leading_prompt,
    messages_round_trip_losslessly,
    export_create_export_is_identity,
    list_sessions_reports_real_figures,
    list_sessions_pages_newest_first,
    update_session_honours_the_mask,
    delete_session_cascades_and_frees_the_id,
    append_links_only_responses_to_the_call,
    append_rejects_bad_requests_and_writes_nothing,
    full_history_appends_only_what_is_new,
    export_options,
    export_spans_several_reads,
    max_messages_never_orphans_a_tool_result,
    list_messages_and_calls_page,
    health_and_reflection_answer,
);

async fn create_get_and_caller_ids(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;

    let made = client
        .create_session(pb::CreateSessionRequest {
            title: "t".into(),
            metadata: BTreeMap::from([("k".into(), "v".into())]),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(made.id.starts_with("ses_"), "{}", made.id);
    assert_eq!(made.revision, 1);
    assert!(made.create_time.is_some() && made.update_time == made.create_time);

    let got = client
        .get_session(pb::GetSessionRequest {
            session_id: made.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got, made);

    let chosen = create(&mut client, "my-session").await;
    assert_eq!(chosen.id, "my-session");
    let taken = client
        .create_session(pb::CreateSessionRequest {
            session_id: "my-session".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(taken.code(), Code::AlreadyExists);
    assert_eq!(
        error_details(&taken).0.as_deref(),
        Some("SESSION_ALREADY_EXISTS")
    );

    let bad = client
        .create_session(pb::CreateSessionRequest {
            session_id: "has spaces".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert_eq!(error_details(&bad).1.as_deref(), Some("session_id"));

    let missing = client
        .get_session(pb::GetSessionRequest {
            session_id: "nope".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    assert_eq!(
        error_details(&missing).0.as_deref(),
        Some("SESSION_NOT_FOUND")
    );

    let empty = client
        .get_session(pb::GetSessionRequest::default())
        .await
        .unwrap_err();
    assert_eq!(empty.code(), Code::InvalidArgument);
    assert_eq!(error_details(&empty).1.as_deref(), Some("session_id"));
    server.stop().await.unwrap();
}

async fn initial_history_drops_the_leading_prompt(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let session = client
        .create_session(pb::CreateSessionRequest {
            system_prompt: "Be brief.".into(),
            initial_history: vec![
                text(pb::Role::System, "Be brief."),
                user("hi"),
                assistant("hello"),
            ],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let listed = client
        .list_messages(pb::ListMessagesRequest {
            session_id: session.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let sequences: Vec<i64> = listed.messages.iter().map(|m| m.sequence).collect();
    assert_eq!(sequences, [0, 1]);
    assert_eq!(listed.messages[0].message, Some(user("hi")));
    assert!(
        listed
            .messages
            .iter()
            .all(|m| m.produced_by_call_id.is_empty())
    );
    assert!(listed.messages[0].id.starts_with("msg_"));

    // The next append continues after the rehydrated history.
    let appended = exchange(&mut client, &session.id, "q", "a").await;
    assert_eq!(appended.messages[0].sequence, 2);
    assert_eq!(appended.revision, 2);
    server.stop().await.unwrap();
}

/// A message using every field and block kind, with U+0000, non-BMP text
/// and JSON strings that are not valid JSON.
fn rich_message() -> pb::Message {
    let block = |b: Block| pb::ContentBlock { block: Some(b) };
    pb::Message {
        role: pb::Role::Assistant.into(),
        content: "nul:\u{0}: emoji 🦀 and \u{10FFFF} and \"quotes\" \\ backslash".into(),
        content_blocks: vec![
            block(Block::Text(pb::TextBlock {
                text: "a\u{0}b".into(),
                signature: String::new(),
            })),
            block(Block::Thinking(pb::ThinkingBlock {
                thinking: "let me think\u{0}".into(),
                signature: "sig+/==".into(),
            })),
            block(Block::RedactedThinking(pb::RedactedThinkingBlock {
                data: "opaque-encrypted".into(),
            })),
            block(Block::Image(pb::ImageBlock {
                media_type: "image/png".into(),
                url: "https://example.invalid/a.png".into(),
                data: vec![0, 159, 146, 150, 255],
            })),
            block(Block::ToolUse(pb::ToolUseBlock {
                id: "toolu_1".into(),
                name: "search".into(),
                input: "{\"q\": \"x\", broken".into(),
                signature: String::new(),
            })),
            block(Block::ToolResult(pb::ToolResultBlock {
                tool_use_id: "toolu_1".into(),
                content: "result\u{0}".into(),
                is_error: true,
            })),
            block(Block::Json(pb::JsonBlock {
                r#type: "server_tool_use".into(),
                json: "{ \"b\":1,  \"a\" : [1e400, \"\\u0000\"] }".into(),
            })),
        ],
        tool_calls: vec![pb::ToolCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: "{\"city\": \"Par".into(),
            signature: String::new(),
        }],
        tool_call_id: "x".into(),
        tool_error: true,
        name: "bot\u{0}".into(),
        metadata: BTreeMap::from([("k\u{0}".into(), "v\u{0}".into())]),
        incomplete: true,
    }
}

async fn messages_round_trip_losslessly(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let session = create(&mut client, "lossless").await;
    let sent = rich_message();
    let response = client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: session.id.clone(),
            messages: vec![user("go")],
            provider_call: Some(call("m", 1, 2, 3)),
            response_messages: vec![sent.clone()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.messages[1].message.as_ref(), Some(&sent));

    let exported = export(
        &mut client,
        pb::ExportHistoryRequest {
            session_id: session.id.clone(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(exported, vec![user("go"), sent.clone()]);

    let listed = client
        .list_messages(pb::ListMessagesRequest {
            session_id: session.id,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.messages[1].message.as_ref(), Some(&sent));
    server.stop().await.unwrap();
}

async fn export_create_export_is_identity(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let session = client
        .create_session(pb::CreateSessionRequest {
            system_prompt: "sys".into(),
            initial_history: vec![user("one"), rich_message()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    exchange(&mut client, &session.id, "two", "three").await;
    let request = |id: &str| pb::ExportHistoryRequest {
        session_id: id.to_owned(),
        include_system_prompt: true,
        ..Default::default()
    };
    let first = export(&mut client, request(&session.id)).await;
    assert_eq!(first[0], text(pb::Role::System, "sys"));
    assert_eq!(first.len(), 5);

    let copy = client
        .create_session(pb::CreateSessionRequest {
            system_prompt: "sys".into(),
            initial_history: first.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let second = export(&mut client, request(&copy.id)).await;
    assert_eq!(first, second);
    server.stop().await.unwrap();
}

async fn list_sessions_reports_real_figures(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let session = create(&mut client, "figures").await;
    exchange(&mut client, &session.id, "a", "b").await;
    client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: session.id.clone(),
            messages: vec![user("c")],
            provider_call: Some(pb::ProviderCall {
                provider: "anthropic".into(),
                model: "claude-x".into(),
                request_id: "gw-req-2".into(),
                prompt_tokens: 100,
                completion_tokens: 20,
                cost_micros_usd: 1500,
                ..Default::default()
            }),
            response_messages: vec![assistant("d"), assistant("e")],
            ..Default::default()
        })
        .await
        .unwrap();
    let listed = client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.sessions.len(), 1);
    assert!(listed.next_page_token.is_empty());
    let summary = &listed.sessions[0];
    assert_eq!(summary.message_count, 5);
    assert_eq!(summary.provider_call_count, 2);
    assert_eq!(summary.last_model, "claude-x");
    assert_eq!(summary.last_provider, "anthropic");
    assert_eq!(summary.last_cost_micros_usd, 1500);
    assert_eq!(summary.last_request_id, "gw-req-2");
    assert_eq!(summary.total_tokens, 15 + 120);
    assert_eq!(summary.total_cost_micros_usd, 42 + 1500);
    assert_eq!(summary.session.as_ref().unwrap().revision, 3);
    server.stop().await.unwrap();
}

async fn list_sessions_pages_newest_first(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    for i in 0..5 {
        let user = if i % 2 == 0 { "alice" } else { "bob" };
        client
            .create_session(pb::CreateSessionRequest {
                session_id: format!("s{i}"),
                user: user.into(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    // Touching s1 makes it the newest.
    exchange(&mut client, "s1", "q", "a").await;

    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_sessions(pb::ListSessionsRequest {
                page_size: 2,
                page_token: token.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.sessions.len() <= 2);
        seen.extend(page.sessions.into_iter().map(|s| s.session.unwrap().id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(seen, ["s1", "s4", "s3", "s2", "s0"]);

    let alice = client
        .list_sessions(pb::ListSessionsRequest {
            user: "alice".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<String> = alice
        .sessions
        .into_iter()
        .map(|s| s.session.unwrap().id)
        .collect();
    assert_eq!(ids, ["s4", "s2", "s0"]);

    let negative = client
        .list_sessions(pb::ListSessionsRequest {
            page_size: -1,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(negative.code(), Code::InvalidArgument);
    assert_eq!(error_details(&negative).1.as_deref(), Some("page_size"));

    let garbage = client
        .list_sessions(pb::ListSessionsRequest {
            page_token: "not-a-token".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(garbage.code(), Code::InvalidArgument);
    assert_eq!(error_details(&garbage).1.as_deref(), Some("page_token"));
    server.stop().await.unwrap();
}

async fn update_session_honours_the_mask(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let session = create(&mut client, "upd").await;
    let appended = exchange(&mut client, "upd", "q", "a").await;

    let updated = client
        .update_session(pb::UpdateSessionRequest {
            session: Some(pb::Session {
                id: "upd".into(),
                title: "new title".into(),
                system_prompt: "ignored: not in the mask".into(),
                summary_message_id: appended.messages[1].id.clone(),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["title".into(), "summary_message_id".into()],
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(updated.title, "new title");
    assert_eq!(updated.system_prompt, session.system_prompt);
    assert_eq!(updated.summary_message_id, appended.messages[1].id);
    assert_eq!(updated.revision, 3);
    let micros = |t: Option<prost_types::Timestamp>| {
        let t = t.unwrap();
        t.seconds * 1_000_000 + i64::from(t.nanos / 1000)
    };
    assert!(micros(updated.update_time) > micros(session.update_time));

    let from_summary = export(
        &mut client,
        pb::ExportHistoryRequest {
            session_id: "upd".into(),
            from_summary: true,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(from_summary, vec![assistant("a")]);

    let unknown_path = client
        .update_session(pb::UpdateSessionRequest {
            session: Some(pb::Session {
                id: "upd".into(),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["revision".into()],
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown_path.code(), Code::InvalidArgument);
    assert_eq!(
        error_details(&unknown_path).1.as_deref(),
        Some("update_mask")
    );

    let bad_summary = client
        .update_session(pb::UpdateSessionRequest {
            session: Some(pb::Session {
                id: "upd".into(),
                summary_message_id: "msg_nope".into(),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["summary_message_id".into()],
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(bad_summary.code(), Code::InvalidArgument);
    assert_eq!(
        error_details(&bad_summary).1.as_deref(),
        Some("session.summary_message_id")
    );
    // Rejected calls change no revision.
    let after = client
        .get_session(pb::GetSessionRequest {
            session_id: "upd".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(after.revision, 3);

    let missing = client
        .update_session(pb::UpdateSessionRequest {
            session: Some(pb::Session {
                id: "ghost".into(),
                ..Default::default()
            }),
            update_mask: None,
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    server.stop().await.unwrap();
}

async fn delete_session_cascades_and_frees_the_id(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "gone").await;
    exchange(&mut client, "gone", "q", "a").await;
    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: "gone".into(),
        })
        .await
        .unwrap();
    for status in [
        client
            .get_session(pb::GetSessionRequest {
                session_id: "gone".into(),
                ..Default::default()
            })
            .await
            .unwrap_err(),
        client
            .list_messages(pb::ListMessagesRequest {
                session_id: "gone".into(),
                ..Default::default()
            })
            .await
            .unwrap_err(),
        client
            .delete_session(pb::DeleteSessionRequest {
                session_id: "gone".into(),
            })
            .await
            .unwrap_err(),
    ] {
        assert_eq!(status.code(), Code::NotFound);
    }
    let listed = client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.sessions.is_empty());

    let reborn = create(&mut client, "gone").await;
    assert_eq!(reborn.revision, 1);
    let history = export(
        &mut client,
        pb::ExportHistoryRequest {
            session_id: "gone".into(),
            ..Default::default()
        },
    )
    .await;
    assert!(history.is_empty());
    let calls = client
        .list_provider_calls(pb::ListProviderCallsRequest {
            session_id: "gone".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(calls.provider_calls.is_empty());
    server.stop().await.unwrap();
}

async fn append_links_only_responses_to_the_call(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "link").await;
    let response = client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "link".into(),
            messages: vec![user("q1"), user("q2")],
            provider_call: Some(call("m", 7, 3, 9)),
            response_messages: vec![assistant("a1"), text(pb::Role::Tool, "t")],
            run_id: "run-1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let call = response.provider_call.unwrap();
    assert!(call.id.starts_with("call_"));
    assert_eq!(call.session_id, "link");
    assert_eq!(
        call.total_tokens, 10,
        "total is prompt + completion when sent as 0"
    );
    let sequences: Vec<i64> = response.messages.iter().map(|m| m.sequence).collect();
    assert_eq!(sequences, [0, 1, 2, 3]);
    let links: Vec<&str> = response
        .messages
        .iter()
        .map(|m| m.produced_by_call_id.as_str())
        .collect();
    assert_eq!(links, ["", "", call.id.as_str(), call.id.as_str()]);
    assert_eq!(response.next_sequence, 4);
    assert_eq!(response.revision, 2);

    // A call with no messages at all is a valid exchange (cost only).
    let cost_only = client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "link".into(),
            provider_call: Some(super::support::call("m", 1, 1, 1)),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(cost_only.messages.is_empty());
    assert_eq!(cost_only.next_sequence, 4);
    server.stop().await.unwrap();
}

async fn append_rejects_bad_requests_and_writes_nothing(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "strict").await;
    let base = || pb::AppendExchangeRequest {
        session_id: "strict".into(),
        ..Default::default()
    };
    let cases: Vec<(pb::AppendExchangeRequest, Code, &str)> = vec![
        (
            pb::AppendExchangeRequest {
                response_messages: vec![assistant("a")],
                ..base()
            },
            Code::InvalidArgument,
            "provider_call",
        ),
        (
            pb::AppendExchangeRequest {
                messages: vec![user("a")],
                full_history: vec![user("a")],
                ..base()
            },
            Code::InvalidArgument,
            "full_history",
        ),
        (base(), Code::InvalidArgument, "messages"),
        (
            pb::AppendExchangeRequest {
                messages: vec![user("ok"), pb::Message::default()],
                ..base()
            },
            Code::InvalidArgument,
            "messages[1].role",
        ),
        (
            pb::AppendExchangeRequest {
                messages: vec![pb::Message {
                    role: 99,
                    ..Default::default()
                }],
                ..base()
            },
            Code::InvalidArgument,
            "messages[0].role",
        ),
        (
            pb::AppendExchangeRequest {
                messages: vec![pb::Message {
                    role: pb::Role::User.into(),
                    content_blocks: vec![pb::ContentBlock { block: None }],
                    ..Default::default()
                }],
                ..base()
            },
            Code::InvalidArgument,
            "messages[0].content_blocks[0]",
        ),
        (
            pb::AppendExchangeRequest {
                messages: vec![user("a")],
                provider_call: Some(call("m", -1, 0, 0)),
                ..base()
            },
            Code::InvalidArgument,
            "provider_call.prompt_tokens",
        ),
        (
            pb::AppendExchangeRequest {
                session_id: String::new(),
                messages: vec![user("a")],
                ..Default::default()
            },
            Code::InvalidArgument,
            "session_id",
        ),
    ];
    for (request, code, field) in cases {
        let status = client.append_exchange(request).await.unwrap_err();
        assert_eq!(status.code(), code, "{field}: {status:?}");
        let (reason, named) = error_details(&status);
        assert_eq!(named.as_deref(), Some(field), "{status:?}");
        assert_eq!(reason.as_deref(), Some("INVALID_ARGUMENT"));
        assert!(status.message().contains(field), "{}", status.message());
    }
    let missing = client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "ghost".into(),
            messages: vec![user("a")],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);

    // Nothing was written by any of them.
    let session = client
        .get_session(pb::GetSessionRequest {
            session_id: "strict".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(session.revision, 1);
    let history = export(
        &mut client,
        pb::ExportHistoryRequest {
            session_id: "strict".into(),
            ..Default::default()
        },
    )
    .await;
    assert!(history.is_empty());
    // Empty content is allowed.
    exchange(&mut client, "strict", "", "").await;
    server.stop().await.unwrap();
}

async fn full_history_appends_only_what_is_new(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "sdk").await;
    let prompt = text(pb::Role::System, "You are terse.");
    let first = client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "sdk".into(),
            full_history: vec![prompt.clone(), user("q1")],
            provider_call: Some(call("m", 1, 1, 1)),
            response_messages: vec![assistant("a1")],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.messages.len(), 2);
    let second = client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "sdk".into(),
            full_history: vec![prompt.clone(), user("q1"), assistant("a1"), user("q2")],
            provider_call: Some(call("m", 1, 1, 1)),
            response_messages: vec![assistant("a2")],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let contents: Vec<String> = second
        .messages
        .iter()
        .map(|m| m.message.as_ref().unwrap().content.clone())
        .collect();
    assert_eq!(contents, ["q2", "a2"]);
    assert_eq!(second.messages[0].sequence, 2);

    // Diverging history: index counted in full_history as sent (prompt included).
    let diverged = client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "sdk".into(),
            full_history: vec![prompt.clone(), user("q1"), assistant("EDITED"), user("q3")],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(diverged.code(), Code::FailedPrecondition);
    let (reason, field) = error_details(&diverged);
    assert_eq!(reason.as_deref(), Some("HISTORY_MISMATCH"));
    assert_eq!(field.as_deref(), Some("full_history[2]"));

    // Shorter than what is stored, without the prompt.
    let shorter = client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "sdk".into(),
            full_history: vec![user("q1")],
            provider_call: Some(call("m", 1, 1, 1)),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(shorter.code(), Code::FailedPrecondition);
    assert_eq!(
        error_details(&shorter).1.as_deref(),
        Some("full_history[1]")
    );

    let session = client
        .get_session(pb::GetSessionRequest {
            session_id: "sdk".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(session.revision, 3, "rejected diffs write nothing");
    server.stop().await.unwrap();
}

/// Exports read the history a page (256 messages) at a time, the next
/// page while the last is sent: every length around a page boundary and
/// every start comes out whole and in order.
async fn export_spans_several_reads(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    for (id, len) in [("p255", 255), ("p256", 256), ("p257", 257), ("p700", 700)] {
        let texts: Vec<String> = (0..len).map(|i| format!("m{i}")).collect();
        let history: Vec<pb::Message> = texts.iter().map(|t| user(t)).collect();
        client
            .create_session(pb::CreateSessionRequest {
                session_id: id.into(),
                initial_history: history.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        let request = |after: Option<i64>, max: i64| pb::ExportHistoryRequest {
            session_id: id.into(),
            after_sequence: after,
            max_messages: max,
            ..Default::default()
        };
        let contents = |messages: Vec<pb::Message>| -> Vec<String> {
            messages.into_iter().map(|m| m.content).collect()
        };
        let all = contents(export(&mut client, request(None, 0)).await);
        assert_eq!(all, texts, "{id}");
        for after in [0, 254, 255, 256, 511] {
            let start = usize::try_from(after + 1).unwrap().min(len);
            let got = contents(export(&mut client, request(Some(after), 0)).await);
            assert_eq!(got, texts[start..], "{id} after {after}");
        }
        let recent = contents(export(&mut client, request(None, 300)).await);
        assert_eq!(recent, texts[len.saturating_sub(300)..], "{id} last 300");
    }
    server.stop().await.unwrap();
}

async fn export_options(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "exp").await;
    for i in 0..3 {
        exchange(&mut client, "exp", &format!("q{i}"), &format!("a{i}")).await;
    }
    let request = |f: fn(&mut pb::ExportHistoryRequest)| {
        let mut r = pb::ExportHistoryRequest {
            session_id: "exp".into(),
            ..Default::default()
        };
        f(&mut r);
        r
    };
    let contents = |messages: Vec<pb::Message>| -> Vec<String> {
        messages.into_iter().map(|m| m.content).collect()
    };

    let all = export(&mut client, request(|_| {})).await;
    assert_eq!(contents(all), ["q0", "a0", "q1", "a1", "q2", "a2"]);

    let with_prompt = export(&mut client, request(|r| r.include_system_prompt = true)).await;
    assert_eq!(with_prompt.len(), 7);
    assert_eq!(with_prompt[0], text(pb::Role::System, "You are terse."));
    assert_eq!(
        with_prompt
            .iter()
            .filter(|m| m.role == i32::from(pb::Role::System))
            .count(),
        1
    );

    let after = export(
        &mut client,
        request(|r| {
            r.after_sequence = Some(3);
            r.include_system_prompt = true;
        }),
    )
    .await;
    assert_eq!(
        contents(after),
        ["q2", "a2"],
        "no prompt with after_sequence"
    );

    let from_zero = export(&mut client, request(|r| r.after_sequence = Some(0))).await;
    assert_eq!(from_zero.len(), 5, "after_sequence 0 skips sequence 0");

    let window = export(
        &mut client,
        request(|r| {
            r.max_messages = 3;
            r.include_system_prompt = true;
        }),
    )
    .await;
    assert_eq!(
        contents(window),
        ["You are terse.", "a1", "q2", "a2"],
        "the prompt does not count"
    );

    let missing = client
        .export_history(pb::ExportHistoryRequest {
            session_id: "ghost".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    let negative = client
        .export_history(request(|r| r.max_messages = -1))
        .await
        .unwrap_err();
    assert_eq!(negative.code(), Code::InvalidArgument);
    assert_eq!(error_details(&negative).1.as_deref(), Some("max_messages"));
    server.stop().await.unwrap();
}

async fn max_messages_never_orphans_a_tool_result(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "tools").await;
    let asks = pb::Message {
        tool_calls: vec![
            pb::ToolCall {
                id: "c1".into(),
                name: "f".into(),
                arguments: "{}".into(),
                signature: String::new(),
            },
            pb::ToolCall {
                id: "c2".into(),
                name: "g".into(),
                arguments: "{}".into(),
                signature: String::new(),
            },
        ],
        ..assistant("")
    };
    let result = |id: &str| pb::Message {
        tool_call_id: id.into(),
        ..text(pb::Role::Tool, &format!("result {id}"))
    };
    client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "tools".into(),
            messages: vec![user("q")],
            provider_call: Some(call("m", 1, 1, 1)),
            response_messages: vec![asks.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
    client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "tools".into(),
            messages: vec![result("c1"), result("c2")],
            provider_call: Some(call("m", 1, 1, 1)),
            response_messages: vec![assistant("done")],
            ..Default::default()
        })
        .await
        .unwrap();
    // History: q, asks, result c1, result c2, done. The last 2 start on a
    // tool result: widen back to the assistant holding its call.
    let window = export(
        &mut client,
        pb::ExportHistoryRequest {
            session_id: "tools".into(),
            max_messages: 2,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        window,
        vec![asks, result("c1"), result("c2"), assistant("done")]
    );
    server.stop().await.unwrap();
}

async fn list_messages_and_calls_page(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "pages").await;
    for i in 0..5 {
        exchange(&mut client, "pages", &format!("q{i}"), &format!("a{i}")).await;
    }
    let mut sequences = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_messages(pb::ListMessagesRequest {
                session_id: "pages".into(),
                page_size: 3,
                page_token: token.clone(),
                after_sequence: Some(1),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        sequences.extend(page.messages.iter().map(|m| m.sequence));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(sequences, (2..10).collect::<Vec<_>>());

    let mut calls = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_provider_calls(pb::ListProviderCallsRequest {
                session_id: "pages".into(),
                page_size: 2,
                page_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        calls.extend(page.provider_calls);
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(calls.len(), 5);
    assert!(
        calls
            .iter()
            .all(|c| c.session_id == "pages" && c.id.starts_with("call_"))
    );

    // A token from another session is refused.
    create(&mut client, "other").await;
    let first = client
        .list_messages(pb::ListMessagesRequest {
            session_id: "pages".into(),
            page_size: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let foreign = client
        .list_messages(pb::ListMessagesRequest {
            session_id: "other".into(),
            page_token: first.next_page_token,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(foreign.code(), Code::InvalidArgument);
    let oversized = client
        .list_messages(pb::ListMessagesRequest {
            session_id: "pages".into(),
            page_size: 100_000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        oversized.messages.len(),
        10,
        "oversized pages are clamped, not refused"
    );
    server.stop().await.unwrap();
}

async fn health_and_reflection_answer(backend: Backend) {
    let server = TestServer::start(backend).await;
    let channel = tonic::transport::Channel::from_shared(server.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let answer = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "sessionstore.v1.SessionStore".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        answer.status,
        i32::from(tonic_health::pb::health_check_response::ServingStatus::Serving)
    );

    // Both reflection versions list the service, so grpcurl works without protos.
    use tonic_reflection::pb::{v1, v1alpha};
    let mut v1_client = v1::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut answers = v1_client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().unwrap();
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        answer.message_response
    else {
        panic!("unexpected reflection answer {answer:?}");
    };
    assert!(
        list.service
            .iter()
            .any(|s| s.name == "sessionstore.v1.SessionStore")
    );

    let mut alpha = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::FileContainingSymbol(
                "sessionstore.v1.SessionStore".into(),
            ),
        ),
    };
    let mut answers = alpha
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().unwrap();
    assert!(matches!(
        answer.message_response,
        Some(v1alpha::server_reflection_response::MessageResponse::FileDescriptorResponse(_))
    ));
    server.stop().await.unwrap();
}
