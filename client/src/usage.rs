//! Providers' usage objects onto [`ProviderCall`](v1::ProviderCall)'s
//! billing buckets.
//!
//! The buckets nest: `prompt_tokens` counts every input token, and
//! `cached_input_tokens` (read from the provider's prompt cache) and
//! `cache_creation_input_tokens` (written to it) are parts of it;
//! `completion_tokens` counts every output token, and `reasoning_tokens` is a
//! part of it. Providers report them differently: OpenAI's `prompt_tokens`
//! (or `input_tokens`) already includes its cache reads and writes, while
//! Anthropic's `input_tokens` excludes both.

use std::time::Duration;

use serde_json::Value;

use crate::client::Client;
use crate::error::Result;
use crate::v1;

impl v1::ProviderCall {
    /// Fills the token buckets, the total and `usage_json` from an OpenAI
    /// usage object, of either API:
    ///
    /// - Chat Completions: `prompt_tokens` (cache reads and writes included),
    ///   `completion_tokens` (reasoning included),
    ///   `prompt_tokens_details.cached_tokens` and `.cache_write_tokens`,
    ///   `completion_tokens_details.reasoning_tokens`;
    /// - Responses: `input_tokens`, `output_tokens`,
    ///   `input_tokens_details.cached_tokens` and `.cache_write_tokens`,
    ///   `output_tokens_details.reasoning_tokens`.
    ///
    /// `cache_write_tokens` (only models that bill cache writes report it)
    /// becomes `cache_creation_input_tokens`. `total_tokens` becomes prompt +
    /// completion, and `usage_json` the object as serialized by
    /// `serde_json`. Absent or null fields count 0; a null `usage` (a stream
    /// without usage) sets every bucket to 0 and leaves `usage_json` empty.
    /// Provider, model, cost and request id stay as they were.
    ///
    /// ```
    /// use serde_json::json;
    /// use sessionstore_client::v1::ProviderCall;
    ///
    /// // response["usage"] of a Chat Completions response.
    /// let usage = json!({
    ///     "prompt_tokens": 2006,
    ///     "completion_tokens": 300,
    ///     "total_tokens": 2306,
    ///     "prompt_tokens_details": {"cached_tokens": 1920},
    ///     "completion_tokens_details": {"reasoning_tokens": 192}
    /// });
    /// let call = ProviderCall::new("openai", "o4-mini").with_openai_usage(&usage);
    /// assert_eq!((call.prompt_tokens, call.cached_input_tokens), (2006, 1920));
    /// assert_eq!((call.completion_tokens, call.reasoning_tokens), (300, 192));
    /// assert_eq!(call.total_tokens, 2306);
    /// ```
    pub fn with_openai_usage(mut self, usage: &Value) -> Self {
        // Chat Completions names its counts prompt/completion, the Responses
        // API input/output; a usage object has one pair or the other.
        let chat = ["prompt_tokens", "completion_tokens"]
            .iter()
            .any(|key| usage.get(key).is_some_and(|v| !v.is_null()));
        let (input, output) = if chat {
            ("prompt_tokens", "completion_tokens")
        } else {
            ("input_tokens", "output_tokens")
        };
        self.prompt_tokens = count(usage, &[input]);
        self.completion_tokens = count(usage, &[output]);
        let details = format!("{input}_details");
        self.cached_input_tokens = count(usage, &[&details, "cached_tokens"]);
        self.cache_creation_input_tokens = count(usage, &[&details, "cache_write_tokens"]);
        self.reasoning_tokens = count(usage, &[&format!("{output}_details"), "reasoning_tokens"]);
        self.total_tokens = self.prompt_tokens.saturating_add(self.completion_tokens);
        self.usage_json = usage_json(usage);
        self
    }

    /// Fills the token buckets, the total and `usage_json` from an Anthropic
    /// Messages usage object.
    ///
    /// Anthropic's `input_tokens` excludes the tokens read from and written
    /// to the prompt cache, so `prompt_tokens` becomes `input_tokens +
    /// cache_read_input_tokens + cache_creation_input_tokens`;
    /// `cached_input_tokens` is `cache_read_input_tokens`,
    /// `cache_creation_input_tokens` is Anthropic's own, and
    /// `completion_tokens` is `output_tokens` (thinking included; Anthropic
    /// reports no separate count, so `reasoning_tokens` is 0).
    /// `total_tokens` becomes prompt + completion and `usage_json` the
    /// object as serialized by `serde_json`. Absent or null fields count 0;
    /// a null `usage` sets every bucket to 0 and leaves `usage_json` empty.
    /// Provider, model, cost and request id stay as they were.
    ///
    /// ```
    /// use serde_json::json;
    /// use sessionstore_client::v1::ProviderCall;
    ///
    /// // message.usage of a Messages response.
    /// let usage = json!({
    ///     "input_tokens": 50,
    ///     "cache_creation_input_tokens": 1253,
    ///     "cache_read_input_tokens": 10240,
    ///     "output_tokens": 503
    /// });
    /// let call = ProviderCall::new("anthropic", "claude-sonnet-4-5").with_anthropic_usage(&usage);
    /// assert_eq!(call.prompt_tokens, 50 + 10240 + 1253);
    /// assert_eq!(call.cached_input_tokens, 10240);
    /// assert_eq!(call.cache_creation_input_tokens, 1253);
    /// assert_eq!(call.completion_tokens, 503);
    /// ```
    pub fn with_anthropic_usage(mut self, usage: &Value) -> Self {
        let uncached = count(usage, &["input_tokens"]);
        self.cached_input_tokens = count(usage, &["cache_read_input_tokens"]);
        self.cache_creation_input_tokens = count(usage, &["cache_creation_input_tokens"]);
        self.prompt_tokens = uncached
            .saturating_add(self.cached_input_tokens)
            .saturating_add(self.cache_creation_input_tokens);
        self.completion_tokens = count(usage, &["output_tokens"]);
        self.reasoning_tokens = 0;
        self.total_tokens = self.prompt_tokens.saturating_add(self.completion_tokens);
        self.usage_json = usage_json(usage);
        self
    }

    /// The prompt-cache buckets, for providers without a `with_*_usage`
    /// helper: input tokens read from the cache and written to it, both
    /// parts of `prompt_tokens`.
    pub fn with_cache_tokens(mut self, read: i64, written: i64) -> Self {
        self.cached_input_tokens = read;
        self.cache_creation_input_tokens = written;
        self
    }

    /// The output tokens spent on reasoning, a part of `completion_tokens`.
    pub fn with_reasoning_tokens(mut self, reasoning_tokens: i64) -> Self {
        self.reasoning_tokens = reasoning_tokens;
        self
    }

    /// The provider's usage object as it came (stored verbatim, never parsed).
    pub fn with_usage_json(mut self, usage_json: impl Into<String>) -> Self {
        self.usage_json = usage_json.into();
        self
    }

    /// The upstream call's wall time.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use sessionstore_client::v1::ProviderCall;
    ///
    /// let started = Instant::now();
    /// // ... call the model ...
    /// let call = ProviderCall::new("openai", "gpt-4o").with_duration(started.elapsed());
    /// assert!(call.duration.is_some());
    /// # let call = ProviderCall::new("openai", "gpt-4o").with_duration(Duration::from_millis(1500));
    /// # assert_eq!(call.duration, Some(prost_types::Duration { seconds: 1, nanos: 500_000_000 }));
    /// ```
    pub fn with_duration(mut self, duration: Duration) -> Self {
        self.duration = Some(prost_types::Duration::try_from(duration).unwrap_or(
            prost_types::Duration {
                seconds: i64::MAX,
                nanos: 999_999_999,
            },
        ));
        self
    }
}

/// The count at `path` in `usage`: 0 when absent, null or not a number;
/// counts past `i64::MAX` saturate.
fn count(usage: &Value, path: &[&str]) -> i64 {
    let mut value = usage;
    for key in path {
        match value.get(key) {
            Some(inner) => value = inner,
            None => return 0,
        }
    }
    match value {
        Value::Number(number) => number
            .as_i64()
            .or_else(|| number.as_u64().map(|_| i64::MAX))
            // Float-to-int `as` saturates (and makes NaN 0).
            .or_else(|| number.as_f64().map(|f| f as i64))
            .unwrap_or(0),
        _ => 0,
    }
}

/// The usage object as text, or nothing for a null one.
fn usage_json(usage: &Value) -> String {
    if usage.is_null() {
        String::new()
    } else {
        usage.to_string()
    }
}

impl Client {
    /// Sums the tenant's recorded provider calls (`SummarizeUsage`): one
    /// page of rows, in total or grouped, as the request asks. Follow
    /// `next_page_token` for more. Retried (it only reads).
    pub async fn summarize_usage(
        &self,
        request: v1::SummarizeUsageRequest,
    ) -> Result<v1::SummarizeUsageResponse> {
        self.unary(
            "SummarizeUsage",
            request,
            true,
            |mut raw, request| async move { raw.summarize_usage(request).await },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The buckets of a call, in the order prompt, cached, cache creation,
    /// completion, reasoning, total.
    fn buckets(call: &v1::ProviderCall) -> [i64; 6] {
        [
            call.prompt_tokens,
            call.cached_input_tokens,
            call.cache_creation_input_tokens,
            call.completion_tokens,
            call.reasoning_tokens,
            call.total_tokens,
        ]
    }

    #[test]
    fn openai_chat_completions_with_cached_and_reasoning_tokens() {
        // A Chat Completions usage of a reasoning model with a prompt-cache hit.
        let usage = json!({
            "prompt_tokens": 2006,
            "completion_tokens": 300,
            "total_tokens": 2306,
            "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 192,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0
            }
        });
        let call = v1::ProviderCall::new("openai", "o4-mini")
            .with_cost_micros_usd(3_400)
            .with_request_id("gw-1")
            .with_openai_usage(&usage);
        // prompt_tokens 2006 already includes the 1920 cached; completion 300
        // includes the 192 reasoning; total 2006 + 300 = 2306, as OpenAI says.
        assert_eq!(buckets(&call), [2006, 1920, 0, 300, 192, 2306]);
        assert_eq!(
            call.usage_json,
            serde_json::to_string(&usage).unwrap_or_default()
        );
        // What was set before stays.
        assert_eq!(
            (call.provider.as_str(), call.model.as_str()),
            ("openai", "o4-mini")
        );
        assert_eq!(
            (call.cost_micros_usd, call.request_id.as_str()),
            (3_400, "gw-1")
        );
    }

    #[test]
    fn openai_responses_api() {
        // A Responses API usage (input/output instead of prompt/completion)
        // of a model that reports and bills cache writes.
        let usage = json!({
            "input_tokens": 1547,
            "input_tokens_details": {
                "cached_tokens": 1024,
                "cache_write_tokens": 384,
                "cache_write_tokens_details": {"ttl_30m_tokens": 384, "ttl_12h_tokens": 0}
            },
            "output_tokens": 941,
            "output_tokens_details": {"reasoning_tokens": 704},
            "total_tokens": 2488
        });
        let call = v1::ProviderCall::new("openai", "gpt-5.6").with_openai_usage(&usage);
        // input 1547 includes the 1024 read from the cache and the 384
        // written to it (1024 + 384 = 1408 <= 1547); output 941 includes 704
        // reasoning; total 1547 + 941 = 2488.
        assert_eq!(buckets(&call), [1547, 1024, 384, 941, 704, 2488]);
        assert_eq!(call.usage_json, usage.to_string());
    }

    #[test]
    fn openai_chat_completions_with_cache_writes() {
        // A Chat Completions call that wrote its prompt to the cache.
        let usage = json!({
            "prompt_tokens": 4000,
            "completion_tokens": 20,
            "total_tokens": 4020,
            "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 3968}
        });
        let call = v1::ProviderCall::new("openai", "gpt-5.6").with_openai_usage(&usage);
        // 3968 of the 4000 prompt tokens written, none read; 4000 + 20 = 4020.
        assert_eq!(buckets(&call), [4000, 0, 3968, 20, 0, 4020]);
    }

    #[test]
    fn openai_without_details() {
        // An older model (or an OpenAI-compatible server): no details at
        // all, or null ones.
        let bare = json!({"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11});
        let call = v1::ProviderCall::new("openai", "gpt-4o").with_openai_usage(&bare);
        // Nothing cached, no reasoning: 9 + 2 = 11.
        assert_eq!(buckets(&call), [9, 0, 0, 2, 0, 11]);

        let nulls = json!({
            "prompt_tokens": 9,
            "completion_tokens": 2,
            "total_tokens": 11,
            "prompt_tokens_details": null,
            "completion_tokens_details": {"reasoning_tokens": null}
        });
        let call = v1::ProviderCall::new("openai", "gpt-4o").with_openai_usage(&nulls);
        assert_eq!(buckets(&call), [9, 0, 0, 2, 0, 11]);
    }

    #[test]
    fn anthropic_with_cache_reads_and_writes() {
        // A Messages usage reading 10240 tokens from the cache and writing
        // 1253 to it, with the 5-minute/1-hour breakdown beside.
        let usage = json!({
            "input_tokens": 50,
            "cache_creation_input_tokens": 1253,
            "cache_read_input_tokens": 10240,
            "cache_creation": {"ephemeral_5m_input_tokens": 1253, "ephemeral_1h_input_tokens": 0},
            "output_tokens": 503,
            "server_tool_use": null,
            "service_tier": "standard"
        });
        let call = v1::ProviderCall::new("anthropic", "claude-sonnet-4-5")
            .with_cost_micros_usd(9_000)
            .with_anthropic_usage(&usage);
        // input_tokens 50 excludes the cache: prompt = 50 + 10240 + 1253 = 11543;
        // cached 10240, cache creation 1253; completion 503 (thinking
        // included, no separate count: reasoning 0); total 11543 + 503 = 12046.
        assert_eq!(buckets(&call), [11543, 10240, 1253, 503, 0, 12046]);
        assert_eq!(call.usage_json, usage.to_string());
        assert_eq!(call.cost_micros_usd, 9_000);
        assert_eq!(call.provider, "anthropic");
    }

    #[test]
    fn anthropic_with_nulls_and_absent_fields() {
        // No caching: cache_creation_input_tokens null, cache_read_input_tokens absent.
        let usage = json!({
            "input_tokens": 12,
            "cache_creation_input_tokens": null,
            "output_tokens": 7
        });
        let call =
            v1::ProviderCall::new("anthropic", "claude-haiku-4-5").with_anthropic_usage(&usage);
        // prompt = 12 + 0 + 0 = 12; total 12 + 7 = 19.
        assert_eq!(buckets(&call), [12, 0, 0, 7, 0, 19]);
    }

    #[test]
    fn a_null_usage_clears_the_buckets() {
        let call = v1::ProviderCall::new("openai", "gpt-4o")
            .with_tokens(5, 5)
            .with_openai_usage(&Value::Null);
        assert_eq!(buckets(&call), [0; 6]);
        assert_eq!(call.usage_json, "");
        let call = v1::ProviderCall::new("anthropic", "claude").with_anthropic_usage(&Value::Null);
        assert_eq!(buckets(&call), [0; 6]);
    }

    #[test]
    fn counts_beyond_i64_saturate_and_junk_counts_zero() {
        let usage = json!({
            "prompt_tokens": u64::MAX,
            "completion_tokens": "12",
            "prompt_tokens_details": {"cached_tokens": 3.0}
        });
        let call = v1::ProviderCall::new("openai", "gpt-4o").with_openai_usage(&usage);
        assert_eq!(buckets(&call), [i64::MAX, 3, 0, 0, 0, i64::MAX]);
    }

    #[test]
    fn manual_buckets_and_duration() {
        let call = v1::ProviderCall::new("mistral", "mistral-large")
            .with_tokens(100, 40)
            .with_cache_tokens(60, 0)
            .with_reasoning_tokens(10)
            .with_usage_json(r#"{"prompt_tokens":100}"#)
            .with_duration(Duration::from_millis(1500));
        assert_eq!((call.cached_input_tokens, call.reasoning_tokens), (60, 10));
        assert_eq!(call.usage_json, r#"{"prompt_tokens":100}"#);
        assert_eq!(
            call.duration,
            Some(prost_types::Duration {
                seconds: 1,
                nanos: 500_000_000
            })
        );
        let forever = v1::ProviderCall::new("x", "y").with_duration(Duration::MAX);
        assert_eq!(forever.duration.map(|d| d.seconds), Some(i64::MAX));
    }
}
