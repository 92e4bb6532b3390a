//! WatchSession on another tenant's session, from the beginning or beyond
//! the owner's head; the owner's own live watcher sees nothing of it
//! ([`Scene::assert_untouched`]).

use super::*;

crate::backend_tests!(another_tenants_session_is_unknown_to_watches);

async fn another_tenants_session_is_unknown_to_watches(backend: Backend) {
    let mut scene = Scene::set_up(backend).await;
    let client = &mut scene.client;

    probe!(stream client, "WatchSession", watch_session, |id| {
        pb::WatchSessionRequest {
            session_id: id.to_owned(),
            after_revision: 0,
            include_active_deltas: true,
            ..Default::default()
        }
    });
    probe!(
        stream client,
        "WatchSession (after_revision beyond the owner's head)",
        watch_session,
        |id| pb::WatchSessionRequest {
            session_id: id.to_owned(),
            after_revision: 999,
            include_active_deltas: false,
            ..Default::default()
        }
    );

    scene.assert_untouched().await;
    scene.stop().await;
}
