//! Ids, idempotency keys, state, forks' targets, listings, search and
//! watches are scoped to the tenant: two tenants may each own the same id.

use super::*;

crate::backend_tests!(ids_and_idempotency_keys_are_per_tenant);

/// Two tenants may each own `ses_x`; idempotency keys, forks' target ids,
/// state and watches are scoped to the tenant.
async fn ids_and_idempotency_keys_are_per_tenant(backend: Backend) {
    let (server, _tokens) = start(backend).await;
    let mut client = server.client().await;

    // Both create ses_x: two sessions.
    let acme_x = create(&mut client, OWNER, "ses_x", "acme x").await;
    let globex_x = create(&mut client, INTRUDER, "ses_x", "globex x").await;
    assert_eq!((acme_x.id.as_str(), acme_x.revision), ("ses_x", 1));
    assert_eq!((globex_x.id.as_str(), globex_x.revision), ("ses_x", 1));
    assert_eq!(
        get(&mut client, OWNER, "ses_x").await.unwrap().title,
        "acme x"
    );
    assert_eq!(
        get(&mut client, INTRUDER, "ses_x").await.unwrap().title,
        "globex x"
    );
    // Taken within a tenant, still.
    let taken = client
        .create_session(authed(
            pb::CreateSessionRequest {
                session_id: "ses_x".into(),
                ..Default::default()
            },
            INTRUDER,
        ))
        .await
        .unwrap_err();
    assert_eq!(taken.code(), Code::AlreadyExists, "{taken:?}");
    let acme_only = create(&mut client, OWNER, "ses_acme_only", "acme only").await;

    // The same request, key included, from both tenants: two writes.
    let request = pb::AppendExchangeRequest {
        session_id: "ses_x".into(),
        messages: vec![user("same question")],
        provider_call: Some(call("gpt-same", 3, 4, 5)),
        response_messages: vec![assistant("same answer")],
        request_id: "req-same".into(),
        ..Default::default()
    };
    let acme_first = client
        .append_exchange(authed(request.clone(), OWNER))
        .await
        .unwrap()
        .into_inner();
    let globex_first = client
        .append_exchange(authed(request.clone(), INTRUDER))
        .await
        .expect("another tenant's idempotency key must not apply")
        .into_inner();
    assert_eq!(acme_first.revision, 2);
    assert_eq!(globex_first.revision, 2);
    assert_eq!(globex_first.messages.len(), 2);
    for (a, g) in acme_first.messages.iter().zip(&globex_first.messages) {
        assert_ne!(a.id, g.id, "globex got acme's stored message");
        assert_eq!(g.session_id, "ses_x");
    }
    let (acme_call, globex_call) = (
        acme_first.provider_call.clone().unwrap(),
        globex_first.provider_call.clone().unwrap(),
    );
    assert_ne!(acme_call.id, globex_call.id);
    assert_eq!(
        messages_of(&mut client, OWNER, "ses_x").await,
        acme_first.messages
    );
    assert_eq!(
        messages_of(&mut client, INTRUDER, "ses_x").await,
        globex_first.messages
    );
    // Each tenant's retry returns its own first result.
    let acme_retry = client
        .append_exchange(authed(request.clone(), OWNER))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(acme_retry, acme_first);
    let globex_retry = client
        .append_exchange(authed(request.clone(), INTRUDER))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(globex_retry, globex_first);
    // And the key is real within a tenant.
    let reused = client
        .append_exchange(authed(
            pb::AppendExchangeRequest {
                messages: vec![user("a different question")],
                ..request.clone()
            },
            INTRUDER,
        ))
        .await
        .unwrap_err();
    assert_eq!(reused.code(), Code::AlreadyExists, "{reused:?}");

    // State is per tenant: globex's "must not exist yet" holds for its own ses_x.
    set_state(&mut client, OWNER, "ses_x", "k", "acme").await;
    let globex_state = client
        .set_state(authed(
            pb::SetStateRequest {
                session_id: "ses_x".into(),
                key: "k".into(),
                value: "globex".into(),
                expected_version: Some(0),
                ..Default::default()
            },
            INTRUDER,
        ))
        .await
        .expect("acme's key is not globex's")
        .into_inner();
    assert_eq!(globex_state.value, "globex");
    let acme_state = client
        .get_state(authed(
            pb::GetStateRequest {
                session_id: "ses_x".into(),
                key: "k".into(),
                ..Default::default()
            },
            OWNER,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(acme_state.value, "acme");

    // Forking into an id another tenant holds succeeds; into one's own, it is taken.
    let acme_only_before = snapshot(&mut client, OWNER, "ses_acme_only").await;
    let fork = client
        .fork_session(authed(
            pb::ForkSessionRequest {
                session_id: "ses_x".into(),
                at_sequence: 1,
                new_session_id: "ses_acme_only".into(),
            },
            INTRUDER,
        ))
        .await
        .expect("ids are unique per tenant: forking into another tenant's id works")
        .into_inner();
    assert_eq!(fork.id, "ses_acme_only");
    assert_eq!(fork.title, "globex x");
    let forked = messages_of(&mut client, INTRUDER, "ses_acme_only").await;
    assert_eq!(forked.len(), 2);
    assert_eq!(
        forked.iter().map(|m| &m.message).collect::<Vec<_>>(),
        globex_first
            .messages
            .iter()
            .map(|m| &m.message)
            .collect::<Vec<_>>()
    );
    let taken = client
        .fork_session(authed(
            pb::ForkSessionRequest {
                session_id: "ses_acme_only".into(),
                at_sequence: -1,
                new_session_id: "ses_x".into(),
            },
            INTRUDER,
        ))
        .await
        .unwrap_err();
    assert_eq!(taken.code(), Code::AlreadyExists, "{taken:?}");
    assert_eq!(
        snapshot(&mut client, OWNER, "ses_acme_only").await,
        acme_only_before,
        "globex's fork touched acme's session of the same id"
    );
    assert_eq!(acme_only_before.session.revision, acme_only.revision);

    // Listings and search: each tenant sees its own.
    let acme_listed = sessions_of(&mut client, OWNER, "").await;
    assert_eq!(ids(&acme_listed), ["ses_acme_only", "ses_x"]);
    for summary in &acme_listed {
        let session = summary.session.as_ref().unwrap();
        assert!(session.title.starts_with("acme"), "{summary:?}");
    }
    let globex_listed = sessions_of(&mut client, INTRUDER, "alice").await;
    assert_eq!(ids(&globex_listed), ["ses_acme_only", "ses_x"]);
    for summary in &globex_listed {
        let session = summary.session.as_ref().unwrap();
        assert!(session.title.starts_with("globex"), "{summary:?}");
        assert_eq!(summary.message_count, 2, "{summary:?}");
    }
    client
        .append_exchange(authed(
            pb::AppendExchangeRequest {
                session_id: "ses_x".into(),
                messages: vec![user(&format!("acme alone knows {SECRET}"))],
                ..Default::default()
            },
            OWNER,
        ))
        .await
        .unwrap();
    assert!(search(&mut client, INTRUDER, SECRET, "").await.is_empty());
    let hits = search(&mut client, OWNER, SECRET, "").await;
    assert_eq!(hits.len(), 1, "{hits:?}");
    let same = search(&mut client, INTRUDER, "same question", "").await;
    assert_eq!(same.len(), 2, "globex's ses_x and its fork: {same:?}");
    for hit in &same {
        assert!(
            globex_first.messages.iter().any(|m| m.id == hit.message_id)
                || forked.iter().any(|m| m.id == hit.message_id),
            "globex found a message that is not its own: {hit:?}"
        );
    }

    // Watches: acme's watcher of ses_x sees none of globex's ses_x changes,
    // not even its deletion.
    let head = get(&mut client, OWNER, "ses_x").await.unwrap().revision;
    let mut live = watch(&mut client, OWNER, "ses_x", head).await;
    assert_eq!(event_kind(&next_change(&mut live).await), "caught_up");
    set_state(&mut client, INTRUDER, "ses_x", "k", "globex again").await;
    client
        .publish_delta(authed(
            pb::PublishDeltaRequest {
                session_id: "ses_x".into(),
                run_id: "run-globex".into(),
                index: 0,
                delta: Some(pb::publish_delta_request::Delta::Text("globex".into())),
            },
            INTRUDER,
        ))
        .await
        .unwrap();
    client
        .delete_session(authed(
            pb::DeleteSessionRequest {
                session_id: "ses_x".into(),
            },
            INTRUDER,
        ))
        .await
        .unwrap();
    let renamed = client
        .update_session(authed(
            pb::UpdateSessionRequest {
                session: Some(pb::Session {
                    id: "ses_x".into(),
                    title: "acme x, renamed".into(),
                    ..Default::default()
                }),
                update_mask: Some(prost_types::FieldMask {
                    paths: vec!["title".into()],
                }),
            },
            OWNER,
        ))
        .await
        .expect("globex deleting its ses_x leaves acme's")
        .into_inner();
    let event = next_change(&mut live).await;
    assert_eq!(event_kind(&event), "session_updated", "{event:?}");
    assert_eq!(event.revision, renamed.revision);
    assert_eq!(renamed.revision, head + 1);
    assert_eq!(
        get(&mut client, INTRUDER, "ses_x")
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    assert_eq!(messages_of(&mut client, OWNER, "ses_x").await.len(), 3);

    // With ses_x gone, globex may create it again, empty; acme's stays.
    let again = create(&mut client, INTRUDER, "ses_x", "globex x again").await;
    assert_eq!(again.revision, 1);
    assert!(messages_of(&mut client, INTRUDER, "ses_x").await.is_empty());
    assert_eq!(
        get(&mut client, OWNER, "ses_x").await.unwrap().title,
        "acme x, renamed"
    );
    drop(live);
    server.stop().await.unwrap();
}
