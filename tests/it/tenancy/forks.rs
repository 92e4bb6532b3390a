//! ForkSession from another tenant's session: into a new id, into a
//! server-made id past the end, onto its own id. No fork appears anywhere.

use super::*;

crate::backend_tests!(another_tenants_session_is_unknown_to_forks);

async fn another_tenants_session_is_unknown_to_forks(backend: Backend) {
    let mut scene = Scene::set_up(backend).await;
    let client = &mut scene.client;

    probe!(client, "ForkSession (into a new id)", fork_session, |id| {
        pb::ForkSessionRequest {
            session_id: id.to_owned(),
            at_sequence: 1,
            new_session_id: "ses_forkd".into(),
        }
    });
    probe!(
        client,
        "ForkSession (server-made id, past the end)",
        fork_session,
        |id| pb::ForkSessionRequest {
            session_id: id.to_owned(),
            at_sequence: 99,
            new_session_id: String::new(),
        }
    );
    probe!(
        client,
        "ForkSession (onto its own id)",
        fork_session,
        |id| {
            pb::ForkSessionRequest {
                session_id: id.to_owned(),
                at_sequence: -1,
                new_session_id: id.to_owned(),
            }
        }
    );

    // No fork appeared anywhere (nor, says `assert_untouched`, in any
    // tenant's listing).
    for token in [OWNER, INTRUDER, STRANGER] {
        let status = get(client, token, "ses_forkd").await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{token}: {status:?}");
    }

    scene.assert_untouched().await;
    scene.stop().await;
}
