//! `sessions submit`, `sessions queue` and `sessions withdraw`: queued
//! input from the terminal (SubmitInput, ListQueuedInputs,
//! WithdrawQueuedInput).

use std::io::Write;

use futures_util::StreamExt as _;
use sessionstore_client::v1 as pb;
use sessionstore_client::{Client, Error as ClientError, NewInput};

use super::{InputModeArg, QueueFormat, cell, print_table, time_of};
use crate::wire;

/// An input mode as the CLI names it: `queue`, `interrupt`, `reject`.
fn mode_name(mode: pb::InputMode) -> &'static str {
    match mode {
        pb::InputMode::Queue | pb::InputMode::Unspecified => "queue",
        pb::InputMode::Interrupt => "interrupt",
        pb::InputMode::Reject => "reject",
    }
}

/// `sessions submit ID --text TEXT…`: one input of user messages, said in
/// one line: appended at once, or queued with its id and position (and,
/// for an interrupt, the run asked to stop).
pub(super) async fn submit(
    client: &Client,
    session_id: &str,
    texts: Vec<String>,
    mode: InputModeArg,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let input = NewInput::new(session_id)
        .messages(texts.into_iter().map(pb::Message::user))
        .mode(mode.into());
    let submitted = match client.submit_input(&input).await {
        Ok(submitted) => submitted,
        Err(ClientError::SessionBusy { active_run_id, .. }) => {
            let why = if active_run_id.is_empty() {
                "inputs wait in its queue".to_owned()
            } else {
                format!("run {active_run_id} holds it")
            };
            anyhow::bail!("{session_id} is busy ({why}): nothing submitted (--mode reject)");
        }
        Err(ClientError::QueueFull { limit, .. }) => {
            anyhow::bail!(
                "the queue of {session_id} is full ({limit} inputs wait): nothing submitted; \
                 withdraw one, or wait until the run takes some"
            );
        }
        Err(error) => return Err(error.into()),
    };
    match submitted.input.filter(|_| submitted.queued) {
        Some(queued) => {
            write!(
                out,
                "queued {} at position {} of {session_id} (revision {})",
                queued.input_id, queued.position, submitted.revision
            )?;
            if mode == InputModeArg::Interrupt {
                // The run asked to stop keeps the lease until it ends.
                let session = client.get_session(session_id.to_owned()).await?;
                if !session.active_run_id.is_empty() {
                    write!(out, "; asked run {} to stop", session.active_run_id)?;
                }
            }
            writeln!(out)?;
        }
        None => {
            let first = submitted.messages.first().map_or(0, |m| m.sequence);
            let last = submitted.messages.last().map_or(0, |m| m.sequence);
            writeln!(
                out,
                "appended to {session_id} at once (not busy): sequences {first}..{last} (revision {})",
                submitted.revision
            )?;
        }
    }
    Ok(())
}

/// `sessions queue ID`: the waiting inputs, by position, as a table or one
/// JSON array.
pub(super) async fn list(
    client: &Client,
    session_id: &str,
    format: QueueFormat,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let mut stream = client.list_queued_inputs(session_id);
    let mut inputs = Vec::new();
    while let Some(input) = stream.next().await {
        inputs.push(input?);
    }
    match format {
        QueueFormat::Json => {
            serde_json::to_writer(&mut *out, &json(inputs)?)?;
            writeln!(out)?;
        }
        QueueFormat::Text => {
            let mut rows = vec![[
                "POSITION".to_owned(),
                "ID".to_owned(),
                "MODE".to_owned(),
                "MESSAGES".to_owned(),
                "TEXT".to_owned(),
                "QUEUED".to_owned(),
            ]];
            rows.extend(inputs.iter().map(|input| {
                let text = input.messages.first().map_or("", |m| m.content.as_str());
                [
                    input.position.to_string(),
                    input.input_id.clone(),
                    mode_name(input.mode()).to_owned(),
                    input.messages.len().to_string(),
                    cell(text, 40),
                    time_of(input.create_time.as_ref()),
                ]
            }));
            print_table(out, &rows, &[0, 3])?;
            if inputs.is_empty() {
                writeln!(out, "(no inputs waiting)")?;
            }
        }
    }
    out.flush()?;
    Ok(())
}

/// The inputs as JSON: each one's fields by name, the mode as the CLI
/// names it, each message as an export file holds it, the time RFC 3339.
fn json(inputs: Vec<pb::QueuedInput>) -> anyhow::Result<serde_json::Value> {
    let mut items = Vec::with_capacity(inputs.len());
    for input in inputs {
        let mode = mode_name(input.mode());
        let create_time = input.create_time.as_ref().map(|t| time_of(Some(t)));
        let mut messages = Vec::with_capacity(input.messages.len());
        for (i, message) in input.messages.into_iter().enumerate() {
            let message = wire::message_from_pb(message, &format!("messages[{i}]"))?;
            messages.push(serde_json::to_value(message)?);
        }
        items.push(serde_json::json!({
            "input_id": input.input_id,
            "session_id": input.session_id,
            "position": input.position,
            "mode": mode,
            "messages": messages,
            "create_time": create_time,
        }));
    }
    Ok(serde_json::Value::Array(items))
}

/// `sessions withdraw ID INPUT`: one line. An input already taken says so.
pub(super) async fn withdraw(
    client: &Client,
    session_id: &str,
    input_id: &str,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let revision = match client.withdraw_queued_input(session_id, input_id).await {
        Ok(revision) => revision,
        Err(ClientError::InputAlreadyTaken { .. }) => {
            anyhow::bail!(
                "input {input_id} of {session_id} was already taken into the history: \
                 too late to withdraw"
            );
        }
        Err(error) => return Err(error.into()),
    };
    writeln!(
        out,
        "withdrew {input_id} from {session_id} (revision {revision})"
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_keeps_every_field_and_messages_as_exported() -> anyhow::Result<()> {
        let input = pb::QueuedInput {
            input_id: "inp_1".into(),
            session_id: "ses_1".into(),
            position: 3,
            messages: vec![pb::Message::user("hi"), pb::Message::user("and more")],
            mode: pb::InputMode::Interrupt.into(),
            create_time: Some(prost_types::Timestamp {
                seconds: 86_400,
                nanos: 0,
            }),
        };
        let value = json(vec![input, pb::QueuedInput::default()])?;
        assert_eq!(value[0]["input_id"], "inp_1");
        assert_eq!(value[0]["position"], 3);
        assert_eq!(value[0]["mode"], "interrupt");
        assert_eq!(value[0]["messages"][0]["role"], "user");
        assert_eq!(value[0]["messages"][1]["content"], "and more");
        assert!(
            value[0]["create_time"]
                .as_str()
                .is_some_and(|t| t.starts_with("1970-01-02T00:00:00"))
        );
        assert_eq!(value[1]["mode"], "queue");
        assert_eq!(value[1]["create_time"], serde_json::Value::Null);
        Ok(())
    }
}
