//! SetState, GetState, ListState (also with the owner's page token) and
//! DeleteState on another tenant's session, on the owner's keys or others.

use super::*;

crate::backend_tests!(another_tenants_session_is_unknown_to_state);

async fn another_tenants_session_is_unknown_to_state(backend: Backend) {
    let mut scene = Scene::set_up(backend).await;
    let client = &mut scene.client;
    let state_token = state_page_token(client).await;

    probe!(client, "SetState (the owner's key)", set_state, |id| {
        pb::SetStateRequest {
            session_id: id.to_owned(),
            key: "cwd".into(),
            value: "/srv/globex".into(),
            expected_version: None,
            ..Default::default()
        }
    });
    probe!(
        client,
        "SetState (expected_version 0 on the owner's key)",
        set_state,
        |id| pb::SetStateRequest {
            session_id: id.to_owned(),
            key: "cwd".into(),
            value: "/srv/globex".into(),
            expected_version: Some(0),
            ..Default::default()
        }
    );
    probe!(client, "SetState (a new key)", set_state, |id| {
        pb::SetStateRequest {
            session_id: id.to_owned(),
            key: "globex".into(),
            value: "was here".into(),
            expected_version: None,
            ..Default::default()
        }
    });
    probe!(client, "GetState (the owner's key)", get_state, |id| {
        pb::GetStateRequest {
            session_id: id.to_owned(),
            key: "cwd".into(),
            ..Default::default()
        }
    });
    probe!(client, "GetState (a missing key)", get_state, |id| {
        pb::GetStateRequest {
            session_id: id.to_owned(),
            key: "missing".into(),
            ..Default::default()
        }
    });
    probe!(client, "ListState", list_state, |id| pb::ListStateRequest {
        session_id: id.to_owned(),
        ..Default::default()
    });
    probe!(
        same_id client,
        "ListState (the owner's page token)",
        list_state,
        |id| pb::ListStateRequest {
            session_id: id.to_owned(),
            page_size: 1,
            page_token: state_token.clone(),
            ..Default::default()
        }
    );
    probe!(
        client,
        "DeleteState (the owner's key)",
        delete_state,
        |id| {
            pb::DeleteStateRequest {
                session_id: id.to_owned(),
                key: "cwd".into(),
                expected_version: None,
                ..Default::default()
            }
        }
    );
    probe!(
        client,
        "DeleteState (a wrong expected_version)",
        delete_state,
        |id| pb::DeleteStateRequest {
            session_id: id.to_owned(),
            key: "files".into(),
            expected_version: Some(99),
            ..Default::default()
        }
    );

    scene.assert_untouched().await;
    scene.stop().await;
}
