//! Transcripts: Markdown and OpenAI JSON.

use super::*;

crate::backend_tests!(
    transcripts_render_markdown_and_openai_json,
    large_transcripts_stream_in_chunks,
);

async fn transcripts_render_markdown_and_openai_json(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let history = vec![
        user("Where to go?"),
        pb::Message {
            content_blocks: vec![
                thinking("the user likes mountains"),
                text_block("Try the Alps."),
            ],
            ..assistant("")
        },
        pb::Message {
            tool_calls: vec![
                tool_call("call_1", "get_weather", r#"{"city": "Zermatt"}"#),
                tool_call("call_2", "get_news", r#"{"topic": "Zerm"#),
            ],
            ..assistant("")
        },
        tool_result("call_1", "sunny"),
        user("my passport is P123SECRET"),
        assistant("nul\u{0}inside and a \\ backslash"),
    ];
    client
        .create_session(pb::CreateSessionRequest {
            session_id: "tr".into(),
            title: "Trip planning".into(),
            system_prompt: "You are terse.".into(),
            user: "alice".into(),
            initial_history: history,
            ..Default::default()
        })
        .await
        .unwrap();
    let stored = all_messages(&mut client, "tr").await;
    redact(&mut client, "tr", &stored[4].id, "").await.unwrap();

    // Markdown.
    let markdown = transcript(&mut client, "tr", pb::TranscriptFormat::Markdown).await;
    assert!(markdown.starts_with("# Trip planning\n"), "{markdown}");
    assert!(
        markdown.contains("## System\n\nYou are terse.\n"),
        "{markdown}"
    );
    let headings: Vec<&str> = markdown.lines().filter(|l| l.starts_with("## ")).collect();
    let expected = [
        "## System",
        "## User",
        "## Assistant",
        "## Assistant",
        "## Tool",
        "## User",
        "## Assistant",
    ];
    assert_eq!(headings.len(), expected.len(), "{markdown}");
    for (heading, prefix) in headings.iter().zip(expected) {
        assert!(heading.starts_with(prefix), "{heading:?} is not {prefix:?}");
    }
    let details = markdown.find("<details>").expect("thinking is collapsed");
    let thought = markdown.find("the user likes mountains").unwrap();
    let closed = markdown.find("</details>").unwrap();
    assert!(details < thought && thought < closed, "{markdown}");
    assert!(markdown.contains("Try the Alps."));
    assert!(
        markdown.contains("**Tool call** `get_weather`"),
        "{markdown}"
    );
    assert!(markdown.contains("**Tool call** `get_news`"), "{markdown}");
    let lines: Vec<&str> = markdown.lines().collect();
    for arguments in [r#"{"city": "Zermatt"}"#, r#"{"topic": "Zerm"#] {
        let at = lines
            .iter()
            .position(|l| *l == arguments)
            .unwrap_or_else(|| panic!("arguments {arguments:?} on a line of their own"));
        assert!(lines[at - 1].starts_with("```"), "{markdown}");
        assert!(lines[at + 1].starts_with("```"), "{markdown}");
    }
    assert!(markdown.contains("sunny"));
    assert!(markdown.contains("_[redacted]_"), "{markdown}");
    assert!(!markdown.contains("P123SECRET"));

    // OpenAI Chat Completions JSON.
    let openai = transcript(&mut client, "tr", pb::TranscriptFormat::OpenaiJson).await;
    let array: Vec<Value> = serde_json::from_str(&openai).expect("a JSON array");
    assert_eq!(array.len(), 7, "{openai}");
    assert_eq!(
        array[0],
        json!({"role": "system", "content": "You are terse."})
    );
    assert_eq!(array[1], json!({"role": "user", "content": "Where to go?"}));
    assert_eq!(array[2]["role"], "assistant");
    let thought_free = array[2].to_string();
    assert!(thought_free.contains("Try the Alps."), "{thought_free}");
    assert!(!thought_free.contains("mountains"), "thinking is omitted");
    assert_eq!(array[3]["role"], "assistant");
    assert_eq!(
        array[3]["tool_calls"],
        json!([
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": r#"{"city": "Zermatt"}"#}},
            {"id": "call_2", "type": "function",
             "function": {"name": "get_news", "arguments": r#"{"topic": "Zerm"#}},
        ])
    );
    assert_eq!(array[4]["role"], "tool");
    assert_eq!(array[4]["tool_call_id"], "call_1");
    assert_eq!(array[4]["content"], "sunny");
    assert_eq!(array[5]["role"], "user");
    assert_eq!(array[5]["content"], "");
    assert!(!openai.contains("P123SECRET"));
    assert_eq!(
        array[6],
        json!({"role": "assistant", "content": "nul\u{0}inside and a \\ backslash"})
    );

    // Without a prompt there is no system message.
    client
        .create_session(pb::CreateSessionRequest {
            session_id: "bare".into(),
            initial_history: vec![user("hi")],
            ..Default::default()
        })
        .await
        .unwrap();
    let bare = transcript(&mut client, "bare", pb::TranscriptFormat::OpenaiJson).await;
    let bare: Value = serde_json::from_str(&bare).unwrap();
    assert_eq!(bare, json!([{"role": "user", "content": "hi"}]));
    let bare_markdown = transcript(&mut client, "bare", pb::TranscriptFormat::Markdown).await;
    assert!(!bare_markdown.contains("## System"), "{bare_markdown}");
    assert!(bare_markdown.contains("## User"), "{bare_markdown}");

    // Errors.
    for format in [pb::TranscriptFormat::Unspecified as i32, 99] {
        let bad = transcript_chunks(&mut client, "tr", format)
            .await
            .unwrap_err();
        assert_field(&bad, Code::InvalidArgument, "format");
    }
    let ghost = transcript_chunks(&mut client, "ghost", pb::TranscriptFormat::Markdown.into())
        .await
        .unwrap_err();
    assert_eq!(ghost.code(), Code::NotFound);
    server.stop().await.unwrap();
}

async fn large_transcripts_stream_in_chunks(backend: Backend) {
    const MESSAGES: usize = 3_000;
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let body = |i: usize| format!("{i:05} {}", "x".repeat(1_018));
    let history: Vec<pb::Message> = (0..MESSAGES)
        .map(|i| {
            if i % 2 == 0 {
                user(&body(i))
            } else {
                assistant(&body(i))
            }
        })
        .collect();
    client
        .create_session(pb::CreateSessionRequest {
            session_id: "big".into(),
            title: "Big".into(),
            system_prompt: "Be long.".into(),
            initial_history: history,
            ..Default::default()
        })
        .await
        .unwrap();

    let chunks = transcript_chunks(&mut client, "big", pb::TranscriptFormat::OpenaiJson.into())
        .await
        .unwrap();
    assert!(chunks.len() > 1, "{} chunk(s)", chunks.len());
    let array: Vec<Value> =
        serde_json::from_slice(&chunks.concat()).expect("the chunks form one JSON array");
    assert_eq!(array.len(), MESSAGES + 1);
    assert_eq!(array[0]["content"], "Be long.");
    for (i, message) in array[1..].iter().enumerate() {
        assert_eq!(
            message["content"].as_str(),
            Some(body(i).as_str()),
            "message {i}"
        );
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        assert_eq!(message["role"], role);
    }

    let chunks = transcript_chunks(&mut client, "big", pb::TranscriptFormat::Markdown.into())
        .await
        .unwrap();
    assert!(chunks.len() > 1, "{} chunk(s)", chunks.len());
    let markdown = String::from_utf8(chunks.concat()).unwrap();
    let users = markdown.lines().filter(|l| *l == "## User").count();
    let assistants = markdown.lines().filter(|l| *l == "## Assistant").count();
    assert_eq!((users, assistants), (MESSAGES / 2, MESSAGES / 2));
    assert!(markdown.contains(&body(0)));
    assert!(markdown.contains(&body(MESSAGES - 1)));
    server.stop().await.unwrap();
}
