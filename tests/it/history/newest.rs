//! ListMessages newest first (`order_by = "sequence desc"`) and
//! `before_sequence`: keyset pages from either end, bounded on both sides.

use super::*;

crate::backend_tests!(
    messages_page_newest_first_and_between_bounds,
    newest_first_follows_edits_rollbacks_and_redactions,
    a_bad_order_or_a_token_of_the_other_order_is_refused,
);

fn list(order_by: &str, page_token: &str) -> pb::ListMessagesRequest {
    pb::ListMessagesRequest {
        session_id: "nf".into(),
        page_size: 3,
        page_token: page_token.into(),
        order_by: order_by.into(),
        ..Default::default()
    }
}

/// Every page, following page tokens from `first`.
async fn pages(client: &mut Client, first: pb::ListMessagesRequest) -> Vec<Vec<pb::StoredMessage>> {
    let mut request = first;
    let mut pages = Vec::new();
    loop {
        let page = client
            .list_messages(request.clone())
            .await
            .unwrap()
            .into_inner();
        pages.push(page.messages);
        if page.next_page_token.is_empty() {
            return pages;
        }
        request.page_token = page.next_page_token;
    }
}

/// Every page's sequences, following page tokens from `first`.
async fn sequences(client: &mut Client, first: pb::ListMessagesRequest) -> Vec<Vec<i64>> {
    pages(client, first)
        .await
        .iter()
        .map(|page| page.iter().map(|m| m.sequence).collect())
        .collect()
}

async fn messages_page_newest_first_and_between_bounds(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "nf").await;
    for i in 0..4 {
        exchange(&mut client, "nf", &format!("q{i}"), &format!("a{i}")).await;
    }
    // Sequences 0..=7.
    assert_eq!(
        sequences(&mut client, list("sequence desc", "")).await,
        [vec![7, 6, 5], vec![4, 3, 2], vec![1, 0]]
    );
    assert_eq!(
        sequences(&mut client, list("sequence", "")).await,
        [vec![0, 1, 2], vec![3, 4, 5], vec![6, 7]]
    );
    assert_eq!(
        sequences(&mut client, list("", "")).await,
        [vec![0, 1, 2], vec![3, 4, 5], vec![6, 7]]
    );
    // The newest page names the newest message first, with its content.
    let newest = client
        .list_messages(list("sequence desc", ""))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(content(&newest.messages[0]), "a3");
    // Bounds on both sides, in either order.
    let between = |order_by: &str| pb::ListMessagesRequest {
        after_sequence: Some(1),
        before_sequence: Some(6),
        ..list(order_by, "")
    };
    assert_eq!(
        sequences(&mut client, between("sequence desc")).await,
        [vec![5, 4, 3], vec![2]]
    );
    assert_eq!(
        sequences(&mut client, between("sequence")).await,
        [vec![2, 3, 4], vec![5]]
    );
    let before_two = pb::ListMessagesRequest {
        before_sequence: Some(2),
        ..list("sequence desc", "")
    };
    assert_eq!(sequences(&mut client, before_two).await, [vec![1, 0]]);
    let nothing = pb::ListMessagesRequest {
        before_sequence: Some(0),
        ..list("sequence", "")
    };
    assert_eq!(sequences(&mut client, nothing).await, [Vec::<i64>::new()]);
    server.stop().await.unwrap();
}

async fn a_bad_order_or_a_token_of_the_other_order_is_refused(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "nf").await;
    for i in 0..3 {
        exchange(&mut client, "nf", &format!("q{i}"), &format!("a{i}")).await;
    }
    for order_by in ["sequence DESC", "sequence asc", "create_time", "desc"] {
        let status = client.list_messages(list(order_by, "")).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{order_by}");
        assert_eq!(error_details(&status).1.as_deref(), Some("order_by"));
    }
    let status = client
        .list_messages(pb::ListMessagesRequest {
            before_sequence: Some(-1),
            ..list("", "")
        })
        .await
        .unwrap_err();
    assert_eq!(error_details(&status).1.as_deref(), Some("before_sequence"));
    let desc = client
        .list_messages(list("sequence desc", ""))
        .await
        .unwrap()
        .into_inner();
    assert!(!desc.next_page_token.is_empty());
    let status = client
        .list_messages(list("sequence", &desc.next_page_token))
        .await
        .unwrap_err();
    assert_eq!(error_details(&status).1.as_deref(), Some("page_token"));
    server.stop().await.unwrap();
}

/// Every message newest first, as (sequence, content) pages.
async fn newest_pages(client: &mut Client) -> Vec<Vec<(i64, String)>> {
    pages(client, list("sequence desc", ""))
        .await
        .iter()
        .map(|page| {
            page.iter()
                .map(|m| (m.sequence, content(m).to_owned()))
                .collect()
        })
        .collect()
}

async fn newest_first_follows_edits_rollbacks_and_redactions(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "nf").await;
    let mut ids = Vec::new();
    for i in 0..4 {
        let stored = exchange(&mut client, "nf", &format!("q{i}"), &format!("a{i}")).await;
        ids.extend(stored.messages.iter().map(|m| m.id.clone()));
    }
    // Edit a3 and redact q2; roll back past a3's exchange, then write again.
    client
        .edit_message(pb::EditMessageRequest {
            session_id: "nf".into(),
            message_id: ids[7].clone(),
            message: Some(assistant("a3, edited")),
            ..Default::default()
        })
        .await
        .unwrap();
    client
        .redact_message(pb::RedactMessageRequest {
            session_id: "nf".into(),
            message_id: ids[4].clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let first = client
        .list_messages(list("sequence desc", ""))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(content(&first.messages[0]), "a3, edited");
    assert_eq!(
        newest_pages(&mut client).await,
        [
            vec![(7, "a3, edited".into()), (6, "q3".into()), (5, "a2".into())],
            vec![(4, String::new()), (3, "a1".into()), (2, "q1".into())],
            vec![(1, "a0".into()), (0, "q0".into())],
        ]
    );
    client
        .rollback_session(pb::RollbackSessionRequest {
            session_id: "nf".into(),
            after_sequence: 5,
            ..Default::default()
        })
        .await
        .unwrap();
    // A token taken before a rollback still pages down what remains.
    let token = client
        .list_messages(list("sequence desc", ""))
        .await
        .unwrap()
        .into_inner()
        .next_page_token;
    exchange(&mut client, "nf", "q3 again", "a3 again").await;
    assert_eq!(
        newest_pages(&mut client).await,
        [
            vec![
                (7, "a3 again".into()),
                (6, "q3 again".into()),
                (5, "a2".into())
            ],
            vec![(4, String::new()), (3, "a1".into()), (2, "q1".into())],
            vec![(1, "a0".into()), (0, "q0".into())],
        ]
    );
    let rest = client
        .list_messages(list("sequence desc", &token))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        rest.messages.iter().map(|m| m.sequence).collect::<Vec<_>>(),
        [2, 1, 0]
    );
    server.stop().await.unwrap();
}
