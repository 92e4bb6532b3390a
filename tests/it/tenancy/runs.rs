//! PublishDelta, DiscardRun, BeginRun and EndRun on another tenant's
//! session, as the lease's run or another; the lease stays the owner's.

use super::*;

crate::backend_tests!(another_tenants_session_is_unknown_to_runs_and_deltas);

async fn another_tenants_session_is_unknown_to_runs_and_deltas(backend: Backend) {
    let mut scene = Scene::set_up(backend).await;
    let client = &mut scene.client;

    probe!(
        client,
        "PublishDelta (the lease's run)",
        publish_delta,
        |id| pb::PublishDeltaRequest {
            session_id: id.to_owned(),
            run_id: RUN.into(),
            index: 0,
            delta: Some(pb::publish_delta_request::Delta::Text(
                "globex delta".into()
            )),
        }
    );
    probe!(client, "PublishDelta (another run)", publish_delta, |id| {
        pb::PublishDeltaRequest {
            session_id: id.to_owned(),
            run_id: "run-globex".into(),
            index: 0,
            delta: Some(pb::publish_delta_request::Delta::Text(
                "globex delta".into(),
            )),
        }
    });
    probe!(client, "DiscardRun", discard_run, |id| {
        pb::DiscardRunRequest {
            session_id: id.to_owned(),
            run_id: RUN.into(),
        }
    });
    probe!(client, "BeginRun (another run)", begin_run, |id| {
        pb::BeginRunRequest {
            session_id: id.to_owned(),
            run_id: "run-globex".into(),
            lease: Some(lease(60)),
        }
    });
    probe!(
        client,
        "BeginRun (renewing the lease's run)",
        begin_run,
        |id| {
            pb::BeginRunRequest {
                session_id: id.to_owned(),
                run_id: RUN.into(),
                lease: Some(lease(1)),
            }
        }
    );
    probe!(client, "EndRun (the lease's run)", end_run, |id| {
        pb::EndRunRequest {
            session_id: id.to_owned(),
            run_id: RUN.into(),
            ..Default::default()
        }
    });
    probe!(client, "EndRun (a run without a lease)", end_run, |id| {
        pb::EndRunRequest {
            session_id: id.to_owned(),
            run_id: "run-globex".into(),
            ..Default::default()
        }
    });

    scene.assert_untouched().await;

    // The lease is still held by the owner's run: another writer is kept
    // off, and the owner's run ends it as the next revision.
    let client = &mut scene.client;
    let busy = client
        .append_exchange(authed(
            pb::AppendExchangeRequest {
                session_id: SHARED.into(),
                messages: vec![user("no run id")],
                ..Default::default()
            },
            OWNER,
        ))
        .await
        .unwrap_err();
    assert_eq!(busy.code(), Code::FailedPrecondition, "{busy:?}");
    let ended = client
        .end_run(authed(
            pb::EndRunRequest {
                session_id: SHARED.into(),
                run_id: RUN.into(),
                ..Default::default()
            },
            OWNER,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ended.revision, scene.before.session.revision + 1);
    let event = next_change(&mut scene.live).await;
    assert_eq!(event_kind(&event), "run_ended", "{event:?}");
    assert_eq!(event.revision, ended.revision);
    scene.stop().await;
}
