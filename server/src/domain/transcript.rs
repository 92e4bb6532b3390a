//! Session transcripts: stored messages rendered as Markdown for people, or as
//! OpenAI Chat Completions messages for replaying to a model.
//!
//! Everything here is pure. JSON-carrying strings (tool arguments, tool-use
//! inputs, JSON blocks) are copied verbatim and never parsed, so malformed
//! JSON survives an export exactly.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value, json};

use super::calendar::rfc3339;
use super::{ContentBlock, Message, Role, Session};

/// The Markdown transcript's opening: a `# ` heading (the title, or the
/// session id when the title is empty), a line with session id, user (if any)
/// and creation time (RFC 3339 UTC), then the system prompt (if non-empty) as
/// a `## System` section.
pub fn markdown_header(session: &Session) -> String {
    let title = if session.title.is_empty() {
        &session.id
    } else {
        &session.title
    };
    let mut out = format!("# {}\n\n", title.replace('\n', " "));
    out.push_str(&format!("Session `{}`", session.id));
    if !session.user.is_empty() {
        out.push_str(&format!(" · user `{}`", session.user));
    }
    out.push_str(&format!(" · created {}\n\n", rfc3339(session.create_time)));
    if !session.system_prompt.is_empty() {
        out.push_str(&format!("## System\n\n{}\n\n", session.system_prompt));
    }
    out
}

/// One message as a Markdown section: a `## Role` heading (with the name,
/// the tool call id, an error mark and an incomplete mark when set), then
/// the content and each block in order. Code is fenced so that no
/// backticks inside can close it.
/// When `redacted`, the body is just `_[redacted]_`.
pub fn markdown_message(message: &Message, redacted: bool) -> String {
    let mut heading = format!("## {}", role_title(message.role));
    if !message.name.is_empty() {
        heading.push_str(&format!(" ({})", message.name));
    }
    if message.role == Role::Tool && !message.tool_call_id.is_empty() {
        heading.push_str(&format!(" · `{}`", message.tool_call_id));
    }
    if message.tool_error {
        heading.push_str(" (error)");
    }
    if message.incomplete {
        heading.push_str(" (incomplete)");
    }

    let mut body = Vec::new();
    if redacted {
        body.push("_[redacted]_".to_owned());
    } else {
        if message.role == Role::Tool {
            // A tool's output is data, not prose: fenced like a tool_result
            // block, so Markdown in it (or a stray `#`) renders as written.
            if !message.content.is_empty() {
                body.push(fenced("", &message.content));
            }
        } else if !message.content.is_empty() {
            body.push(message.content.clone());
        }
        body.extend(message.content_blocks.iter().map(markdown_block));
        body.extend(
            message
                .tool_calls
                .iter()
                .map(|c| markdown_tool_call(&c.name, &c.id, &c.arguments)),
        );
    }

    let mut out = heading + "\n\n";
    for paragraph in body {
        out.push_str(&paragraph);
        out.push_str("\n\n");
    }
    out
}

/// The OpenAI Chat Completions messages for one stored message: usually one,
/// plus a `tool` message per `tool_result` block (after it), and none for a
/// message holding only tool results. When `redacted`, contents are emptied
/// and arguments become `{}`, but roles and tool-call ids stay, so the
/// sequence remains valid for a model API.
pub fn openai_messages(message: &Message, redacted: bool) -> Vec<Value> {
    let parts: Vec<Value> = message.content_blocks.iter().filter_map(part).collect();
    let calls: Vec<Value> = message
        .tool_calls
        .iter()
        .map(|c| (&c.id, &c.name, &c.arguments))
        .chain(message.content_blocks.iter().filter_map(|b| match b {
            ContentBlock::ToolUse {
                id, name, input, ..
            } => Some((id, name, input)),
            _ => None,
        }))
        .map(|(id, name, arguments)| {
            let arguments = if redacted { "{}" } else { arguments.as_str() };
            json!({
                "id": id,
                "type": "function",
                "function": { "name": name, "arguments": arguments },
            })
        })
        .collect();
    let results: Vec<Value> = message
        .content_blocks
        .iter()
        .filter_map(|b| match b {
            ContentBlock::ToolResult {
                tool_use_id,
                content,
                ..
            } => Some(json!({
                "role": "tool",
                "tool_call_id": tool_use_id,
                "content": if redacted { "" } else { content.as_str() },
            })),
            _ => None,
        })
        .collect();

    let only_results =
        !results.is_empty() && message.content.is_empty() && parts.is_empty() && calls.is_empty();
    let mut out = Vec::with_capacity(1 + results.len());
    if !only_results {
        let content = if redacted {
            json!("")
        } else if !parts.is_empty() {
            let text = (!message.content.is_empty()).then(|| text_part(&message.content));
            Value::Array(text.into_iter().chain(parts).collect())
        } else if message.content.is_empty() && !calls.is_empty() {
            Value::Null
        } else {
            json!(message.content)
        };
        let mut object = Map::new();
        object.insert("role".into(), json!(role_name(message.role)));
        object.insert("content".into(), content);
        if !redacted && !message.name.is_empty() {
            object.insert("name".into(), json!(message.name));
        }
        if message.role == Role::Tool && !message.tool_call_id.is_empty() {
            object.insert("tool_call_id".into(), json!(message.tool_call_id));
        }
        if !calls.is_empty() {
            object.insert("tool_calls".into(), Value::Array(calls));
        }
        out.push(Value::Object(object));
    }
    out.extend(results);
    out
}

/// The system prompt as the first OpenAI message.
pub fn openai_system(prompt: &str) -> Value {
    json!({ "role": "system", "content": prompt })
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
        Role::Developer => "developer",
    }
}

fn role_title(role: Role) -> &'static str {
    match role {
        Role::System => "System",
        Role::User => "User",
        Role::Assistant => "Assistant",
        Role::Tool => "Tool",
        Role::Developer => "Developer",
    }
}

fn markdown_block(block: &ContentBlock) -> String {
    match block {
        ContentBlock::Text { text, .. } => text.clone(),
        ContentBlock::Thinking { thinking, .. } => {
            format!("<details><summary>Thinking</summary>\n\n{thinking}\n\n</details>")
        }
        ContentBlock::RedactedThinking { .. } => {
            "<details><summary>Thinking (redacted)</summary></details>".to_owned()
        }
        ContentBlock::Image { url, .. } if !url.is_empty() => format!("![image]({url})"),
        ContentBlock::Image {
            media_type, data, ..
        } => format!("_[image: {media_type}, {} bytes]_", data.len()),
        ContentBlock::ToolUse {
            id, name, input, ..
        } => markdown_tool_call(name, id, input),
        ContentBlock::ToolResult {
            tool_use_id,
            content,
            is_error,
        } => {
            let error = if *is_error { " — error" } else { "" };
            format!(
                "**Tool result** (`{tool_use_id}`){error}\n{}",
                fenced("", content)
            )
        }
        ContentBlock::Json { kind, json } => format!("**{kind}** block\n{}", fenced("json", json)),
    }
}

fn markdown_tool_call(name: &str, id: &str, arguments: &str) -> String {
    format!(
        "**Tool call** `{name}` (`{id}`)\n{}",
        fenced("json", arguments)
    )
}

/// `body` in a fenced code block whose fence is longer than any run of
/// backticks inside it (and at least three).
fn fenced(info: &str, body: &str) -> String {
    let longest_run = body.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat((longest_run + 1).max(3));
    format!("{fence}{info}\n{body}\n{fence}")
}

/// A text or image block as a content part; other blocks have none.
fn part(block: &ContentBlock) -> Option<Value> {
    match block {
        ContentBlock::Text { text, .. } => Some(text_part(text)),
        ContentBlock::Image {
            media_type,
            url,
            data,
        } => {
            let url = if url.is_empty() {
                format!("data:{media_type};base64,{}", STANDARD.encode(data))
            } else {
                url.clone()
            };
            Some(json!({ "type": "image_url", "image_url": { "url": url } }))
        }
        _ => None,
    }
}

fn text_part(text: &str) -> Value {
    json!({ "type": "text", "text": text })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Timestamp, ToolCall};

    fn message(role: Role, content: &str, blocks: Vec<ContentBlock>) -> Message {
        Message {
            content_blocks: blocks,
            ..Message::text(role, content)
        }
    }

    fn session(title: &str, user: &str, prompt: &str) -> Session {
        Session {
            id: "s1".into(),
            title: title.into(),
            system_prompt: prompt.into(),
            user: user.into(),
            metadata: Default::default(),
            summary_message_id: String::new(),
            revision: 1,
            create_time: Timestamp(1_700_000_000_000_000),
            update_time: Timestamp(1_700_000_000_000_000),
            parent_session_id: String::new(),
            parent_sequence: 0,
            active_run_id: String::new(),
            run_expire_time: Timestamp(0),
            next_sequence: 0,
            expire_time: Timestamp(0),
        }
    }

    fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
        let (id, name, arguments) = (id.into(), name.into(), arguments.into());
        ToolCall {
            id,
            name,
            arguments,
            signature: String::new(),
        }
    }

    fn thinking(text: &str) -> ContentBlock {
        let (thinking, signature) = (text.into(), "sig".into());
        ContentBlock::Thinking {
            thinking,
            signature,
        }
    }

    fn tool_result(id: &str, content: &str, is_error: bool) -> ContentBlock {
        let (tool_use_id, content) = (id.into(), content.into());
        ContentBlock::ToolResult {
            tool_use_id,
            content,
            is_error,
        }
    }

    fn image(media_type: &str, url: &str, data: &[u8]) -> ContentBlock {
        let (media_type, url, data) = (media_type.into(), url.into(), data.to_vec());
        ContentBlock::Image {
            media_type,
            url,
            data,
        }
    }

    #[test]
    fn header_has_title_or_id_user_time_and_system_prompt() {
        assert_eq!(
            markdown_header(&session("Trip", "ann", "Be brief.")),
            "# Trip\n\nSession `s1` · user `ann` · created 2023-11-14T22:13:20Z\n\n\
             ## System\n\nBe brief.\n\n"
        );
        assert_eq!(
            markdown_header(&session("", "", "")),
            "# s1\n\nSession `s1` · created 2023-11-14T22:13:20Z\n\n"
        );
    }

    #[test]
    fn headings_show_role_name_and_tool_call() {
        let mut named = Message::text(Role::User, "hi");
        named.name = "ann".into();
        assert_eq!(markdown_message(&named, false), "## User (ann)\n\nhi\n\n");

        let mut tool = Message::text(Role::Tool, "boom");
        tool.tool_call_id = "call_1".into();
        tool.tool_error = true;
        assert_eq!(
            markdown_message(&tool, false),
            "## Tool · `call_1` (error)\n\n```\nboom\n```\n\n",
            "a tool's plain output is fenced, like a tool_result block"
        );
        let developer = Message::text(Role::Developer, "");
        assert_eq!(markdown_message(&developer, false), "## Developer\n\n");

        let mut cut = Message::text(Role::Assistant, "The answer is");
        cut.incomplete = true;
        assert_eq!(
            markdown_message(&cut, false),
            "## Assistant (incomplete)\n\nThe answer is\n\n"
        );
    }

    #[test]
    fn thinking_is_collapsed_and_redacted_thinking_hidden() {
        let redacted = ContentBlock::RedactedThinking {
            data: "secret".into(),
        };
        let text = ContentBlock::Text {
            text: "Answer.".into(),
            signature: String::new(),
        };
        let m = message(Role::Assistant, "", vec![thinking("hmm"), redacted, text]);
        let md = markdown_message(&m, false);
        assert_eq!(
            md,
            "## Assistant\n\n<details><summary>Thinking</summary>\n\nhmm\n\n</details>\n\n\
             <details><summary>Thinking (redacted)</summary></details>\n\nAnswer.\n\n"
        );
        assert!(!md.contains("secret") && !md.contains("sig"));
    }

    #[test]
    fn fences_outgrow_embedded_backticks() {
        assert_eq!(fenced("", "x"), "```\nx\n```");
        assert_eq!(
            fenced("json", "a ```` b `` c"),
            "`````json\na ```` b `` c\n`````"
        );
        let mut m = Message::text(Role::Assistant, "");
        m.tool_calls.push(call("c1", "run", "```\nrm -rf\n```"));
        assert_eq!(
            markdown_message(&m, false),
            "## Assistant\n\n**Tool call** `run` (`c1`)\n````json\n```\nrm -rf\n```\n````\n\n"
        );
    }

    #[test]
    fn blocks_render_in_order() {
        let json = ContentBlock::Json {
            kind: "citation".into(),
            json: "{\"a\":1}".into(),
        };
        let blocks = vec![
            image("image/png", "", &[1, 2, 3]),
            tool_result("t1", "nope", true),
            json,
        ];
        assert_eq!(
            markdown_message(&message(Role::User, "", blocks), false),
            "## User\n\n_[image: image/png, 3 bytes]_\n\n\
             **Tool result** (`t1`) — error\n```\nnope\n```\n\n\
             **citation** block\n```json\n{\"a\":1}\n```\n\n"
        );
    }

    #[test]
    fn redaction_keeps_roles_and_tool_ids_only() {
        let mut m = Message::text(Role::Assistant, "private");
        m.name = "bot".into();
        m.tool_calls
            .push(call("c1", "search", "{\"q\":\"private\"}"));
        assert_eq!(
            markdown_message(&m, true),
            "## Assistant (bot)\n\n_[redacted]_\n\n"
        );
        let expected = json!({
            "role": "assistant",
            "content": "",
            "tool_calls": [{
                "id": "c1",
                "type": "function",
                "function": { "name": "search", "arguments": "{}" },
            }],
        });
        assert_eq!(openai_messages(&m, true), vec![expected]);

        let results = message(Role::User, "", vec![tool_result("c1", "private", false)]);
        let expected = json!({ "role": "tool", "tool_call_id": "c1", "content": "" });
        assert_eq!(openai_messages(&results, true), vec![expected]);
    }

    #[test]
    fn tool_calls_keep_malformed_arguments_verbatim() {
        let tool_use = ContentBlock::ToolUse {
            id: "u1".into(),
            name: "b".into(),
            input: "[1, 2".into(),
            signature: String::new(),
        };
        let mut m = message(Role::Assistant, "", vec![tool_use]);
        m.tool_calls.push(call("c1", "a", "{\"x\": tru"));
        let out = openai_messages(&m, false);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0]["content"], Value::Null);
        let calls = &out[0]["tool_calls"];
        assert_eq!(calls[0]["function"]["arguments"], "{\"x\": tru");
        assert_eq!(calls[1]["id"], "u1");
        assert_eq!(calls[1]["function"]["arguments"], "[1, 2");
    }

    #[test]
    fn nul_survives_a_json_round_trip() -> serde_json::Result<()> {
        let m = Message::text(Role::User, "a\u{0}b");
        let text = serde_json::to_string(&openai_messages(&m, false))?;
        assert!(text.contains("a\\u0000b"));
        let back: Vec<Value> = serde_json::from_str(&text)?;
        assert_eq!(back[0]["content"], "a\u{0}b");
        Ok(())
    }

    #[test]
    fn tool_results_become_tool_messages() {
        let only = message(
            Role::User,
            "",
            vec![tool_result("t1", "42", false), tool_result("t2", "7", true)],
        );
        let expected = vec![
            json!({ "role": "tool", "tool_call_id": "t1", "content": "42" }),
            json!({ "role": "tool", "tool_call_id": "t2", "content": "7" }),
        ];
        assert_eq!(openai_messages(&only, false), expected);

        let mixed = message(
            Role::User,
            "and then?",
            vec![tool_result("t1", "42", false)],
        );
        let out = openai_messages(&mixed, false);
        assert_eq!(out[0], json!({ "role": "user", "content": "and then?" }));
        assert_eq!(out[1]["tool_call_id"], "t1");

        let mut tool = Message::text(Role::Tool, "ok");
        tool.tool_call_id = "c1".into();
        let expected = json!({ "role": "tool", "content": "ok", "tool_call_id": "c1" });
        assert_eq!(openai_messages(&tool, false), vec![expected]);
    }

    #[test]
    fn images_become_parts_after_the_content() {
        let blocks = vec![
            image("image/png", "", b"png"),
            thinking("skip"),
            image("", "https://x/y.jpg", &[]),
        ];
        let expected = json!([
            { "type": "text", "text": "Look:" },
            { "type": "image_url", "image_url": { "url": "data:image/png;base64,cG5n" } },
            { "type": "image_url", "image_url": { "url": "https://x/y.jpg" } },
        ]);
        let m = message(Role::User, "Look:", blocks);
        assert_eq!(openai_messages(&m, false)[0]["content"], expected);
    }

    #[test]
    fn empty_messages_keep_their_position() {
        let m = message(Role::Assistant, "", vec![thinking("hmm")]);
        let expected = json!({ "role": "assistant", "content": "" });
        assert_eq!(openai_messages(&m, false), vec![expected]);
        let system = json!({ "role": "system", "content": "Be brief." });
        assert_eq!(openai_system("Be brief."), system);
    }
}
