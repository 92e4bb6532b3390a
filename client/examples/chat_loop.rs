//! A chat loop that persists every exchange in sessionstore and, when
//! started again with the same session id, resumes the conversation from
//! `export_history` — the model "remembers" everything.
//!
//! The model is faked with a canned answer, so this needs no network but
//! the sessionstore server:
//!
//! ```sh
//! cargo run -p sessionstore-server --bin sessionstore &
//! cargo run -p sessionstore-client --example chat_loop -- ses_demo
//! ```
//!
//! Type lines; an empty line or end of input stops. Run it again with the
//! same id to continue where you left off. `SESSIONSTORE_SERVER` (default
//! `http://127.0.0.1:50051`) and `SESSIONSTORE_TOKEN` choose the server.

#![allow(
    clippy::print_stdout,
    reason = "an interactive example talks on stdout"
)]

use sessionstore_client::v1::{Message, ProviderCall, Role};
use sessionstore_client::{Client, Error, Exchange, NewSession};
use tokio::io::AsyncBufReadExt as _;

const SYSTEM_PROMPT: &str = "You are a friendly parrot.";

/// Stands in for a model API call: answers from the whole history, as a
/// real model would be given it.
fn fake_model(history: &[Message]) -> (Message, ProviderCall) {
    let turns = history.iter().filter(|m| m.role() == Role::User).count();
    let last = history.last().map_or("", |m| m.content.as_str());
    let answer = format!("Squawk! You said {last:?}. That makes {turns} things you told me.");
    let prompt_tokens = history.iter().map(|m| m.content.len() as i64 / 4 + 1).sum();
    let call = ProviderCall::new("fake", "parrot-1")
        .with_tokens(prompt_tokens, answer.len() as i64 / 4 + 1)
        .with_cost_micros_usd(7);
    (Message::assistant(answer), call)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let url =
        std::env::var("SESSIONSTORE_SERVER").unwrap_or_else(|_| "http://127.0.0.1:50051".into());
    let session_id = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "ses_chat_loop".into());
    let mut builder = Client::builder(url);
    if let Ok(token) = std::env::var("SESSIONSTORE_TOKEN") {
        builder = builder.bearer_token(token);
    }
    let client = builder.connect().await?;

    // Resume the conversation if it exists, else start it.
    let mut history = match client.get_session(&session_id).await {
        Ok(session) => {
            let history = client.export_history(&session.id).await?;
            println!(
                "resuming {} ({} messages so far):",
                session.id,
                history.len()
            );
            for message in &history {
                println!("  {:?}: {}", message.role(), message.content);
            }
            history
        }
        Err(Error::NotFound { .. }) => {
            client
                .create_session(
                    NewSession::new()
                        .id(&session_id)
                        .title("chat loop example")
                        .system_prompt(SYSTEM_PROMPT),
                )
                .await?;
            println!("started {session_id}");
            Vec::new()
        }
        Err(other) => return Err(other),
    };

    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    loop {
        println!("you> ");
        let Ok(Some(line)) = lines.next_line().await else {
            break;
        };
        if line.trim().is_empty() {
            break;
        }
        let question = Message::user(line);
        history.push(question.clone());
        let (answer, call) = fake_model(&history);
        println!("parrot> {}", answer.content);

        // Persist the turn. The exchange's request_id makes retries safe;
        // expected_next_sequence catches another writer on this session.
        let exchange = Exchange::new(&session_id)
            .message(question)
            .provider_call(call)
            .response(answer.clone())
            .expected_next_sequence(history.len() as i64 - 1);
        match client.append_exchange(&exchange).await {
            Ok(stored) => {
                println!("(stored at revision {})", stored.revision);
                history.push(answer);
            }
            Err(Error::SequenceMismatch { .. }) => {
                // Someone else wrote to this session: start again from what is stored.
                println!("(the session changed elsewhere; reloading it)");
                history = client.export_history(&session_id).await?;
                continue;
            }
            Err(other) => return Err(other),
        }
    }
    println!("bye; run again with {session_id} to continue");
    Ok(())
}
