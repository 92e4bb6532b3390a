//! AppendExchange on another tenant's session, every way in: plain, with
//! the owner's exact request and idempotency key, with the owner's key and
//! another body, with the right or a stale expected sequence, as the
//! lease's run, and as a `full_history` that extends or diverges from the
//! owner's.

use super::*;

crate::backend_tests!(another_tenants_session_is_unknown_to_appends);

/// The owner's full history as an SDK would resend it.
async fn owner_history(client: &mut Client) -> Vec<pb::Message> {
    let history: Vec<pb::Message> = messages_of(client, OWNER, SHARED)
        .await
        .into_iter()
        .filter_map(|m| m.message)
        .collect();
    assert_eq!(history.len(), 4);
    history
}

async fn another_tenants_session_is_unknown_to_appends(backend: Backend) {
    let mut scene = Scene::set_up(backend).await;
    let owner_request = scene.owner_request.clone();
    let owner_next_sequence = scene.owner_next_sequence;
    let client = &mut scene.client;
    let owner_history = owner_history(client).await;

    probe!(client, "AppendExchange", append_exchange, |id| {
        pb::AppendExchangeRequest {
            session_id: id.to_owned(),
            messages: vec![user("globex was here")],
            ..Default::default()
        }
    });
    probe!(
        client,
        "AppendExchange (the owner's exact request and request_id)",
        append_exchange,
        |id| pb::AppendExchangeRequest {
            session_id: id.to_owned(),
            ..owner_request.clone()
        }
    );
    probe!(
        client,
        "AppendExchange (the owner's request_id, another body)",
        append_exchange,
        |id| pb::AppendExchangeRequest {
            session_id: id.to_owned(),
            messages: vec![user("globex was here")],
            request_id: OWNER_KEY.into(),
            ..Default::default()
        }
    );
    probe!(
        client,
        "AppendExchange (right expected_next_sequence, the lease's run)",
        append_exchange,
        |id| pb::AppendExchangeRequest {
            session_id: id.to_owned(),
            messages: vec![user("globex was here")],
            provider_call: Some(call("gpt-globex", 1, 1, 1)),
            response_messages: vec![assistant("hi globex")],
            expected_next_sequence: Some(owner_next_sequence),
            run_id: RUN.into(),
            ..Default::default()
        }
    );
    probe!(
        client,
        "AppendExchange (stale expected_next_sequence)",
        append_exchange,
        |id| pb::AppendExchangeRequest {
            session_id: id.to_owned(),
            messages: vec![user("globex was here")],
            expected_next_sequence: Some(0),
            ..Default::default()
        }
    );
    probe!(
        client,
        "AppendExchange (full_history extending the owner's)",
        append_exchange,
        |id| pb::AppendExchangeRequest {
            session_id: id.to_owned(),
            full_history: owner_history
                .iter()
                .cloned()
                .chain([user("globex was here")])
                .collect(),
            run_id: RUN.into(),
            ..Default::default()
        }
    );
    probe!(
        client,
        "AppendExchange (full_history diverging from the owner's)",
        append_exchange,
        |id| pb::AppendExchangeRequest {
            session_id: id.to_owned(),
            full_history: vec![user("something else entirely")],
            run_id: RUN.into(),
            ..Default::default()
        }
    );

    scene.assert_untouched().await;

    // The owner's idempotency key is still the owner's: its retry is the
    // first answer again.
    let retried = scene
        .client
        .append_exchange(authed(owner_request, OWNER))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(retried, scene.owner_response);
    scene.stop().await;
}
