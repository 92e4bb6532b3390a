//! History for the next model: what an export for an [`ExportTarget`]
//! gives back, as pure functions over messages and their origins.
//!
//! 1. [`strip`]: reasoning the policy does not keep is removed (a block
//!    dropped, a signature cleared); kept reasoning stays byte for byte.
//! 2. [`strip`] too: a message left with no text, no block other than
//!    reasoning and no tool call is left out, unless it answers a tool call.
//! 3. [`Plan`]: tool pairing, judged once over the [`Shape`]s of what step
//!    2 left: a call is kept only if a result for it comes later, a result
//!    only if its call comes earlier; the calls of the last message with
//!    tool calls are kept when no assistant message follows it (pending).
//!    A message that pairing empties is left out as step 2 would.
//! 4. [`Plan::window`]: `max_messages` over the result, widened so it never
//!    starts on a tool result whose call it cuts off.
//!
//! An export reads its range twice: once for the shapes (small: ids and
//! flags), then again to send each message with its [`Decision`]. Storage
//! is never changed.

use std::collections::{HashMap, HashSet};

/// The hasher of the ids an export for a target looks up, several times
/// for each message (the calls' origins, the calls made, what a decision
/// drops): `foldhash`, seeded per process, where the standard SipHash was
/// about a tenth of the instructions such an export adds to a plain one.
pub type IdHasher = foldhash::fast::RandomState;

/// A set of ids (calls made, calls and results dropped).
pub type IdSet = HashSet<String, IdHasher>;

/// The origin of each of a session's provider calls, by call id.
pub type Origins = HashMap<String, Origin, IdHasher>;

use super::{ContentBlock, Error, Message, Result, Role};

/// Which reasoning an export keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReasoningPolicy {
    /// Reasoning whose origin has the target's provider and model.
    #[default]
    SameModel,
    /// Reasoning whose origin has the target's provider, any model.
    SameProvider,
    /// None.
    None,
}

/// The model an export is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportTarget {
    pub provider: String,
    pub model: String,
    pub reasoning: ReasoningPolicy,
}

/// Who produced a message: the provider and model of its call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub provider: String,
    pub model: String,
}

impl ExportTarget {
    /// Checks a target: a provider is required (`field` names the target
    /// in errors, e.g. `target`).
    pub fn new(
        field: &str,
        provider: String,
        model: String,
        reasoning: ReasoningPolicy,
    ) -> Result<Self> {
        if provider.is_empty() {
            return Err(Error::invalid(format!("{field}.provider"), "is required"));
        }
        Ok(ExportTarget {
            provider,
            model,
            reasoning,
        })
    }

    /// The target a provider request body uses without one: that
    /// provider, any of its models.
    pub fn provider_default(provider: &str) -> Self {
        ExportTarget {
            provider: provider.to_owned(),
            model: String::new(),
            reasoning: ReasoningPolicy::SameProvider,
        }
    }

    /// Whether reasoning of `origin` is kept. Providers compare
    /// case-insensitively, models exactly; no origin is never kept.
    pub fn keeps(&self, origin: Option<&Origin>) -> bool {
        let Some(origin) = origin else {
            return false;
        };
        let same_provider = origin.provider.eq_ignore_ascii_case(&self.provider);
        match self.reasoning {
            ReasoningPolicy::None => false,
            ReasoningPolicy::SameProvider => same_provider,
            ReasoningPolicy::SameModel => {
                same_provider && !self.model.is_empty() && origin.model == self.model
            }
        }
    }
}

/// Whether a block is reasoning: thinking, redacted thinking, or an
/// OpenAI reasoning item (a JSON block of type `reasoning`).
pub fn is_reasoning(block: &ContentBlock) -> bool {
    match block {
        ContentBlock::Thinking { .. } | ContentBlock::RedactedThinking { .. } => true,
        ContentBlock::Json { kind, .. } => kind == "reasoning",
        _ => false,
    }
}

/// Steps 1 and 2 for one message: its reasoning as the policy says, or
/// `None` when nothing is left to send.
pub fn strip(target: &ExportTarget, message: Message, origin: Option<&Origin>) -> Option<Message> {
    stripped(target, message, origin).map(|(message, _)| message)
}

/// [`strip`], and whether it changed the message (an unchanged message
/// can be sent as it is stored).
pub fn stripped(
    target: &ExportTarget,
    mut message: Message,
    origin: Option<&Origin>,
) -> Option<(Message, bool)> {
    let mut changed = false;
    if !target.keeps(origin) {
        let blocks = message.content_blocks.len();
        message.content_blocks.retain(|block| !is_reasoning(block));
        changed |= message.content_blocks.len() != blocks;
        for block in &mut message.content_blocks {
            match block {
                ContentBlock::Text { signature, .. } | ContentBlock::ToolUse { signature, .. } => {
                    changed |= !signature.is_empty();
                    signature.clear();
                }
                _ => {}
            }
        }
        for call in &mut message.tool_calls {
            changed |= !call.signature.is_empty();
            call.signature.clear();
        }
    }
    worth_sending(&message).then_some((message, changed))
}

/// Step 2's test: text, a block other than reasoning, a tool call, or an
/// answer to a tool call (whose output may be empty).
fn worth_sending(message: &Message) -> bool {
    !message.content.is_empty()
        || message
            .content_blocks
            .iter()
            .any(|block| !is_reasoning(block))
        || !message.tool_calls.is_empty()
        || !message.tool_call_id.is_empty()
}

/// What pairing needs of a message that step 2 kept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    pub sequence: i64,
    pub assistant: bool,
    /// Ids of its tool calls (`tool_calls`, then `tool_use` blocks).
    pub calls: Vec<String>,
    /// The call it answers as a tool message (`tool_call_id`).
    pub answers: Option<String>,
    /// Ids its `tool_result` blocks answer.
    pub result_blocks: Vec<String>,
    /// Whether it holds something besides calls and results: text, or a
    /// block that is neither reasoning, a call nor a result.
    pub other: bool,
}

impl Shape {
    /// The shape of a message as step 2 left it.
    pub fn of(sequence: i64, message: &Message) -> Self {
        let mut calls: Vec<String> = message.tool_calls.iter().map(|c| c.id.clone()).collect();
        let mut result_blocks = Vec::new();
        let mut other = !message.content.is_empty();
        for block in &message.content_blocks {
            match block {
                ContentBlock::ToolUse { id, .. } => calls.push(id.clone()),
                ContentBlock::ToolResult { tool_use_id, .. } => {
                    result_blocks.push(tool_use_id.clone());
                }
                block if is_reasoning(block) => {}
                _ => other = true,
            }
        }
        Shape {
            sequence,
            assistant: message.role == Role::Assistant,
            calls,
            answers: (!message.tool_call_id.is_empty()).then(|| message.tool_call_id.clone()),
            result_blocks,
            other,
        }
    }
}

/// What step 3 does to one message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// Calls to remove (their results are not in the export).
    pub drop_calls: IdSet,
    /// `tool_result` blocks to remove (their calls are not earlier).
    pub drop_result_blocks: IdSet,
}

impl Decision {
    /// Whether it leaves the message as it is.
    pub fn changes_nothing(&self) -> bool {
        self.drop_calls.is_empty() && self.drop_result_blocks.is_empty()
    }

    /// Applies the decision: removes the calls and result blocks it names,
    /// and leaves the message out if nothing worth sending remains.
    pub fn apply(&self, mut message: Message) -> Option<Message> {
        if !self.drop_calls.is_empty() {
            message
                .tool_calls
                .retain(|call| !self.drop_calls.contains(&call.id));
        }
        if !self.drop_calls.is_empty() || !self.drop_result_blocks.is_empty() {
            message.content_blocks.retain(|block| match block {
                ContentBlock::ToolUse { id, .. } => !self.drop_calls.contains(id),
                ContentBlock::ToolResult { tool_use_id, .. } => {
                    !self.drop_result_blocks.contains(tool_use_id)
                }
                _ => true,
            });
        }
        worth_sending(&message).then_some(message)
    }
}

/// Step 3 over a whole export: which messages go, and what each loses.
#[derive(Debug, Default)]
pub struct Plan {
    /// The messages that go, by sequence, in order, with their decisions
    /// (`None`: unchanged).
    kept: Vec<(i64, Option<Decision>)>,
}

impl Plan {
    /// Judges pairing once over `shapes` (the messages step 2 kept, in
    /// order).
    pub fn new(shapes: &[Shape]) -> Self {
        Plan::after(shapes, &IdSet::default())
    }

    /// As [`Plan::new`], for the rest of an export whose earlier messages
    /// made the calls in `made_before`.
    pub fn after(shapes: &[Shape], made_before: &IdSet) -> Self {
        // Where each call is made, and the last place each id is answered.
        let mut made_at: HashMap<&str, usize, IdHasher> = HashMap::default();
        let mut last_answer: HashMap<&str, usize, IdHasher> = HashMap::default();
        for (index, shape) in shapes.iter().enumerate() {
            for call in &shape.calls {
                made_at.entry(call.as_str()).or_insert(index);
            }
            for id in shape.answers.iter().chain(&shape.result_blocks) {
                last_answer.insert(id.as_str(), index);
            }
        }
        // The pending calls: those of the last message with tool calls,
        // when no assistant message follows it.
        let pending = shapes
            .iter()
            .rposition(|shape| !shape.calls.is_empty())
            .filter(|&last| !shapes[last + 1..].iter().any(|shape| shape.assistant));
        // Whether `id`, made at `index`, was made earlier than `at`.
        let call_before = |id: &str, at: usize| {
            made_at.get(id).is_some_and(|&made| made < at) || made_before.contains(id)
        };
        let mut kept = Vec::with_capacity(shapes.len());
        for (index, shape) in shapes.iter().enumerate() {
            let mut decision = Decision::default();
            if pending != Some(index) {
                for call in &shape.calls {
                    let answered_later =
                        last_answer.get(call.as_str()).is_some_and(|&at| at > index);
                    if !answered_later {
                        decision.drop_calls.insert(call.clone());
                    }
                }
            }
            if let Some(id) = &shape.answers
                && !call_before(id, index)
            {
                // A tool message whose call is not earlier is left out.
                continue;
            }
            for id in &shape.result_blocks {
                if !call_before(id, index) {
                    decision.drop_result_blocks.insert(id.clone());
                }
            }
            if decision.changes_nothing() {
                kept.push((shape.sequence, None));
                continue;
            }
            let calls_left = shape.calls.iter().any(|c| !decision.drop_calls.contains(c));
            let results_left = shape
                .result_blocks
                .iter()
                .any(|r| !decision.drop_result_blocks.contains(r));
            if shape.other || calls_left || results_left || shape.answers.is_some() {
                kept.push((shape.sequence, Some(decision)));
            }
        }
        Plan { kept }
    }

    /// Step 4: only the last `max_messages` (0: all), widened back to the
    /// call of any tool result the window would cut off. `shapes` are the
    /// ones the plan was made from.
    pub fn window(&mut self, shapes: &[Shape], max_messages: usize) {
        if max_messages == 0 || self.kept.len() <= max_messages {
            return;
        }
        let by_sequence: HashMap<i64, &Shape, IdHasher> =
            shapes.iter().map(|s| (s.sequence, s)).collect();
        let mut start = self.kept.len() - max_messages;
        loop {
            // The calls made inside the window so far.
            let made: HashSet<&str, IdHasher> = self.kept[start..]
                .iter()
                .filter_map(|(sequence, _)| by_sequence.get(sequence))
                .flat_map(|shape| shape.calls.iter().map(String::as_str))
                .collect();
            // A result in the window whose call is before it.
            let orphaned = self.kept[start..].iter().any(|(sequence, decision)| {
                by_sequence.get(sequence).is_some_and(|shape| {
                    let dropped = decision.as_ref().map(|d| &d.drop_result_blocks);
                    shape.answers.iter().any(|id| !made.contains(id.as_str()))
                        || shape.result_blocks.iter().any(|id| {
                            !made.contains(id.as_str()) && !dropped.is_some_and(|d| d.contains(id))
                        })
                })
            });
            if !orphaned || start == 0 {
                break;
            }
            start -= 1;
        }
        self.kept.drain(..start);
    }

    /// The first sequence that goes, if any.
    pub fn first_sequence(&self) -> Option<i64> {
        self.kept.first().map(|(sequence, _)| *sequence)
    }

    /// What happens to the message at `sequence`: `None` if it is left
    /// out, else its decision (`Some(None)`: sent as step 2 left it).
    pub fn decision(&self, sequence: i64) -> Option<Option<&Decision>> {
        self.kept
            .binary_search_by_key(&sequence, |(s, _)| *s)
            .ok()
            .map(|at| self.kept[at].1.as_ref())
    }

    /// How many messages go.
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    /// Whether nothing goes.
    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }
}

/// Step 3 in one pass, for an export without a window: each message is
/// sent as soon as its fate is known. A message with tool calls waits
/// until a result has answered each of them (in a normal conversation, the
/// next message or two); what follows it waits behind it, in order. What
/// still waits at the end is decided then: its unanswered calls are
/// dropped, except those of the last message with calls when no assistant
/// message follows it. The caller bounds what waits ([`Pairing::held_bytes`])
/// and, past its bound, judges the rest with a [`Plan`] instead
/// ([`Pairing::into_rest`]).
#[derive(Debug)]
pub struct Pairing<T> {
    /// Call ids made by messages already taken.
    made: IdSet,
    held: std::collections::VecDeque<Held<T>>,
    held_bytes: usize,
    taken: u64,
    /// The last message with tool calls, and whether an assistant message
    /// came after it.
    last_calls: Option<u64>,
    assistant_since: bool,
}

#[derive(Debug)]
struct Held<T> {
    item: T,
    at: u64,
    /// Its calls.
    calls: Vec<String>,
    /// Its calls no result has answered yet.
    open: Vec<String>,
    decision: Decision,
    size: usize,
}

impl<T> Default for Pairing<T> {
    fn default() -> Self {
        Pairing::new(IdSet::default())
    }
}

impl<T> Pairing<T> {
    /// Pairing that treats the calls in `made` as made before the first
    /// message it takes.
    pub fn new(made: IdSet) -> Self {
        Pairing {
            made,
            held: std::collections::VecDeque::new(),
            held_bytes: 0,
            taken: 0,
            last_calls: None,
            assistant_since: false,
        }
    }

    /// Takes the next message that step 2 kept (`item`, its `shape`, and
    /// its `size` for [`Pairing::held_bytes`]); returns the messages now
    /// decided, in order, each with its decision.
    pub fn push(
        &mut self,
        item: T,
        shape: Shape,
        size: usize,
    ) -> impl Iterator<Item = (T, Decision)> + '_ {
        let at = self.taken;
        self.taken += 1;
        let mut decision = Decision::default();
        // Results: kept if their call was made earlier; each answers the
        // waiting messages that made it.
        if let Some(id) = &shape.answers {
            if !self.made.contains(id) {
                return self.ready();
            }
            self.answer(id);
        }
        for id in &shape.result_blocks {
            if self.made.contains(id) {
                self.answer(id);
            } else {
                decision.drop_result_blocks.insert(id.clone());
            }
        }
        if shape.assistant {
            self.assistant_since = true;
        }
        if !shape.calls.is_empty() {
            self.last_calls = Some(at);
            self.assistant_since = false;
            self.made.extend(shape.calls.iter().cloned());
        }
        let keeps_something = shape.other
            || shape.answers.is_some()
            || !shape.calls.is_empty()
            || shape
                .result_blocks
                .iter()
                .any(|id| !decision.drop_result_blocks.contains(id));
        if !keeps_something {
            return self.ready();
        }
        self.held_bytes += size;
        self.held.push_back(Held {
            item,
            at,
            calls: shape.calls.clone(),
            open: shape.calls,
            decision,
            size,
        });
        self.ready()
    }

    fn answer(&mut self, id: &str) {
        for held in &mut self.held {
            held.open.retain(|open| open != id);
        }
    }

    /// The held messages at the front whose calls are all answered.
    fn ready(&mut self) -> impl Iterator<Item = (T, Decision)> + '_ {
        let ready = self
            .held
            .iter()
            .take_while(|held| held.open.is_empty())
            .count();
        self.held_bytes -= self
            .held
            .iter()
            .take(ready)
            .map(|held| held.size)
            .sum::<usize>();
        self.held
            .drain(..ready)
            .map(|held| (held.item, held.decision))
    }

    /// The bytes of the messages waiting.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// At the end: every waiting message, decided.
    pub fn finish(self) -> Vec<(T, Decision)> {
        let pending = self.last_calls.filter(|_| !self.assistant_since);
        self.held
            .into_iter()
            .map(|held| {
                let mut decision = held.decision;
                if Some(held.at) != pending {
                    decision.drop_calls.extend(held.open);
                }
                (held.item, decision)
            })
            .collect()
    }

    /// Gives up waiting: the waiting messages (to be judged again with
    /// what follows them) and the calls made before the first of them.
    pub fn into_rest(self) -> (Vec<T>, IdSet) {
        let mut made = self.made;
        let items: Vec<T> = self
            .held
            .into_iter()
            .map(|held| {
                for call in &held.calls {
                    made.remove(call);
                }
                held.item
            })
            .collect();
        (items, made)
    }
}

/// The whole of steps 1–4 over messages in memory (with their origins):
/// what an export for `target` sends. The streaming export does the same
/// in two passes; tests and small callers use this.
pub fn for_target(
    target: &ExportTarget,
    messages: impl IntoIterator<Item = (Message, Option<Origin>)>,
    max_messages: usize,
) -> Vec<Message> {
    let stripped: Vec<(i64, Message)> = (0_i64..)
        .zip(messages)
        .filter_map(|(sequence, (message, origin))| {
            strip(target, message, origin.as_ref()).map(|m| (sequence, m))
        })
        .collect();
    if max_messages == 0 {
        // In one pass, as an export without a window streams.
        let mut pairing = Pairing::default();
        let mut decided = Vec::new();
        for (sequence, message) in stripped {
            let shape = Shape::of(sequence, &message);
            decided.extend(pairing.push(message, shape, 1));
        }
        decided.extend(pairing.finish());
        return decided
            .into_iter()
            .filter_map(|(message, decision)| decision.apply(message))
            .collect();
    }
    let shapes: Vec<Shape> = stripped
        .iter()
        .map(|(sequence, message)| Shape::of(*sequence, message))
        .collect();
    let mut plan = Plan::new(&shapes);
    plan.window(&shapes, max_messages);
    stripped
        .into_iter()
        .filter_map(|(sequence, message)| match plan.decision(sequence)? {
            None => Some(message),
            Some(decision) => decision.apply(message),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ToolCall;

    fn origin(provider: &str, model: &str) -> Option<Origin> {
        Some(Origin {
            provider: provider.into(),
            model: model.into(),
        })
    }

    fn target(provider: &str, model: &str, reasoning: ReasoningPolicy) -> ExportTarget {
        ExportTarget {
            provider: provider.into(),
            model: model.into(),
            reasoning,
        }
    }

    fn claude() -> Option<Origin> {
        origin("anthropic", "claude-sonnet-4-5")
    }

    fn thinking(text: &str) -> ContentBlock {
        ContentBlock::Thinking {
            thinking: text.into(),
            signature: format!("sig-{text}"),
        }
    }

    fn text_block(text: &str, signature: &str) -> ContentBlock {
        ContentBlock::Text {
            text: text.into(),
            signature: signature.into(),
        }
    }

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "lookup".into(),
            arguments: "{}".into(),
            signature: format!("sig-{id}"),
        }
    }

    fn user(text: &str) -> Message {
        Message::text(Role::User, text)
    }

    fn assistant(text: &str) -> Message {
        Message::text(Role::Assistant, text)
    }

    fn calling(ids: &[&str]) -> Message {
        let mut m = assistant("");
        m.tool_calls = ids.iter().map(|id| call(id)).collect();
        m
    }

    fn result(id: &str) -> Message {
        let mut m = Message::text(Role::Tool, "out");
        m.tool_call_id = id.into();
        m
    }

    fn texts(messages: &[Message]) -> Vec<String> {
        messages
            .iter()
            .map(|m| {
                let calls: Vec<&str> = m.tool_calls.iter().map(|c| c.id.as_str()).collect();
                match (m.role, m.tool_call_id.as_str()) {
                    (Role::Tool, id) => format!("result {id}"),
                    _ if !calls.is_empty() => format!("calls {}", calls.join(",")),
                    _ => m.content.clone(),
                }
            })
            .collect()
    }

    /// Steps 1–3 judged with a [`Plan`] (two passes).
    fn planned(target: &ExportTarget, messages: Vec<(Message, Option<Origin>)>) -> Vec<Message> {
        let stripped: Vec<(i64, Message)> = (0_i64..)
            .zip(messages)
            .filter_map(|(sequence, (m, origin))| {
                strip(target, m, origin.as_ref()).map(|m| (sequence, m))
            })
            .collect();
        let shapes: Vec<Shape> = stripped.iter().map(|(s, m)| Shape::of(*s, m)).collect();
        let plan = Plan::new(&shapes);
        stripped
            .into_iter()
            .filter_map(|(sequence, m)| match plan.decision(sequence)? {
                None => Some(m),
                Some(decision) => decision.apply(m),
            })
            .collect()
    }

    #[test]
    fn one_pass_and_two_agree() {
        let t = target("openai", "gpt-5", ReasoningPolicy::None);
        let mut blocks = Message::text(Role::User, "");
        blocks.content_blocks = vec![ContentBlock::ToolResult {
            tool_use_id: "a".into(),
            content: "x".into(),
            is_error: false,
        }];
        let cases: Vec<Vec<(Message, Option<Origin>)>> = vec![
            vec![
                (user("q"), None),
                (calling(&["a", "b"]), None),
                (result("a"), None),
                (assistant("done"), None),
                (result("zz"), None),
            ],
            vec![
                (user("q"), None),
                (calling(&["a", "b"]), None),
                (result("a"), None),
            ],
            vec![
                (calling(&["old"]), None),
                (user("again"), None),
                (calling(&["new"]), None),
            ],
            vec![(result("gone"), None), (user("next"), None)],
            vec![
                (calling(&["a"]), None),
                (assistant("x"), None),
                (result("a"), None),
                (blocks.clone(), None),
            ],
            vec![
                (calling(&["a"]), None),
                (calling(&["b"]), None),
                (result("b"), None),
                (assistant("y"), None),
            ],
            vec![(blocks, None), (calling(&["a"]), None)],
        ];
        for case in cases {
            assert_eq!(
                for_target(&t, case.clone(), 0),
                planned(&t, case.clone()),
                "{case:?}"
            );
        }
    }

    #[test]
    fn a_pairing_cut_short_hands_back_what_waits() {
        let mut pairing = Pairing::default();
        let first = calling(&["a"]);
        assert_eq!(pairing.push(0, Shape::of(0, &first), 10).count(), 0);
        assert_eq!(pairing.push(1, Shape::of(1, &user("u")), 5).count(), 0);
        assert_eq!(pairing.held_bytes(), 15);
        let (rest, made) = pairing.into_rest();
        assert_eq!(rest, [0, 1]);
        assert!(
            made.is_empty(),
            "the waiting message's calls are made again"
        );
    }

    #[test]
    fn an_empty_provider_is_refused() {
        let refused = ExportTarget::new("target", String::new(), "m".into(), ReasoningPolicy::None);
        assert!(
            matches!(refused, Err(Error::InvalidArgument { field, .. }) if field == "target.provider")
        );
    }

    #[test]
    fn policies_keep_by_origin() {
        let same_model = target("Anthropic", "claude-sonnet-4-5", ReasoningPolicy::SameModel);
        assert!(
            same_model.keeps(claude().as_ref()),
            "providers compare case-insensitively"
        );
        assert!(!same_model.keeps(origin("anthropic", "claude-opus-4").as_ref()));
        assert!(
            !same_model.keeps(origin("anthropic", "CLAUDE-SONNET-4-5").as_ref()),
            "models exactly"
        );
        assert!(!same_model.keeps(None), "no origin is never kept");
        let any_model = target("anthropic", "", ReasoningPolicy::SameProvider);
        assert!(any_model.keeps(origin("anthropic", "claude-opus-4").as_ref()));
        assert!(!any_model.keeps(origin("openai", "o3").as_ref()));
        let empty_model = target("anthropic", "", ReasoningPolicy::SameModel);
        assert!(
            !empty_model.keeps(claude().as_ref()),
            "SAME_MODEL with no model keeps none"
        );
        assert!(
            !target("anthropic", "claude-sonnet-4-5", ReasoningPolicy::None)
                .keeps(claude().as_ref())
        );
    }

    #[test]
    fn foreign_reasoning_is_removed_and_own_kept_byte_for_byte() -> Result<(), &'static str> {
        let mut m = assistant("answer");
        m.content_blocks = vec![
            thinking("hmm"),
            ContentBlock::RedactedThinking { data: "xx".into() },
            ContentBlock::Json {
                kind: "reasoning".into(),
                json: r#"{"type":"reasoning","encrypted_content":"e"}"#.into(),
            },
            ContentBlock::Json {
                kind: "citation".into(),
                json: "{}".into(),
            },
            text_block("part", "sig-text"),
        ];
        m.tool_calls = vec![call("c1")];
        let own = strip(
            &target("anthropic", "claude-sonnet-4-5", ReasoningPolicy::SameModel),
            m.clone(),
            claude().as_ref(),
        );
        assert_eq!(own.as_ref(), Some(&m), "kept as stored");
        let foreign = strip(
            &target("openai", "o3", ReasoningPolicy::SameModel),
            m,
            claude().as_ref(),
        )
        .ok_or("an answer with text stays")?;
        assert_eq!(foreign.content_blocks.len(), 2, "{foreign:?}");
        assert!(
            matches!(&foreign.content_blocks[0], ContentBlock::Json { kind, .. } if kind == "citation")
        );
        assert!(
            matches!(&foreign.content_blocks[1], ContentBlock::Text { signature, .. } if signature.is_empty())
        );
        assert_eq!(
            foreign.tool_calls[0].signature, "",
            "a kept call's signature is cleared"
        );
        assert_eq!(foreign.tool_calls[0].id, "c1");
        Ok(())
    }

    #[test]
    fn stripping_says_whether_it_changed_the_message() {
        let foreign = target("openai", "o3", ReasoningPolicy::SameModel);
        let changed = |m: Message| stripped(&foreign, m, claude().as_ref()).map(|(_, c)| c);
        assert_eq!(changed(assistant("plain")), Some(false));
        let mut reasoned = assistant("answer");
        reasoned.content_blocks = vec![thinking("hmm")];
        assert_eq!(changed(reasoned), Some(true));
        let mut signed = assistant("answer");
        signed.content_blocks = vec![text_block("part", "sig-text")];
        assert_eq!(changed(signed), Some(true));
        let mut unsigned = assistant("answer");
        unsigned.content_blocks = vec![text_block("part", "")];
        unsigned.tool_calls = vec![call("c1")];
        unsigned.tool_calls[0].signature.clear();
        assert_eq!(changed(unsigned), Some(false));
        let mut signed_call = assistant("answer");
        signed_call.tool_calls = vec![call("c1")];
        signed_call.tool_calls[0].signature = "sig".into();
        assert_eq!(changed(signed_call), Some(true));
        let own = target("anthropic", "claude-sonnet-4-5", ReasoningPolicy::SameModel);
        let mut kept = assistant("answer");
        kept.content_blocks = vec![thinking("hmm"), text_block("part", "sig-text")];
        assert_eq!(
            stripped(&own, kept, claude().as_ref()).map(|(_, c)| c),
            Some(false)
        );
    }

    #[test]
    fn a_reasoning_only_message_is_left_out_even_when_kept() {
        let mut m = assistant("");
        m.content_blocks = vec![thinking("alone")];
        let same = target("anthropic", "claude-sonnet-4-5", ReasoningPolicy::SameModel);
        assert_eq!(strip(&same, m.clone(), claude().as_ref()), None);
        assert_eq!(strip(&same, assistant(""), None), None, "stored empty");
        // A tool's empty output still answers its call.
        let mut answer = result("c1");
        answer.content.clear();
        assert!(strip(&same, answer, None).is_some());
    }

    #[test]
    fn calls_need_a_later_result_and_results_an_earlier_call() {
        let t = target("openai", "gpt-5", ReasoningPolicy::None);
        let out = for_target(
            &t,
            [
                (user("q"), None),
                (calling(&["a", "b"]), None),
                (result("a"), None),
                (assistant("done"), None),
                (result("zz"), None),
            ],
            0,
        );
        // b never answered (and not pending: an assistant message follows);
        // zz answers no call.
        assert_eq!(texts(&out), ["q", "calls a", "result a", "done"]);
    }

    #[test]
    fn the_last_calls_are_pending_until_an_assistant_follows() {
        let t = target("openai", "gpt-5", ReasoningPolicy::None);
        // Parallel calls, one answered so far: both kept, the caller is
        // about to answer the other.
        let out = for_target(
            &t,
            [
                (user("q"), None),
                (calling(&["a", "b"]), None),
                (result("a"), None),
            ],
            0,
        );
        assert_eq!(texts(&out), ["q", "calls a,b", "result a"]);
        // A pending call at the very end.
        let out = for_target(&t, [(user("q"), None), (calling(&["x"]), None)], 0);
        assert_eq!(texts(&out), ["q", "calls x"]);
        // Earlier unanswered calls are not pending.
        let out = for_target(
            &t,
            [
                (calling(&["old"]), None),
                (user("again"), None),
                (calling(&["new"]), None),
            ],
            0,
        );
        assert_eq!(texts(&out), ["again", "calls new"]);
    }

    #[test]
    fn a_result_whose_call_was_rolled_back_or_windowed_out_is_dropped() {
        let t = target("openai", "gpt-5", ReasoningPolicy::None);
        // The call is not in the export (rolled back, or before the range).
        let out = for_target(&t, [(result("gone"), None), (user("next"), None)], 0);
        assert_eq!(texts(&out), ["next"]);
        // A tool_result block loses its block; the message goes if empty.
        let mut blocks = Message::text(Role::User, "");
        blocks.content_blocks = vec![ContentBlock::ToolResult {
            tool_use_id: "gone".into(),
            content: "x".into(),
            is_error: false,
        }];
        let mut with_text = blocks.clone();
        with_text.content = "and a note".into();
        let out = for_target(&t, [(blocks, None), (with_text, None)], 0);
        assert_eq!(out.len(), 1);
        assert!(out[0].content_blocks.is_empty());
        assert_eq!(out[0].content, "and a note");
    }

    #[test]
    fn a_kept_call_of_a_foreign_model_loses_only_its_signature() {
        let t = target("google", "gemini-3-pro", ReasoningPolicy::SameModel);
        let out = for_target(
            &t,
            [
                (calling(&["a"]), claude()),
                (result("a"), None),
                (assistant("ok"), claude()),
            ],
            0,
        );
        assert_eq!(texts(&out), ["calls a", "result a", "ok"]);
        assert_eq!(out[0].tool_calls[0].signature, "");
        // The same model keeps it.
        let t = target("anthropic", "claude-sonnet-4-5", ReasoningPolicy::SameModel);
        let out = for_target(&t, [(calling(&["a"]), claude()), (result("a"), None)], 0);
        assert_eq!(out[0].tool_calls[0].signature, "sig-a");
    }

    #[test]
    fn reasoning_only_calls_message_keeps_pairing_after_step_two() {
        // Step 2 removes a reasoning-only message before pairing is judged:
        // the call's message stays, with its own reasoning stripped.
        let t = target("openai", "o3", ReasoningPolicy::SameModel);
        let mut think = assistant("");
        think.content_blocks = vec![thinking("plan")];
        let mut calls = calling(&["a"]);
        calls.content_blocks = vec![thinking("why")];
        let out = for_target(
            &t,
            [(think, claude()), (calls, claude()), (result("a"), None)],
            0,
        );
        assert_eq!(texts(&out), ["calls a", "result a"]);
        assert!(out[0].content_blocks.is_empty());
    }

    #[test]
    fn max_messages_applies_to_the_result_and_never_orphans_a_result() {
        let t = target("openai", "gpt-5", ReasoningPolicy::None);
        let history = || {
            vec![
                (user("q1"), None),
                (calling(&["a", "b"]), None),
                (result("a"), None),
                (result("b"), None),
                (assistant("a1"), None),
                (result("stray"), None),
            ]
        };
        // The stray result is gone before the window: the last two are the
        // result b and a1, widened back to the call.
        let out = for_target(&t, history(), 2);
        assert_eq!(texts(&out), ["calls a,b", "result a", "result b", "a1"]);
        let out = for_target(&t, history(), 1);
        assert_eq!(texts(&out), ["a1"]);
        assert_eq!(for_target(&t, history(), 0).len(), 5);
    }

    #[test]
    fn three_targets_in_a_row_give_three_answers_from_the_same_input() {
        let mut answer = assistant("final");
        answer.content_blocks = vec![thinking("t"), text_block("final", "sig-gem")];
        answer.content.clear();
        let history = vec![(user("q"), None), (answer, claude())];
        let claude_target = target("anthropic", "claude-sonnet-4-5", ReasoningPolicy::SameModel);
        let gpt = target("openai", "gpt-5", ReasoningPolicy::SameModel);
        let other_claude = target("anthropic", "claude-opus-4", ReasoningPolicy::SameProvider);
        let a = for_target(&claude_target, history.clone(), 0);
        let b = for_target(&gpt, history.clone(), 0);
        let c = for_target(&other_claude, history.clone(), 0);
        assert_eq!(a[1].content_blocks.len(), 2);
        assert_eq!(b[1].content_blocks.len(), 1);
        assert!(
            matches!(&b[1].content_blocks[0], ContentBlock::Text { signature, .. } if signature.is_empty())
        );
        assert_eq!(c, a, "same provider keeps it for any model");
        assert_ne!(a, b);
        // The input is untouched.
        assert_eq!(history[1].0.content_blocks.len(), 2);
    }
}
