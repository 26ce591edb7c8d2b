"""Threaded conversations: a dependent request's prompt carries the answers the server really gave.

A trace describes turn k+1 of a conversation (or an agent's call after a
tool ran) as a prompt that extends turn k's prompt *and its reply*, then new
user or tool text; its ``prefix_hashes`` say so. Materialising every prompt
from its hashes (:mod:`llmlb_bench.replay.prompts`) keeps the sharing of the
prompts but not of the replies: the block texts standing for turn k's reply
are not what the server generated, so the server's prefix cache cannot reuse
the reply's KV, which a real conversation does. Threading sends instead:

* completions API: the parent's prompt text + the answer text it received +
  the new text;
* chat API: the parent's messages + an ``assistant`` message with the
  answer + a ``user`` message with the new text (tool results go as ``user``
  messages too: a ``tool`` message needs the tool-call ids of a real
  function-calling reply, which a benchmark's answer does not have).

A join (``wait_ids``) appends, after its parent's answer, the answers of the
requests it waited for, in ``wait_ids`` order (a sub-agent's result handed
back). The new text has the tokens left of the trace's ``input_tokens`` once
the parent's prompt (``input_tokens`` of the parent) and the answers (the
server's ``completion_tokens``, else the stream's chunk count) are taken
away, so the prompt's length matches the trace up to how the answer text
re-tokenises and, for chat, the template's few tokens per extra message
(``server_input_tokens`` records the server's count).

Only requests that something waits for keep their prompt and answer, and
each is dropped once the last request that needs it has built its prompt, so
memory follows the conversations in flight, not the trace. A request whose
parent failed, has media, or ended in an earlier run that ``--resume``
continues (answers are not stored in results) is materialised from its
hashes as without threading.
"""

from __future__ import annotations

from llmlb_bench.replay.prompts import PromptBuilder
from llmlb_bench.trace_columns import TraceColumns

#: a prompt as sent: the completion API's text, or the chat API's messages
Prompt = str | list[dict[str, str]]


class Threads:
    """Prompt building for dependent requests from their parents' real answers."""

    def __init__(self, tr: TraceColumns, prompts: PromptBuilder, chat: bool) -> None:
        self.tr = tr
        self.prompts = prompts
        self.chat = chat
        #: per dependent row: its parent row, then the rows of a join's other inputs
        self.deps = tr.waited_rows()
        #: per row something waits for: how many dependents have not built their prompt yet
        self.needed: dict[int, int] = {}
        for deps in self.deps.values():
            for d in deps:
                self.needed[d] = self.needed.get(d, 0) + 1
        #: dependent rows that have not built their prompt (nor ended without one)
        self._open = set(self.deps)
        self._prompt: dict[int, Prompt] = {}
        #: row -> (answer text, answer tokens) of a finished request something waits for
        self._answer: dict[int, tuple[str, int]] = {}

    def keeps(self, idx: int) -> bool:
        """Whether row ``idx``'s answer text must be kept (something waits for it)."""
        return idx in self.needed

    def prompt(self, idx: int, tokens: int, media: bool) -> Prompt | None:
        """Row ``idx``'s threaded prompt of about ``tokens`` tokens, or None to materialise it
        from its hashes (no parent, media, or a parent without an answer)."""
        deps = self.deps.get(idx)
        built: Prompt | None = None
        if deps is not None and not media and deps[0] in self._prompt and deps[0] in self._answer:
            built = self._extend(idx, deps, tokens)
        self.ended(idx)
        return built

    def _extend(self, idx: int, deps: list[int], tokens: int) -> Prompt:
        parent = deps[0]
        answers = [self._answer[d] for d in deps if d in self._answer]
        rest = max(0, tokens - self.tr.inp[parent] - sum(n for _, n in answers))
        new = self.prompts.continuation(rest, self.tr.rid[idx]) if rest else ""
        base = self._prompt[parent]
        if isinstance(base, str):
            return base + "".join(text for text, _ in answers) + new
        # the parent's answer is the assistant's turn; what the join collected and the new text
        # are the next user (or tool) message
        after = "".join(text for text, _ in answers[1:]) + new
        reply = [{"role": "assistant", "content": answers[0][0]}]
        return base + reply + ([{"role": "user", "content": after}] if after else [])

    def sent(self, idx: int, prompt: Prompt) -> None:
        """Row ``idx`` leaves with ``prompt`` (kept when something waits for it)."""
        if idx in self.needed:
            self._prompt[idx] = prompt

    def answered(self, idx: int, text: str, tokens: int) -> None:
        """Row ``idx`` ended well with ``text`` (``tokens`` tokens) as its answer."""
        if idx in self.needed:
            self._answer[idx] = (text, tokens)

    def ended(self, idx: int) -> None:
        """Row ``idx`` needs its inputs no more (its prompt is built, or it ended without one)."""
        if idx in self._open:
            self._open.discard(idx)
            for d in self.deps[idx]:
                self._release(d)

    def _release(self, d: int) -> None:
        left = self.needed.get(d)
        if left is None:
            return
        if left <= 1:
            del self.needed[d]
            self._prompt.pop(d, None)
            self._answer.pop(d, None)
        else:
            self.needed[d] = left - 1

    def held(self) -> dict[str, int]:
        """How many prompts and answers are kept now (the memory bound's check)."""
        return {"prompts": len(self._prompt), "answers": len(self._answer)}
