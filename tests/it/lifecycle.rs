//! Data lifecycle: per-session expiry (hidden from its expire_time on,
//! deleted by the sweeper with `session_deleted`).

use std::time::{Duration, SystemTime};

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use tonic::Code;
use tonic::transport::Channel;

use crate::support::{Backend, Storage, TestServer, exchange_request, next_change};

crate::backend_tests!(
    an_expired_session_is_gone_at_once,
    the_sweeper_deletes_an_expired_session,
);

type Client = SessionStoreClient<Channel>;

fn at(offset: Duration, later: bool) -> prost_types::Timestamp {
    let now = SystemTime::now();
    let time = if later { now + offset } else { now - offset };
    let mut time = prost_types::Timestamp::from(time);
    // The server keeps microseconds.
    time.nanos -= time.nanos % 1000;
    time
}

async fn create(
    client: &mut Client,
    id: &str,
    expire_time: Option<prost_types::Timestamp>,
) -> pb::Session {
    client
        .create_session(pb::CreateSessionRequest {
            session_id: id.into(),
            expire_time,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

async fn get(client: &mut Client, id: &str) -> Result<pb::Session, tonic::Status> {
    client
        .get_session(pb::GetSessionRequest {
            session_id: id.into(),
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn listed(client: &mut Client) -> Vec<String> {
    client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sessions
        .into_iter()
        .filter_map(|s| s.session.map(|s| s.id))
        .collect()
}

async fn an_expired_session_is_gone_at_once(backend: Backend) {
    // No sweep during the test: what hides the session is its expire_time.
    let server = TestServer::start_on(Storage::new(backend).await, |config| {
        config.sweep_interval_ms = 3_600_000;
    })
    .await;
    let mut client = server.client().await;
    let later = at(Duration::from_secs(3600), true);
    let kept = create(&mut client, "ses_later", Some(later)).await;
    assert_eq!(kept.expire_time, Some(later));
    create(&mut client, "ses_plain", None).await;
    let past = create(
        &mut client,
        "ses_past",
        Some(at(Duration::from_secs(1), false)),
    )
    .await;
    assert!(past.expire_time.is_some());
    assert_eq!(
        get(&mut client, "ses_past").await.unwrap_err().code(),
        Code::NotFound
    );
    let status = client
        .append_exchange(exchange_request("ses_past", "q", "a"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let mut ids = listed(&mut client).await;
    ids.sort();
    assert_eq!(ids, ["ses_later", "ses_plain"]);

    // Set by UpdateSession only when the mask names it.
    let update =
        |expire_time: Option<prost_types::Timestamp>, paths: &[&str]| pb::UpdateSessionRequest {
            session: Some(pb::Session {
                id: "ses_later".into(),
                title: "renamed".into(),
                expire_time,
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: paths.iter().map(|p| (*p).to_owned()).collect(),
            }),
        };
    let renamed = client
        .update_session(update(None, &[]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        renamed.expire_time,
        Some(later),
        "an empty mask leaves expiry alone"
    );
    let cleared = client
        .update_session(update(None, &["expire_time"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cleared.expire_time, None);
    client
        .update_session(update(
            Some(at(Duration::from_secs(1), false)),
            &["expire_time"],
        ))
        .await
        .unwrap();
    assert_eq!(
        get(&mut client, "ses_later").await.unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(listed(&mut client).await, ["ses_plain"]);
    server.stop().await.unwrap();
}

async fn the_sweeper_deletes_an_expired_session(backend: Backend) {
    let server = TestServer::start_on(Storage::new(backend).await, |config| {
        config.sweep_interval_ms = 50;
    })
    .await;
    let mut client = server.client().await;
    let session = create(
        &mut client,
        "ses_soon",
        Some(at(Duration::from_millis(1500), true)),
    )
    .await;
    let mut events = client
        .watch_session(pb::WatchSessionRequest {
            session_id: "ses_soon".into(),
            after_revision: session.revision,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next_change(&mut events).await.kind(), "caught_up");
    let deleted = next_change(&mut events).await;
    assert_eq!(deleted.kind(), "session_deleted");
    assert_eq!(deleted.revision, session.revision + 1);
    assert!(
        events.message().await.unwrap().is_none(),
        "the stream ends after session_deleted"
    );
    // The id is free again, without an expiry.
    let again = create(&mut client, "ses_soon", None).await;
    assert_eq!(again.revision, 1);
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_deletes_an_expired_session() {
    if !crate::support::postgres_available("lifecycle::one_replica_deletes_an_expired_session")
        .await
    {
        return;
    }
    let fast = |config: &mut sessionstore_server::config::ServeConfig| {
        config.sweep_interval_ms = 20;
    };
    let storage = Storage::new(Backend::Postgres).await;
    let url = storage.url.clone();
    let a = TestServer::start_on(storage, fast).await;
    let b = TestServer::start_with(url, None, fast).await;
    let mut on_a = a.client().await;
    let mut on_b = b.client().await;
    // Several at once, so both sweepers find the same ones.
    let mut streams = Vec::new();
    for i in 0..5 {
        let id = format!("ses_race_{i}");
        let created = create(&mut on_a, &id, Some(at(Duration::from_millis(1500), true))).await;
        for client in [&mut on_a, &mut on_b] {
            let mut events = client
                .watch_session(pb::WatchSessionRequest {
                    session_id: id.clone(),
                    after_revision: created.revision,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(next_change(&mut events).await.kind(), "caught_up");
            streams.push((created.revision, events));
        }
    }
    for (revision, mut events) in streams {
        let deleted = next_change(&mut events).await;
        assert_eq!(deleted.kind(), "session_deleted");
        assert_eq!(deleted.revision, revision + 1, "one deletion, one revision");
        assert!(events.message().await.unwrap().is_none());
    }
    b.stop().await.unwrap();
    a.stop().await.unwrap();
}
