//! Usage that matches the bill: the billing buckets on every path, and
//! SummarizeUsage's sums, groups, filters and pages.

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use sessionstore_client::v1::session_event::Event;
use tonic::Code;
use tonic::transport::Channel;

use crate::support::{Backend, TestServer, assistant, create_owned, next_change, user};

crate::backend_tests!(
    buckets_are_kept_on_every_path,
    bucket_figures_are_checked,
    usage_sums_group_filter_and_page,
);

type Client = SessionStoreClient<Channel>;

const USAGE_JSON: &str = r#"{"input_tokens":12,"cache_read_input_tokens":100,"cache_creation_input_tokens":30,"output_tokens":50}"#;

/// An Anthropic-shaped call, normalised: 12 + 100 + 30 input tokens.
fn billed_call() -> pb::ProviderCall {
    pb::ProviderCall {
        provider: "anthropic".into(),
        model: "claude-sonnet".into(),
        prompt_tokens: 142,
        completion_tokens: 50,
        cached_input_tokens: 100,
        cache_creation_input_tokens: 30,
        reasoning_tokens: 20,
        cost_micros_usd: 900,
        usage_json: USAGE_JSON.into(),
        duration: Some(prost_types::Duration {
            seconds: 1,
            nanos: 250_000_000,
        }),
        ..Default::default()
    }
}

fn call(provider: &str, model: &str, prompt: i64, completion: i64, cost: i64) -> pb::ProviderCall {
    pb::ProviderCall {
        provider: provider.into(),
        model: model.into(),
        prompt_tokens: prompt,
        completion_tokens: completion,
        cached_input_tokens: prompt / 2,
        reasoning_tokens: completion / 5,
        cost_micros_usd: cost,
        ..Default::default()
    }
}

fn exchange(id: &str, call: pb::ProviderCall, request_id: &str) -> pb::AppendExchangeRequest {
    pb::AppendExchangeRequest {
        session_id: id.into(),
        messages: vec![user("q")],
        provider_call: Some(call),
        response_messages: vec![assistant("a")],
        request_id: request_id.into(),
        ..Default::default()
    }
}

/// The figures a caller sent, as the server keeps them (total filled in).
fn assert_billed(stored: &pb::ProviderCall) {
    let sent = billed_call();
    assert_eq!(stored.prompt_tokens, sent.prompt_tokens);
    assert_eq!(stored.completion_tokens, sent.completion_tokens);
    assert_eq!(stored.total_tokens, 192);
    assert_eq!(stored.cached_input_tokens, 100);
    assert_eq!(stored.cache_creation_input_tokens, 30);
    assert_eq!(stored.reasoning_tokens, 20);
    assert_eq!(stored.usage_json, USAGE_JSON);
    assert_eq!(stored.duration, sent.duration);
}

async fn buckets_are_kept_on_every_path(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create_owned(&mut client, "ses_bill", "alice").await;
    let mut watch = client
        .watch_session(pb::WatchSessionRequest {
            session_id: "ses_bill".into(),
            after_revision: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next_change(&mut watch).await.kind(), "caught_up");
    let stored = client
        .append_exchange(exchange("ses_bill", billed_call(), "req-1"))
        .await
        .unwrap()
        .into_inner();
    assert_billed(stored.provider_call.as_ref().unwrap());
    // A retry answers the same call, and counts once.
    let again = client
        .append_exchange(exchange("ses_bill", billed_call(), "req-1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.provider_call, stored.provider_call);
    match next_change(&mut watch).await.event {
        Some(Event::ExchangeAppended(appended)) => {
            assert_billed(appended.provider_call.as_ref().unwrap());
        }
        other => panic!("expected exchange_appended, got {other:?}"),
    }
    let listed = client
        .list_provider_calls(pb::ListProviderCallsRequest {
            session_id: "ses_bill".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.provider_calls.len(), 1);
    assert_billed(&listed.provider_calls[0]);
    // A fork keeps no provider calls.
    client
        .fork_session(pb::ForkSessionRequest {
            session_id: "ses_bill".into(),
            at_sequence: 1,
            new_session_id: "ses_bill_fork".into(),
        })
        .await
        .unwrap();
    let forked = client
        .list_provider_calls(pb::ListProviderCallsRequest {
            session_id: "ses_bill_fork".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(forked.provider_calls.is_empty());
    let total = summarize(&mut client, pb::SummarizeUsageRequest::default()).await;
    assert_eq!(total.rows.len(), 1);
    let row = &total.rows[0];
    assert_eq!(
        (row.calls, row.prompt_tokens, row.cached_input_tokens),
        (1, 142, 100)
    );
    server.stop().await.unwrap();
}

async fn bucket_figures_are_checked(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create_owned(&mut client, "ses_bad", "").await;
    let cases: Vec<(pb::ProviderCall, &str)> = vec![
        (
            pb::ProviderCall {
                reasoning_tokens: -1,
                ..billed_call()
            },
            "provider_call.reasoning_tokens",
        ),
        (
            pb::ProviderCall {
                prompt_tokens: 100,
                ..billed_call()
            },
            "provider_call.prompt_tokens",
        ),
        (
            pb::ProviderCall {
                completion_tokens: 10,
                ..billed_call()
            },
            "provider_call.completion_tokens",
        ),
        (
            pb::ProviderCall {
                duration: Some(prost_types::Duration {
                    seconds: -1,
                    nanos: 0,
                }),
                ..billed_call()
            },
            "provider_call.duration",
        ),
        (
            pb::ProviderCall {
                usage_json: "x".repeat(70_000),
                ..billed_call()
            },
            "provider_call.usage_json",
        ),
    ];
    for (call, field) in cases {
        let status = client
            .append_exchange(exchange("ses_bad", call, ""))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().starts_with(field), "{field}: {status:?}");
    }
    let session = client
        .get_session(pb::GetSessionRequest {
            session_id: "ses_bad".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(session.revision, 1, "a refused call writes nothing");
    server.stop().await.unwrap();
}

async fn summarize(
    client: &mut Client,
    request: pb::SummarizeUsageRequest,
) -> pb::SummarizeUsageResponse {
    client
        .summarize_usage(request)
        .await
        .unwrap_or_else(|status| panic!("summarize usage: {status:?}"))
        .into_inner()
}

/// Every row of a grouping, following page tokens with `page_size` rows a page.
async fn all_rows(
    client: &mut Client,
    first: pb::SummarizeUsageRequest,
) -> (Vec<pb::UsageRow>, usize) {
    let mut request = first;
    let (mut rows, mut pages) = (Vec::new(), 0);
    loop {
        let page = summarize(client, request.clone()).await;
        pages += 1;
        rows.extend(page.rows);
        if page.next_page_token.is_empty() {
            return (rows, pages);
        }
        request.page_token = page.next_page_token;
    }
}

fn figures(row: &pb::UsageRow) -> (&str, i64, i64, i64, i64, i64, i64, i64) {
    (
        row.key.as_str(),
        row.calls,
        row.prompt_tokens,
        row.completion_tokens,
        row.cached_input_tokens,
        row.reasoning_tokens,
        row.total_tokens,
        row.cost_micros_usd,
    )
}

async fn usage_sums_group_filter_and_page(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let started = std::time::SystemTime::now();
    create_owned(&mut client, "ses_a1", "alice").await;
    create_owned(&mut client, "ses_a2", "alice").await;
    create_owned(&mut client, "ses_b1", "bob").await;
    create_owned(&mut client, "ses_gone", "bob").await;
    for (id, call) in [
        ("ses_a1", call("openai", "gpt-4o", 100, 10, 50)),
        ("ses_a1", call("openai", "gpt-4o", 200, 20, 70)),
        ("ses_a2", call("anthropic", "claude", 1000, 100, 400)),
        ("ses_b1", call("openai", "gpt-4o", 10, 5, 3)),
        ("ses_gone", call("openai", "gpt-4o", 7, 7, 7)),
    ] {
        client
            .append_exchange(exchange(id, call, ""))
            .await
            .unwrap();
    }
    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: "ses_gone".into(),
        })
        .await
        .unwrap();

    // Grouped by model, one row a page: sums computed by hand.
    let by_model = pb::SummarizeUsageRequest {
        group_by: pb::UsageGroupBy::Model.into(),
        page_size: 1,
        ..Default::default()
    };
    let (rows, pages) = all_rows(&mut client, by_model).await;
    assert_eq!(pages, 2);
    assert_eq!(
        rows.iter().map(figures).collect::<Vec<_>>(),
        [
            ("anthropic/claude", 1, 1000, 100, 500, 20, 1100, 400),
            ("openai/gpt-4o", 3, 310, 35, 155, 7, 345, 123),
        ]
    );
    // By user, by session, in total, and for one user or session.
    let grouped = |group: pb::UsageGroupBy| pb::SummarizeUsageRequest {
        group_by: group.into(),
        ..Default::default()
    };
    let (rows, _) = all_rows(&mut client, grouped(pb::UsageGroupBy::User)).await;
    let keys: Vec<(&str, i64)> = rows
        .iter()
        .map(|r| (r.key.as_str(), r.cost_micros_usd))
        .collect();
    assert_eq!(keys, [("alice", 520), ("bob", 3)]);
    let (rows, _) = all_rows(&mut client, grouped(pb::UsageGroupBy::Session)).await;
    let keys: Vec<(&str, i64)> = rows.iter().map(|r| (r.key.as_str(), r.calls)).collect();
    assert_eq!(keys, [("ses_a1", 2), ("ses_a2", 1), ("ses_b1", 1)]);
    let total = summarize(&mut client, pb::SummarizeUsageRequest::default()).await;
    assert_eq!(
        figures(&total.rows[0]),
        ("", 4, 1310, 135, 655, 27, 1445, 523)
    );
    let alice_by_model = pb::SummarizeUsageRequest {
        user: "alice".into(),
        ..grouped(pb::UsageGroupBy::Model)
    };
    let (rows, _) = all_rows(&mut client, alice_by_model).await;
    assert_eq!(
        rows.iter()
            .map(|r| (r.key.as_str(), r.calls))
            .collect::<Vec<_>>(),
        [("anthropic/claude", 1), ("openai/gpt-4o", 2)]
    );
    let one_session = summarize(
        &mut client,
        pb::SummarizeUsageRequest {
            session_id: "ses_a1".into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(figures(&one_session.rows[0]).1, 2);

    // By UTC day, within a time range; an empty range sums nothing.
    let since: prost_types::Timestamp = started.into();
    let (rows, _) = all_rows(
        &mut client,
        pb::SummarizeUsageRequest {
            start_time: Some(since),
            ..grouped(pb::UsageGroupBy::Day)
        },
    )
    .await;
    let seconds = started
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let today =
        sessionstore_server::domain::usage::date_of_day(i64::try_from(seconds / 86_400).unwrap());
    assert!(
        rows.iter().all(|r| r.key >= today) && rows.iter().map(|r| r.calls).sum::<i64>() == 4,
        "{rows:?}"
    );
    let before = pb::SummarizeUsageRequest {
        end_time: Some(since),
        ..Default::default()
    };
    assert_eq!(figures(&summarize(&mut client, before).await.rows[0]).1, 0);

    // Refusals name their field.
    for (request, code, field) in [
        (
            pb::SummarizeUsageRequest {
                session_id: "ses_gone".into(),
                ..Default::default()
            },
            Code::NotFound,
            "ses_gone",
        ),
        (
            pb::SummarizeUsageRequest {
                group_by: 99,
                ..Default::default()
            },
            Code::InvalidArgument,
            "group_by",
        ),
        (
            pb::SummarizeUsageRequest {
                start_time: Some(prost_types::Timestamp {
                    seconds: 10,
                    nanos: 0,
                }),
                end_time: Some(prost_types::Timestamp {
                    seconds: 5,
                    nanos: 0,
                }),
                ..Default::default()
            },
            Code::InvalidArgument,
            "end_time",
        ),
        (
            pb::SummarizeUsageRequest {
                page_token: summarize(
                    &mut client,
                    pb::SummarizeUsageRequest {
                        page_size: 1,
                        ..grouped(pb::UsageGroupBy::Model)
                    },
                )
                .await
                .next_page_token,
                ..grouped(pb::UsageGroupBy::User)
            },
            Code::InvalidArgument,
            "page_token",
        ),
    ] {
        let status = client.summarize_usage(request).await.unwrap_err();
        assert_eq!(status.code(), code, "{status:?}");
        assert!(status.message().contains(field), "{field}: {status:?}");
    }
    server.stop().await.unwrap();
}
