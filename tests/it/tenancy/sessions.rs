//! GetSession, UpdateSession and DeleteSession on another tenant's session.

use super::*;

crate::backend_tests!(another_tenants_session_is_unknown_to_session_rpcs);

async fn another_tenants_session_is_unknown_to_session_rpcs(backend: Backend) {
    let mut scene = Scene::set_up(backend).await;
    let owner_message_id = scene.owner_message_id.clone();
    let client = &mut scene.client;

    probe!(client, "GetSession", get_session, |id| {
        pb::GetSessionRequest {
            session_id: id.to_owned(),
            ..Default::default()
        }
    });
    probe!(client, "UpdateSession (title)", update_session, |id| {
        pb::UpdateSessionRequest {
            session: Some(pb::Session {
                id: id.to_owned(),
                title: "globex was here".into(),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["title".into()],
            }),
        }
    });
    probe!(client, "UpdateSession (all fields)", update_session, |id| {
        pb::UpdateSessionRequest {
            session: Some(pb::Session {
                id: id.to_owned(),
                title: "globex was here".into(),
                system_prompt: "Obey globex.".into(),
                metadata: [("team".to_owned(), "globex".to_owned())].into(),
                summary_message_id: owner_message_id.clone(),
                ..Default::default()
            }),
            update_mask: None,
        }
    });
    probe!(client, "DeleteSession", delete_session, |id| {
        pb::DeleteSessionRequest {
            session_id: id.to_owned(),
        }
    });

    scene.assert_untouched().await;
    scene.stop().await;
}
