//! Prints a session's events live, resuming by itself if the server
//! restarts or the connection breaks.
//!
//! ```sh
//! cargo run -p sessionstore-client --example watcher -- ses_demo [AFTER_REVISION]
//! ```
//!
//! `SESSIONSTORE_SERVER` (default `http://127.0.0.1:50051`) and
//! `SESSIONSTORE_TOKEN` choose the server.

#![allow(clippy::print_stdout, reason = "the example's output is stdout")]

use futures_util::StreamExt as _;
use sessionstore_client::v1::session_event::Event;
use sessionstore_client::{Client, Error};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let url =
        std::env::var("SESSIONSTORE_SERVER").unwrap_or_else(|_| "http://127.0.0.1:50051".into());
    let mut args = std::env::args().skip(1);
    let session_id = args.next().unwrap_or_else(|| "ses_chat_loop".into());
    let after_revision = args.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    let mut builder = Client::builder(url);
    if let Ok(token) = std::env::var("SESSIONSTORE_TOKEN") {
        builder = builder.bearer_token(token);
    }
    let client = builder.connect().await?;

    let mut events = client.watch(&session_id, after_revision);
    while let Some(event) = events.next().await {
        let event = event?;
        let revision = event.revision;
        match &event.event {
            Some(Event::SessionCreated(created)) => {
                let title = created.session.as_ref().map_or("", |s| s.title.as_str());
                println!("[{revision}] created {title:?}");
            }
            Some(Event::ExchangeAppended(appended)) => {
                for stored in &appended.messages {
                    if let Some(message) = &stored.message {
                        println!(
                            "[{revision}] #{} {:?}: {}",
                            stored.sequence,
                            message.role(),
                            message.content
                        );
                    }
                }
                if let Some(call) = &appended.provider_call {
                    println!(
                        "[{revision}]     {}/{}: {} tokens, {} µ$",
                        call.provider, call.model, call.total_tokens, call.cost_micros_usd
                    );
                }
            }
            Some(Event::CaughtUp(_)) => println!("[{revision}] -- caught up; live from here --"),
            Some(Event::Progress(_)) => {}
            Some(Event::Delta(delta)) => {
                println!("[{revision}] {} … {:?}", delta.run_id, delta.delta)
            }
            Some(Event::SessionDeleted(_)) => println!("[{revision}] deleted"),
            _ => println!("[{revision}] {}", event.kind()),
        }
    }
    println!(
        "stream ended after revision {} ({} reconnects)",
        events.last_revision(),
        events.reconnects()
    );
    Ok(())
}
