//! A model's answer streamed live: a producer publishes it word by word;
//! one watcher (a browser tab, say) drops its stream mid-run and picks it
//! up again from its cursor; another watcher presses Stop. The producer
//! stores what it had, marked incomplete.
//!
//! ```sh
//! cargo run -p sessionstore-client --example live_run
//! ```
//!
//! `SESSIONSTORE_SERVER` (default `http://127.0.0.1:50051`) and
//! `SESSIONSTORE_TOKEN` choose the server.

#![allow(clippy::print_stdout, reason = "the example's output is stdout")]

use futures_util::StreamExt as _;
use sessionstore_client::v1::session_event::Event;
use sessionstore_client::v1::{self, Message, ProviderCall};
use sessionstore_client::{Client, Error, Exchange, NewSession, SessionEvents};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let url =
        std::env::var("SESSIONSTORE_SERVER").unwrap_or_else(|_| "http://127.0.0.1:50051".into());
    let mut builder = Client::builder(url);
    if let Ok(token) = std::env::var("SESSIONSTORE_TOKEN") {
        builder = builder.bearer_token(token);
    }
    let client = builder.connect().await?;
    let session = client
        .create_session(NewSession::new().title("A story"))
        .await?;
    let id = session.id.clone();

    // The producer: a run that publishes the answer as it is generated.
    let mut run = client.run(&id, "run_story");
    let words = "Once upon a time there was a session store that never lost a word";
    let mut words = words.split(' ');
    for word in words.by_ref().take(5) {
        run.publish_text(format!("{word} ")).await?;
    }

    // Watcher 1 joins mid-run: it gets the text so far, then the rest live.
    let watch = v1::WatchSessionRequest {
        session_id: id.clone(),
        after_revision: session.revision,
        include_active_deltas: true,
        ..Default::default()
    };
    let mut tab = client.watch_with(watch.clone());
    let (seen, cursor) = read_deltas(&mut tab, 4).await?;
    println!("tab 1 joined late and saw: {seen:?}");

    // Its page reloads: the new stream starts after its last revision and
    // its cursor in the run, so nothing is shown twice.
    drop(tab);
    for word in words.by_ref().take(3) {
        run.publish_text(format!("{word} ")).await?;
    }
    let mut reloaded = client.watch_with(v1::WatchSessionRequest {
        delta_cursors: vec![v1::DeltaCursor {
            run_id: run.run_id().to_owned(),
            after_index: cursor,
        }],
        ..watch.clone()
    });
    let (more, _) = read_deltas(&mut reloaded, 7).await?;
    println!("tab 1 reloaded and carried on with: {more:?}");

    // Watcher 2 presses Stop; the producer sees it on its next delta.
    let revision = client
        .cancel_run(&id, run.run_id(), "user pressed Stop")
        .await?;
    println!("tab 2 stopped the run at revision {revision}");
    for word in words {
        if run.publish_text(format!("{word} ")).await? {
            break;
        }
    }
    let exchange = Exchange::new(&id)
        .message(Message::user("Tell me a story"))
        .provider_call(ProviderCall::new("openai", "gpt-4o").with_tokens(12, 9));
    let stored = run.finish_incomplete(exchange).await?;
    let answer = stored.messages.last().and_then(|m| m.message.as_ref());
    println!(
        "stored the partial answer {:?} (incomplete: {})",
        answer.map_or("", |m| m.content.as_str()),
        answer.is_some_and(|m| m.incomplete)
    );
    Ok(())
}

/// Reads deltas until delta `last` arrived: their text and the last index.
async fn read_deltas(events: &mut SessionEvents, last: i64) -> Result<(String, i64), Error> {
    let mut text = String::new();
    while let Some(event) = events.next().await {
        if let Some(Event::Delta(delta)) = event?.event {
            if let Some(v1::delta::Delta::Text(piece)) = delta.delta {
                text.push_str(&piece);
            }
            if delta.index >= last {
                return Ok((text, delta.index));
            }
        }
    }
    Ok((text, -1))
}
