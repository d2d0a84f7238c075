"""From a read record to the engine requests of its row, or the reason it has none.

Pure with respect to the engine's state: only the plan and the tokenizer are used, so the
same row always becomes the same requests. Three things happen here:

- ordering: within a read batch, rows whose chats share every turn but the last are
  admitted together, so the prefix cache serves the shared turns while they are hot;
- templating: the row's fields become chat messages (a missing field is the row's error);
- tokenizing and truncation: the chat template's tokens, cut down to fit the context when
  the plan asks for it (otherwise the engine refuses the over-long prompt, naming the row).

A row's ``position`` is its place in the shard as read, which is its place in the part.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from connectors import Record
from pipeline.plan import JobPlan
from pipeline.prompts import TemplateError, prefix_key, render_messages
from pipeline.row_requests import RequestBuilder
from pipeline.shard_engine import PromptEngine
from pipeline.sub_requests import RowInputError, SubRequest


@dataclass
class PreparedRow:
    """A read record with its chat messages, or the error that stands in for its output."""

    record: Record
    position: int  # place in the shard as read: the row's place in the part
    messages: list[dict[str, str]] | None
    error: str | None
    key: str | None = None  # its content key, once its requests are built (pipeline.row_keys)


@dataclass
class RowRequests:
    """A row's engine requests, or (``error`` set, no requests) the message of its error row."""

    subs: list[SubRequest] = field(default_factory=list)
    error: str | None = None

    @property
    def prompt_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.subs)


class RowPreparation:
    """``order`` a read batch, then ``requests`` for each row: SubRequests, or an error message."""

    def __init__(self, plan: JobPlan, engine: PromptEngine, builder: RequestBuilder) -> None:
        self.plan, self.engine, self.builder = plan, engine, builder

    def order(self, records: list[Record], first_position: int) -> list[PreparedRow]:
        """Rows sharing all turns but the last go in together (prefix-cache hits), groups in
        order of first appearance, so within a read batch nothing waits behind later rows."""
        groups: dict[str, list[PreparedRow]] = {}
        for position, record in enumerate(records, first_position):
            if record.error:
                row = PreparedRow(record, position, None, record.error)
            else:
                try:
                    row = PreparedRow(record, position, render_messages(self.plan.prompt, record.fields,
                                                                         record.row_number), None)
                except TemplateError as exc:
                    row = PreparedRow(record, position, None, str(exc))
            key = prefix_key(row.messages) if row.messages else ""
            groups.setdefault(key, []).append(row)
        return [row for group in groups.values() for row in group]

    def requests(self, row: PreparedRow) -> RowRequests:
        """The row's engine requests, or the message of the error row it becomes instead."""
        record, messages = row.record, row.messages
        if messages is None:
            return RowRequests(error=row.error or f"row {record.row_number}: no prompt")
        try:
            return RowRequests(self.builder.build(record.fields, record.row_number, messages,
                                                  lambda: self.tokens(record, messages)))
        except (TemplateError, RowInputError) as exc:
            return RowRequests(error=str(exc))
        except Exception as exc:
            return RowRequests(error=f"row {record.row_number}: cannot apply the chat template: {exc}")

    # ---- tokens -----------------------------------------------------------------------------
    def tokens(self, record: Record, messages: list[dict[str, str]]) -> list[int]:
        ids = self._encode(messages)
        if not self.plan.truncate_prompt or len(ids) < self._prompt_budget():
            return ids
        return self._truncated(record, messages, ids)

    def _encode(self, messages: list[dict[str, str]]) -> list[int]:
        """The chat template's tokens, or for a raw prompt (/v1/completions) the text's own tokens
        (with the tokenizer's special tokens, e.g. BOS, as a completions endpoint adds them)."""
        if self.plan.prompt.raw_prompt and self.engine.tokenizer is not None:
            return list(self.engine.tokenizer.encode(messages[-1]["content"]))
        return self.engine.apply_chat_template(messages)

    def _prompt_budget(self) -> int:
        """Longest prompt kept when truncating: room for max_tokens, but at least half the context."""
        ctx = self.engine.max_model_len
        return max(ctx - self.builder.params.max_tokens, ctx // 2)

    def _truncated(self, record: Record, messages: list[dict[str, str]], ids: list[int]) -> list[int]:
        """Cut the document (the prompt field, the text field, or the last turn) until the prompt fits."""
        plan, budget = self.plan, self._prompt_budget()
        fields = dict(record.fields)
        name = plan.prompt.prompt_field or plan.text_field
        cut_field = plan.prompt.messages_field is None and isinstance(fields.get(name), str)
        for _ in range(4):
            text = fields[name] if cut_field else messages[-1]["content"]
            doc = self.engine.encode(text)
            keep = len(doc) - (len(ids) - budget) - 8
            if keep <= 0:
                raise TemplateError(
                    f"row {record.row_number}: prompt is {len(ids)} tokens and stays over {budget} "
                    "even with the document cut away"
                )
            text = self.engine.tokenizer.decode(doc[:keep])
            if cut_field:
                fields[name] = text
                messages = render_messages(plan.prompt, fields, record.row_number)
            else:
                messages = messages[:-1] + [{"role": messages[-1]["role"], "content": text}]
            ids = self._encode(messages)
            if len(ids) < budget:
                return ids
        raise TemplateError(f"row {record.row_number}: could not truncate the prompt under {budget} tokens")
