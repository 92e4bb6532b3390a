//! RollbackSession, EditMessage and RedactMessage on another tenant's
//! session, naming the owner's message or none.

use super::*;

crate::backend_tests!(another_tenants_session_is_unknown_to_history_surgery);

async fn another_tenants_session_is_unknown_to_history_surgery(backend: Backend) {
    let mut scene = Scene::set_up(backend).await;
    let owner_message_id = scene.owner_message_id.clone();
    let client = &mut scene.client;

    probe!(
        client,
        "RollbackSession (everything)",
        rollback_session,
        |id| {
            pb::RollbackSessionRequest {
                session_id: id.to_owned(),
                after_sequence: -1,
                run_id: RUN.into(),
                ..Default::default()
            }
        }
    );
    probe!(
        client,
        "RollbackSession (past the end)",
        rollback_session,
        |id| pb::RollbackSessionRequest {
            session_id: id.to_owned(),
            after_sequence: 99,
            run_id: String::new(),
            ..Default::default()
        }
    );
    probe!(
        client,
        "EditMessage (the owner's message id)",
        edit_message,
        |id| pb::EditMessageRequest {
            session_id: id.to_owned(),
            message_id: owner_message_id.clone(),
            message: Some(user("globex rewrote this")),
            reason: "globex".into(),
            run_id: RUN.into(),
        }
    );
    probe!(
        client,
        "RedactMessage (the owner's message id)",
        redact_message,
        |id| pb::RedactMessageRequest {
            session_id: id.to_owned(),
            message_id: owner_message_id.clone(),
            reason: "globex".into(),
            run_id: RUN.into(),
        }
    );
    probe!(
        client,
        "RedactMessage (an unknown message id)",
        redact_message,
        |id| pb::RedactMessageRequest {
            session_id: id.to_owned(),
            message_id: "msg_nosuch".into(),
            reason: "globex".into(),
            run_id: RUN.into(),
        }
    );

    scene.assert_untouched().await;
    scene.stop().await;
}
