//! ListSessions with metadata filters: every session that matches, newest
//! first, page after page, whether a filter matches a few sessions or most
//! of them (SQLite reads the few from the filter's index and walks the
//! sessions for the many; the answer must not depend on which).

use std::collections::BTreeMap;

use sessionstore_server::domain::{SessionCursor, SessionQuery};

use super::*;

crate::backend_tests!(filtered_listings_hold_every_match_newest_first_whatever_the_filter_matches,);

/// A listing's user, if any, and its metadata filters.
type Case = (
    Option<&'static str>,
    &'static [(&'static str, &'static str)],
);

/// Sessions written: enough for `tier = free` to match more than the
/// store reads from a filter's index before it walks instead.
const SESSIONS: usize = 2200;

async fn filtered_listings_hold_every_match_newest_first_whatever_the_filter_matches(
    backend: Backend,
) {
    let (_storage, store) = open(backend).await;
    // Written 32 at a time, so that the writer commits them in batches.
    let mut sessions = BTreeMap::new();
    for chunk in (0..SESSIONS).collect::<Vec<_>>().chunks(32) {
        let mut writes = tokio::task::JoinSet::new();
        for &n in chunk {
            let store = store.clone();
            writes.spawn(async move {
                let tier = if n % 40 == 0 { "pro" } else { "free" };
                let new = NewSession {
                    id: Some(format!("s-{n:04}")),
                    title: "t".into(),
                    user: format!("u{}", n % 3),
                    metadata: [
                        ("tier".to_owned(), tier.to_owned()),
                        ("app".to_owned(), format!("app-{}", n % 2)),
                    ]
                    .into(),
                    ..Default::default()
                };
                let (session, _) = store.create_session(TENANT, new).await.unwrap();
                (n, session)
            });
        }
        while let Some(done) = writes.join_next().await {
            let (n, session) = done.unwrap();
            sessions.insert(n, session);
        }
    }
    // A deleted session matches no filter.
    store.delete_session(TENANT, "s-0040").await.unwrap();
    sessions.remove(&40);
    // And another tenant's sessions are never listed.
    let other = NewSession {
        id: Some("s-other".into()),
        metadata: [("tier".to_owned(), "pro".to_owned())].into(),
        ..Default::default()
    };
    store.create_session("other", other).await.unwrap();

    let cases: [Case; 8] = [
        (None, &[("tier", "free")]),
        (None, &[("tier", "pro")]),
        (None, &[("app", "app-0")]),
        (None, &[("tier", "free"), ("app", "app-1")]),
        (None, &[("app", "app-0"), ("tier", "pro")]),
        (Some("u1"), &[("tier", "free")]),
        (Some("u2"), &[("tier", "pro"), ("app", "app-0")]),
        (None, &[("tier", "gold")]),
    ];
    for (user, filters) in cases {
        let mut expected: Vec<(i64, String)> = sessions
            .iter()
            .filter(|(n, _)| user.is_none_or(|user| user == format!("u{}", *n % 3)))
            .filter(|(_, session)| {
                filters.iter().all(|(key, value)| {
                    session.metadata.get(*key).map(String::as_str) == Some(value)
                })
            })
            .map(|(_, session)| (session.update_time.0, session.id.clone()))
            .collect();
        expected.sort_by(|a, b| b.cmp(a));

        let mut listed = Vec::new();
        let mut after = None;
        loop {
            let query = SessionQuery {
                user: user.map(str::to_owned),
                metadata: filters
                    .iter()
                    .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                    .collect(),
                after: after.clone(),
                limit: 50,
            };
            let page = store.list_sessions(TENANT, query).await.unwrap();
            let full = page.len() == 50;
            for summary in page {
                after = Some(SessionCursor {
                    update_time: summary.session.update_time.0,
                    id: summary.session.id.clone(),
                });
                listed.push((summary.session.update_time.0, summary.session.id));
            }
            if !full {
                break;
            }
        }
        assert_eq!(
            listed.len(),
            expected.len(),
            "user {user:?}, filters {filters:?}"
        );
        assert!(
            listed == expected,
            "user {user:?}, filters {filters:?}: listed in another order or other sessions"
        );
    }
}
