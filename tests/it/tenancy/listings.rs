//! ListSessions and SearchMessages: another tenant's session is in no
//! listing and no search of anyone else, whatever the user filter.

use super::*;

crate::backend_tests!(another_tenants_session_is_missing_from_listings_and_search);

async fn another_tenants_session_is_missing_from_listings_and_search(backend: Backend) {
    let mut scene = Scene::set_up(backend).await;
    assert_listings_private(&mut scene.client).await;
    scene.assert_untouched().await;
    scene.stop().await;
}
